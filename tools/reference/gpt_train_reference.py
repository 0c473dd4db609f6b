"""PyTorch reference trainer of deg's `gpt` trunk: loss curves and speed to hold `deg pretrain`
against on one GPU (issue 14 item 5).

The model is gpt_model.py's (the one the gradient fixture checks), compiled with torch.compile,
its attention flex_attention with the exact mask of deg's trainer: sliding windows (short, or
long with the key offset), document segments, paired heads on doubled positions. The recipe is
`deg pretrain`'s (src/train/pretrain.cc, optim.cc): NorMuon with Polar Express for the attention
and MLP matrices, Adam with cautious weight decay for the rest (the same rules, rates and betas),
the lr cooldown, the momentum warmup and cooldown, Adam on odd steps (gradients accumulating over
the even one), embed tied to lm_head for the first two thirds, the MTP weight stages, one batch
size (deg has no batch-size schedule), the config's windows throughout.

Precision: fp32 master weights, fp32 gradients and fp32 optimizer state; the forward and backward
run under torch.autocast(bfloat16): matrix products in bf16 with fp32 accumulation, the residual
stream, norms, gates, the soft cap and the cross entropy in fp32, attention in bf16. Polar Express
runs in bf16 (as the seed); NorMuon's second moment and Adam in fp32.

Input: a `deg shard` directory (train_*.bin, val_*.bin, data.json) read as deg's ShardLoader reads
it (packed batches starting on document starts, documents cut at --max-seq-len, one attention
segment each), or --random-tokens (uniform ids in documents of --max-seq-len tokens: speed only).
Output: --out/metrics.jsonl (a line per step: step, train_loss, val_loss or null, tokens_per_s,
mfu, elapsed_s), a progress line on stderr, and a JSON summary on stdout (compile time, steady
tokens/s and MFU, peak memory).

MFU: model FLOPs per token = 6 N + A, against the H200 SXM's dense bf16 peak (H200_PEAK_FLOPS).
N counts the parameters that multiply activations: every trained tensor but the three lookup
tables (embed, value_embeds, ngram_table), so lm_head is in. A is the attention's 3 x forward
FLOPs, counted on the batch's real mask: per layer 2 (dq + dv) per visible (query head, key)
pair, summed over the mask (a key of the window inside the query's segment, itself included).
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch._inductor.config
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from gpt_model import GptSpec, forward, load_config, ngram_rows, rotary_freq, softcap

# NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 Tensor Core 1,979 TFLOP/s "with sparsity";
# dense is half of that, the H100 SXM's figure (the two share the compute die).
H200_PEAK_FLOPS = 989.5e12
VOCAB_MULTIPLE = 128  # presets take the data's vocabulary rounded up to this (pretrain.h)
SHARD_MAGIC = 20240520
BLOCK = 128  # flex_attention's block size; batches are a multiple of it
MTP_TERMS = 3  # the first stage's weights [1, .5, .25]; later stages zero the tail
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

# Polar Express coefficients for num_iters=5, safety_factor=2e-2, cushion=2 (optim.cc).
POLAR_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

POLAR_DTYPE = torch.bfloat16  # the seed's; deg's CPU optimizer runs it in f32

# optim.h OptimizerHyper.
ADAM_LR, ADAM_EPS, ADAM_WD = 0.008, 1e-10, 0.005
MUON_LR, MUON_BETA2, MUON_WD = 0.023, 0.9, 1.2

# gpt_param_rule's Adam rules: name -> (beta1, beta2, lr_mul, wd_mul).
ADAM_RULES = {
    "scalars": (0.9, 0.99, 5.0, 0.0), "smear_gate": (0.9, 0.99, 0.01, 0.0),
    "ve_gate": (0.9, 0.99, 1.0, 1.0),
    "lm_head": (0.5, 0.95, 1.0, 150.0), "embed": (0.5, 0.95, 1.0, 150.0),
    "value_embeds": (0.75, 0.95, 75.0, 5.0), "ngram_table": (0.75, 0.95, 75.0, 5.0),
    "post_lambdas": (0.9, 0.95, 1.0, 0.0), "resid_lambdas": (0.9, 0.95, 5.0, 0.0),
    "mudd_w1": (0.9, 0.99, 0.25, 1.0), "mudd_w2": (0.9, 0.99, 0.25, 1.0),
    "mudd_w2g": (0.9, 0.99, 0.25, 1.0), "mudd_b2": (0.9, 0.99, 0.25, 0.0),
    "mudd_gate_w1": (0.9, 0.99, 0.1, 1.0), "mudd_gate_w2": (0.9, 0.99, 0.1, 1.0),
    "mudd_gate_b2": (0.9, 0.99, 0.1, 0.0), "mudd_gate_scale": (0.9, 0.99, 0.1, 0.0),
}
LOOKUP_TABLES = ("embed", "value_embeds", "ngram_table")


# ---- configuration and data ----

def resolve_config(name_or_path):
    """(config, is_preset): a preset name (configs/NAME.json, written from deg's gpt_preset) or a
    path to a deg config.json."""
    preset = os.path.join(CONFIG_DIR, name_or_path + ".json")
    if os.path.exists(preset):
        return load_config(preset), True
    if not os.path.exists(name_or_path):
        names = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".json"))
        sys.exit(f"'{name_or_path}' is neither a preset ({', '.join(names)}) nor a config file")
    return load_config(name_or_path), False


def read_shard(path):
    """A modded-nanogpt token shard: 256 int32 header (magic, version 1, count), uint16 tokens."""
    header = np.fromfile(path, dtype="<i4", count=256)
    if header.size != 256 or header[0] != SHARD_MAGIC or header[1] != 1:
        sys.exit(f"{path}: not a version-1 token shard (magic {SHARD_MAGIC}); make it with `deg shard`")
    tokens = np.fromfile(path, dtype="<u2", count=int(header[2]), offset=1024)
    if tokens.size != header[2]:
        sys.exit(f"{path}: header claims {header[2]} tokens, the file holds {tokens.size}")
    return tokens


class ShardLoader:
    """deg's ShardLoader (src/train/data.cc): packed batches of T inputs starting on document
    starts, documents cut at max_seq_len tokens, each piece one segment; wraps around."""

    def __init__(self, files, bos):
        self.files, self.bos = files, bos
        self.shard, self.doc, self.epoch, self.loaded = 0, 0, 0, -1

    def _load(self, shard):
        if shard == self.loaded:
            return
        self.tokens = read_shard(self.files[shard])
        self.starts = np.flatnonzero(self.tokens == self.bos)
        if self.starts.size == 0:
            sys.exit(f"{self.files[shard]}: no document start (token {self.bos})")
        self.loaded = shard

    def next(self, T, max_seq_len):
        """(inputs [T], targets [T], seg_start [T]) as int64 arrays."""
        pieces, segs, n = [], [], 0
        self._load(self.shard)
        while n < T + 1:
            if self.doc >= self.starts.size:
                self.doc = 0
                self.shard += 1
                if self.shard >= len(self.files):
                    self.shard = 0
                    self.epoch += 1
                self._load(self.shard)
            cur = int(self.starts[self.doc])
            doc_end = int(self.starts[self.doc + 1]) if self.doc + 1 < self.starts.size else self.tokens.size
            self.doc += 1
            end = min(doc_end, cur + max_seq_len, cur + T + 1 - n)
            pieces.append(self.tokens[cur:end])
            segs.append(np.full(end - cur, n, dtype=np.int64))
            n += end - cur
        buf = np.concatenate(pieces).astype(np.int64)
        seg = np.concatenate(segs)
        return buf[:-1], buf[1:], seg[:-1]


class RandomTokens:
    """Uniform random ids in documents of max_seq_len tokens, each opened by the bos id 0."""

    def __init__(self, vocab, seed):
        self.vocab, self.rng, self.epoch = vocab, np.random.default_rng(seed), 0

    def next(self, T, max_seq_len):
        buf = self.rng.integers(0, self.vocab, T + 1, dtype=np.int64)
        pos = np.arange(T + 1)
        buf[pos % max_seq_len == 0] = 0
        return buf[:-1], buf[1:], (pos[:-1] // max_seq_len) * max_seq_len


# ---- the model's tensors ----

def init_tensors(spec, seed, device):
    """GptParams::init's distributions (deg draws from its own generator, so the values differ)."""
    c = spec.cfg
    gen = torch.Generator(device=device).manual_seed(seed)
    C, L, H = c["model_dim"], c["num_layers"], c["num_heads"]
    P = {name: torch.zeros(shape, device=device) for name, shape in spec.shapes().items()}
    P["lm_head"].normal_(0, c["lm_head_init_std"], generator=gen)
    P["embed"].copy_(P["lm_head"])
    P["value_embeds"].normal_(0, c["value_embed_init_std"], generator=gen)
    bound = math.sqrt(3) * 0.5 / math.sqrt(C)
    for name in P:
        if name.endswith((".attn.qk", ".attn.v", ".attn.o", "mlp.fc")):
            P[name].uniform_(-bound, bound, generator=gen)
    P["post_lambdas"].fill_(1.0)
    P["resid_lambdas"].fill_(math.sqrt(1.1))
    sc = P["scalars"]
    sc[0:2 * L:2], sc[1:2 * L:2] = 0.5, 1.0
    sc[2 * L], sc[2 * L + 1] = 0.0, -1.5  # smear lambda, skip lambda
    P["mudd_w1"].uniform_(-1 / math.sqrt(C), 1 / math.sqrt(C), generator=gen)
    P["mudd_gate_w1"].uniform_(-1 / math.sqrt(C), 1 / math.sqrt(C), generator=gen)
    s, b = c["mudd_scale"], P["mudd_b2"].view(-1)
    b[6] = b[7] = 2.0 / s  # VE gate lanes
    b[8] = b[12] = math.sqrt(1.1) / s  # resid attn / mlp
    b[9] = b[13] = 1.0 / s  # post attn / mlp
    b[11] = 0.05 / s  # n-gram lambda
    for k, v in enumerate(c["post_mix_bias_init"]):
        b[spec.nmu + k] = v / s
    gs, gb = c["mudd_gate_scale_init"], P["mudd_gate_b2"].view(-1)
    for gid, start in spec.lanes["attn_gate"].values():
        gb[gid * spec.ng + start:gid * spec.ng + start + H] = 0.25 / gs
    for gid, start in spec.lanes["ngram"].values():
        gb[gid * spec.ng + start] = 0.05 / gs
    gb[spec.ng + spec.lanes["skip"]] = 0.5 / gs
    P["mudd_gate_scale"].fill_(gs)
    P["ngram_sign_pool"] = torch.randn(c["ngram_sign_rows"], c["ngram_dim"], generator=gen, device=device).sign()
    for kind, width in (("narrow", c["narrow_head_dim"]), ("wide", c["head_dim"])):
        P[f"rotary.{kind}.freq"] = rotary_freq(width, c["rotary_dim"]).to(device)
    return P


def load_weights(spec, P, path):
    """Overwrite P with a deg checkpoint's model.safetensors (same names and shapes)."""
    from safetensors.torch import load_file
    file = load_file(path)
    for kind in ("narrow", "wide"):
        scale = float(file[f"rotary.{kind}.attn_scale"])
        if not math.isclose(scale, spec.attn_scale[kind], rel_tol=1e-6):
            sys.exit(f"{path}: rotary.{kind}.attn_scale {scale} is not the config's {spec.attn_scale[kind]}")
    for name, t in P.items():
        if name not in file:
            sys.exit(f"{path}: missing tensor {name} (expected {list(t.shape)})")
        if tuple(file[name].shape) != tuple(t.shape):
            sys.exit(f"{path}: tensor {name} has shape {list(file[name].shape)}, the config expects {list(t.shape)}")
        t.copy_(file[name])


# ---- attention ----

def sliding_block_mask(seg, window):
    """flex_attention's BlockMask for "key j is visible to query i when seg[i] <= j <= i and
    i - j <= window" over N positions (seg [N]: nondecreasing segment starts, N a multiple of
    BLOCK). Every key block that can hold a visible key is listed as partial, so the mask_mod
    decides inside it; none is listed as full (no block skips the mask_mod)."""
    N = seg.numel()
    nb = N // BLOCK
    q_block = torch.arange(nb, device=seg.device)
    lowest = torch.maximum(seg[q_block * BLOCK], q_block * BLOCK - window).clamp_min(0) // BLOCK
    # A row lists its blocks first; the rest of its nb entries are ignored (BlockMask wants one
    # entry per key block).
    indices = (lowest[:, None] + torch.arange(nb, device=seg.device)).clamp_max(nb - 1)
    counts = q_block - lowest + 1

    def visible(b, h, q, kv):
        return (kv <= q) & (q - kv <= window) & (kv >= seg[q])

    return BlockMask.from_kv_blocks(counts.to(torch.int32)[None, None], indices.to(torch.int32)[None, None],
                                    BLOCK_SIZE=BLOCK, mask_mod=visible, seq_lengths=(N, N))


def flex_attend(seg, dtype=torch.bfloat16):
    """gpt_model's attention core over flex_attention in `dtype`: q, k [N, S, dq], v [N, S, dv]
    in, [N, S, dv] out; paired layers run on 2T positions whose segments start at twice the
    token's."""
    segs = {False: seg, True: 2 * seg.repeat_interleave(2)}
    masks = {}

    def attend(q, k, v, paired, window, scale):
        if (paired, window) not in masks:
            masks[paired, window] = sliding_block_mask(segs[paired], window)
        dv = v.size(-1)

        def heads_first(t):  # [N, S, d] -> [1, S, N, max(d, 16)] (16: the kernel's least width)
            if t.size(-1) < 16:
                t = F.pad(t, (0, 16 - t.size(-1)))
            return t.transpose(0, 1)[None].to(dtype)

        y = flex_attention(heads_first(q), heads_first(k), heads_first(v), block_mask=masks[paired, window], scale=scale)
        return y[0].transpose(0, 1)[..., :dv]

    return attend


def visible_pairs(seg, window):
    """Number of (query, key) pairs of the mask over seg [N] (numpy)."""
    i = np.arange(seg.size)
    return int((np.minimum(window, i - seg) + 1).sum())


# ---- the optimizer (optim.cc) ----

def polar_express(G):
    """G [n, r, k] -> approximately orthogonal matrices with G's singular vectors (bf16 math)."""
    tall = G.size(-2) > G.size(-1)
    X = G.mT if tall else G
    X = (X / (X.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)).to(POLAR_DTYPE)
    for a, b, c in POLAR_COEFFS:
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    X = X.float()
    return X.mT if tall else X


class NorMuonGroup:
    """Matrices (or blocks of rows: q/k per head pair) of one shape [r, k] and lr multiplier,
    stepped together: Nesterov momentum, Polar Express, a per-row (tall) or per-column (wide)
    second moment with beta2 0.9, lr * sqrt(max(1, r/k)) * lr_mul, cautious weight decay."""

    def __init__(self, P, names, r, k, lr_mul):
        self.P, self.names, self.r, self.k, self.lr_mul = P, names, r, k, lr_mul
        self.counts = [P[n].numel() // (r * k) for n in names]
        n = sum(self.counts)
        self.momentum = torch.zeros(n, r, k, device=P[names[0]].device)
        self.second = torch.zeros(n, r if r >= k else k, device=P[names[0]].device)

    def step(self, lr_scale, momentum):
        r, k = self.r, self.k
        G = torch.cat([self.P[n].grad.view(-1, r, k) for n in self.names])
        W = torch.cat([self.P[n].detach().view(-1, r, k) for n in self.names])
        self.momentum.lerp_(G, 1 - momentum)
        U = polar_express(G.lerp_(self.momentum, momentum))
        tall = r >= k
        red = k if tall else r
        vmean = U.square().mean(dim=-1 if tall else -2)  # [n, r] tall, [n, k] wide
        self.second.lerp_(vmean, 1 - MUON_BETA2)
        inv = self.second.clamp_min(1e-10).rsqrt()
        vnorm = (vmean.sum(-1) * red).sqrt()
        scaled = (vmean * inv.square()).sum(-1).mul(red).sqrt()
        ratio = vnorm / scaled.clamp_min(1e-10)
        U = U * (inv[:, :, None] if tall else inv[:, None, :]) * ratio[:, None, None]
        lr = MUON_LR * lr_scale
        lr_eff = lr * math.sqrt(max(1.0, r / k)) * self.lr_mul
        delta = U * lr_eff + torch.where(U * W >= 0, W * (MUON_WD * lr * lr_eff), 0.0)
        for name, d in zip(self.names, delta.split(self.counts)):
            self.P[name].data.sub_(d.view_as(self.P[name]))
            self.P[name].grad = None


class Optimizer:
    """GptOptimizer: NorMuon groups every step; Adam on do_adam steps (bias correction by the
    count of Adam steps); tied: embed's gradient joins lm_head's and embed copies lm_head."""

    CHUNK = 1 << 26  # Adam walks big tables in chunks of this many entries (bounded temporaries)

    def __init__(self, spec, P):
        H = spec.cfg["num_heads"]
        groups = {}
        self.adam = {}
        for name in spec.shapes():
            t = P[name]
            if name.endswith(".attn.qk"):
                key = (t.size(0) // H, t.size(1), 1.0)
            elif name.endswith((".attn.v", ".attn.o", "mlp.fc")):
                key = (t.size(0), t.size(1), 1.0)
            elif name.endswith("mlp.proj"):
                key = (t.size(0), t.size(1), 2.0)
            else:
                self.adam[name] = (ADAM_RULES[name], torch.zeros_like(t), torch.zeros_like(t))
                continue
            groups.setdefault(key, []).append(name)
        self.groups = [NorMuonGroup(P, names, r, k, mul) for (r, k, mul), names in groups.items()]
        self.P, self.adam_steps = P, 0

    def step(self, lr_scale, momentum, do_adam, tied):
        for g in self.groups:
            g.step(lr_scale, momentum)
        if not do_adam:
            return
        P = self.P
        self.adam_steps += 1
        if tied:
            P["lm_head"].grad += P["embed"].grad
            P["embed"].grad = None
        for name, ((b1, b2, lr_mul, wd_mul), m, v) in self.adam.items():
            if tied and name == "embed":
                continue
            lr = ADAM_LR * lr_scale * lr_mul
            step_size = lr * math.sqrt(1 - b2 ** self.adam_steps) / (1 - b1 ** self.adam_steps)
            decay = lr * lr * ADAM_WD * wd_mul
            p, g = P[name].data.view(-1), P[name].grad.view(-1)
            for lo in range(0, p.numel(), self.CHUNK):
                s = slice(lo, lo + self.CHUNK)
                pc, gc, mc, vc = p[s], g[s], m.view(-1)[s], v.view(-1)[s]
                mc.lerp_(gc, 1 - b1)
                vc.mul_(b2).addcmul_(gc, gc, value=1 - b2)
                upd = mc / (vc.sqrt() + ADAM_EPS) * step_size
                upd += torch.where(upd * pc > 0, pc * decay, 0.0)
                pc.sub_(upd)
            P[name].grad = None
        if tied:
            P["embed"].data.copy_(P["lm_head"].data)


# ---- schedules (optim.cc TrainSchedule, pretrain.cc) ----

class Schedule:
    def __init__(self, steps, warmup):
        self.steps, self.warmup = steps, warmup
        self.cooldown_start = int(steps * (1.0 - float(np.float32(0.8))))
        self.momentum_warmup = min(300, max(1, steps // 3))
        self.momentum_cooldown = min(50, max(1, steps // 10))
        self.split_step = (2 * steps // 3) | 1  # embed unties from lm_head here

    def lr_scale(self, step):
        lr = 1.0
        if self.warmup > 0 and step < self.warmup:
            lr = (step + 1) / self.warmup
        cd = self.cooldown_start
        if step >= cd and self.steps > cd:
            t = min(1.0, (step - cd) / (self.steps - cd))
            lr = lr * (1 - t) + 0.3 * t
        return lr

    def momentum(self, step):
        mw, mc = self.momentum_warmup, self.momentum_cooldown
        if step < mw:
            return 0.85 + step / mw * 0.1
        if step > self.steps - mc:
            return 0.95 - (step - (self.steps - mc)) / mc * 0.1
        return 0.95

    def mtp_weights(self, step):
        f = step / self.steps
        if f < 1 / 3:
            return [1.0, 0.5, 0.25 * (1 - f * 3)]
        if f < 2 / 3:
            return [1.0, 0.5 * (1 - (f - 1 / 3) * 3), 0.0]
        return [1.0, 0.0, 0.0]


# ---- the run ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="e.g. python3 gpt_train_reference.py --config small --random-tokens "
                                        "--steps 200 --batch-tokens 65536 --max-seq-len 1024 --out run")
    ap.add_argument("--config", required=True, help="preset (tiny, small, speedrun-124m-1gpu, ...) or a deg config.json")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a `deg shard` directory: train_*.bin, val_*.bin, data.json")
    src.add_argument("--random-tokens", action="store_true", help="uniform random tokens (throughput runs)")
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps (the schedules span them)")
    ap.add_argument("--out", required=True, help="directory for metrics.jsonl")
    ap.add_argument("--seed", type=int, default=0, help="initialisation and random-token seed")
    ap.add_argument("--batch-tokens", type=int, default=1024, help="tokens per step, a multiple of 128")
    ap.add_argument("--max-seq-len", type=int, default=256, help="documents are cut to this many tokens")
    ap.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: at the end)")
    ap.add_argument("--val-tokens", type=int, default=4096, help="validation tokens, a multiple of 128 (0: none)")
    ap.add_argument("--warmup-steps", type=int, default=0, help="linear lr warmup")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop this long after the first (compiling) step; the schedules still span --steps (0: never)")
    ap.add_argument("--log-every", type=int, default=10, help="read the loss back and log every N steps")
    ap.add_argument("--weights", help="start from a deg model.safetensors instead of a fresh init")
    args = ap.parse_args()
    if args.steps <= 0 or args.batch_tokens <= 0 or args.batch_tokens % BLOCK:
        ap.error("--steps must be positive and --batch-tokens a positive multiple of 128")
    if args.val_tokens < 0 or args.val_tokens % BLOCK or args.max_seq_len < 2 or args.log_every <= 0:
        ap.error("--val-tokens must be a multiple of 128, --max-seq-len >= 2, --log-every positive")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this reference trains on a GPU")
    device = torch.device("cuda")

    cfg, is_preset = resolve_config(args.config)
    if args.random_tokens:
        bos, data_vocab = 0, cfg["vocab_size"]
        train = RandomTokens(data_vocab, args.seed)
    else:
        with open(os.path.join(args.data, "data.json")) as f:
            info = json.load(f)
        bos, data_vocab = info.get("bos_id", 0), info.get("vocab_size", 0)
        train_files = sorted(glob.glob(os.path.join(args.data, "train_*.bin")))
        val_files = sorted(glob.glob(os.path.join(args.data, "val_*.bin"))) or train_files
        if not train_files:
            sys.exit(f"{args.data}: no train_*.bin shards")
        if is_preset:
            if data_vocab <= 0:
                sys.exit(f"{args.data}/data.json gives no vocab_size, so the preset cannot size its vocabulary; "
                         "remake the data with `deg shard` or add \"vocab_size\": V")
            cfg["vocab_size"] = -(-data_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        elif data_vocab > cfg["vocab_size"]:
            sys.exit(f"the data's vocabulary ({data_vocab}) exceeds the config's vocab_size ({cfg['vocab_size']})")
        train = ShardLoader(train_files, bos)
    spec = GptSpec(cfg)
    windows = (cfg["window_short"], cfg["window_long"])

    P = init_tensors(spec, args.seed, device)
    if args.weights:
        load_weights(spec, P, args.weights)
    trained = list(spec.shapes())
    for name in trained:
        P[name].requires_grad_(True)
    opt = Optimizer(spec, P)
    sched = Schedule(args.steps, args.warmup_steps)

    def loss_fn(P, inputs, targets, seg, ngram, mtp):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            xn = forward(spec, P, inputs, ngram, flex_attend(seg), windows)
            z = softcap(spec, (xn @ P["lm_head"].T).float())
        lse = torch.logsumexp(z, -1)
        T = inputs.numel()
        total = z.new_zeros(())
        for k in range(MTP_TERMS):
            picked = z[:T - k].gather(1, targets[k:, None])[:, 0]
            total = total + mtp[k] * (lse[:T - k] - picked).sum()
        return total / T

    # Inductor's mix-order reduction fusion (torch 2.11) fails an assertion ("49152 v.s. 49151")
    # on this graph's reductions over T and T - 1 rows (the MTP terms, the smear).
    torch._inductor.config.triton.mix_order_reduction = False
    compiled = torch.compile(loss_fn, dynamic=False)

    def run_loss(batch, mtp):
        inputs, targets, seg = (torch.from_numpy(a).to(device, non_blocking=True) for a in batch)
        return compiled(P, inputs, targets, seg, ngram_rows(cfg, inputs), torch.tensor(mtp, device=device))

    def validate():
        loader = RandomTokens(data_vocab, args.seed + 1) if args.random_tokens else ShardLoader(val_files, bos)
        chunk = min(args.val_tokens, args.batch_tokens)
        total, n = 0.0, 0
        with torch.no_grad():
            for _ in range(0, args.val_tokens, chunk):
                total += float(run_loss(loader.next(chunk, args.max_seq_len), [1.0, 0.0, 0.0])) * chunk
                n += chunk
                if loader.epoch > 0:
                    break
        return total / n

    c = cfg
    matmul_params = sum(P[n].numel() for n in trained if n not in LOOKUP_TABLES)
    H = c["num_heads"]

    def attention_flops(seg):
        """3 x the forward attention FLOPs of one batch (see the module's docstring)."""
        seg2 = 2 * np.repeat(seg, 2)
        pairs = {}
        flops = 0
        for i in c["attn_layers"]:
            paired = i in c["paired_head_layers"]
            window = windows[1] if i in c["long_window_layers"] else windows[0]
            if (paired, window) not in pairs:
                pairs[paired, window] = visible_pairs(seg2 if paired else seg, window)
            flops += 2 * (H // 2 if paired else H) * (spec.qk_dim(i) + spec.v_dim(i)) * pairs[paired, window]
        return 3 * flops

    os.makedirs(args.out, exist_ok=True)
    metrics = open(os.path.join(args.out, "metrics.jsonl"), "w")
    print(f"{c['name']}: {sum(P[n].numel() for n in trained):,} parameters ({matmul_params:,} in matrix "
          f"products), vocab {c['vocab_size']}, {args.batch_tokens} tokens/step", file=sys.stderr)
    t0 = time.perf_counter()
    pending = []  # (step, loss tensor, val loss, tokens, flops) not yet logged
    steady = {"tokens": 0, "flops": 0, "seconds": 0.0}  # every logged step but the first
    first_step_s, val_s, last_t = None, 0.0, t0
    for step in range(args.steps):
        batch = train.next(args.batch_tokens, args.max_seq_len)
        flops = 6 * matmul_params * args.batch_tokens + attention_flops(batch[2])
        loss = run_loss(batch, sched.mtp_weights(step))
        loss.backward()
        opt.step(sched.lr_scale(step), sched.momentum(step), step % 2 == 1, step < sched.split_step)
        last = step + 1 == args.steps or (args.max_seconds > 0 and first_step_s is not None
                                          and time.perf_counter() - t0 - first_step_s >= args.max_seconds)
        val_loss = None
        if args.val_tokens > 0 and (last or (args.val_every > 0 and (step + 1) % args.val_every == 0)):
            torch.cuda.synchronize()
            tv = time.perf_counter()
            val_loss = validate()
            val_s += time.perf_counter() - tv
        pending.append((step + 1, loss.detach(), val_loss, args.batch_tokens, flops))
        if not (last or step == 0 or (step + 1) % args.log_every == 0):
            continue
        # The first step compiles (forward and backward); its time is reported apart. Validation
        # time (and its own compile) is left out of the rates.
        torch.cuda.synchronize()
        now = time.perf_counter()
        rate = mfu = None
        if step == 0:
            first_step_s = now - t0 - val_s
        else:
            span = now - last_t - val_s
            tokens, fl = sum(p[3] for p in pending), sum(p[4] for p in pending)
            rate, mfu = tokens / span, fl / span / H200_PEAK_FLOPS
            steady["tokens"] += tokens
            steady["flops"] += fl
            steady["seconds"] += span
        for s, l, v, _, _ in pending:
            metrics.write(json.dumps({"step": s, "train_loss": float(l), "val_loss": v, "tokens_per_s": rate,
                                      "mfu": mfu, "elapsed_s": round(now - t0, 3)}) + "\n")
        metrics.flush()
        s, l, v = pending[-1][:3]
        vs = f" val {v:.4f}" if v is not None else ""
        rs = f" {rate / 1e3:.1f}k tok/s MFU {100 * mfu:.1f}%" if rate else " (compiled)"
        eta = (now - t0) / (step + 1) * (args.steps - step - 1)
        print(f"\rstep {s}/{args.steps} loss {float(l):.4f}{vs}{rs} ETA {eta:.0f}s   ", end="",
              file=sys.stderr, flush=True)
        pending, val_s, last_t = [], 0.0, time.perf_counter()
        if last:
            break
    print(file=sys.stderr)
    rate = steady["tokens"] / steady["seconds"] if steady["seconds"] > 0 else None
    summary = {
        "config": c["name"], "steps_run": step + 1, "batch_tokens": args.batch_tokens,
        "max_seq_len": args.max_seq_len, "parameters": sum(P[n].numel() for n in trained),
        "matmul_parameters": matmul_params, "first_step_s": round(first_step_s, 2),
        "steady_tokens_per_s": rate,
        "steady_mfu": steady["flops"] / steady["seconds"] / H200_PEAK_FLOPS if rate else None,
        "model_flops_per_token": steady["flops"] / steady["tokens"] if rate else None,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "final_train_loss": float(loss), "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__, "peak_flops": H200_PEAK_FLOPS,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
