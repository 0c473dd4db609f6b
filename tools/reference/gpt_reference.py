"""The gradient fixture of deg's `gpt` training core (tests/train_gpt_reference_test.cc): the
model of gpt_model.py in float64 on the CPU, its attention a dense masked softmax, its loss summed
one term at a time, gradients from torch autograd.

Writes into --out: config.json (copied), weights.safetensors (f32, deg's tensor names),
batch.json (tokens, targets, prefix targets, segments, loss options) and expected.safetensors
(the loss and every parameter's gradient, f32; the loss also as a decimal string in metadata).

Run on the GPU machine (CPU is enough): python3 gpt_reference.py --config CONFIG --out DIR
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

from gpt_model import GptSpec, forward, load_config, ngram_rows, rotary_freq, softcap

DT = torch.float64


def fixture_tensors(spec, gen):
    """Every tensor by deg name, float64. Random values (not the init): every path and gate is
    live. Matrices at about the seed's init scale (std 0.5 / sqrt(C) ~ 0.075 here): much larger
    weights make the gradients so sensitive that float32 cannot reproduce float64 to 1e-4.
    Rounded to f32 so deg reads exactly these numbers. Trained tensors require grad."""
    c = spec.cfg
    P = {}
    for name, shape in spec.shapes().items():
        t = torch.randn(shape, generator=gen, dtype=DT) * 0.3
        if name in ("scalars", "resid_lambdas", "post_lambdas"):
            t = 1.0 + 0.2 * t
        if name == "lm_head" or ".attn." in name or "mlp." in name:
            t = t * 0.25
        if name == "mudd_gate_scale":
            t = torch.tensor([0.5], dtype=DT)
        if name == "mudd_b2":
            t = t / c["mudd_scale"] * 0.5
        P[name] = t.float().to(DT).requires_grad_(True)
    P["ngram_sign_pool"] = torch.randn(c["ngram_sign_rows"], c["ngram_dim"], generator=gen).sign().to(DT)
    for kind, width in (("narrow", c["narrow_head_dim"]), ("wide", c["head_dim"])):
        P[f"rotary.{kind}.freq"] = rotary_freq(width, c["rotary_dim"]) * 2.0  # visible rotation at short T
    return P


def save_weights(spec, P, path):
    out = {k: v.detach().float().contiguous() for k, v in P.items()}
    for kind in ("narrow", "wide"):
        out[f"rotary.{kind}.attn_scale"] = torch.tensor([spec.attn_scale[kind]], dtype=torch.float32)
    save_file(out, path)


def dense_attend(seg):
    """Causal sliding-window attention inside segments (seg: each token's segment start), as a
    dense masked softmax: q, k [N, S, dq], v [N, S, dv]; paired layers run on 2T positions."""

    def attend(q, k, v, paired, window, scale):
        segN = 2 * seg.repeat_interleave(2) if paired else seg
        N = q.size(0)
        i = torch.arange(N, device=q.device)[:, None]
        j = torch.arange(N, device=q.device)[None, :]
        allowed = (j <= i) & (i - j <= window) & (j >= segN[:, None])
        s = torch.einsum("isd,jsd->sij", q, k) * scale
        s = s.masked_fill(~allowed[None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.einsum("sij,jsd->isd", p, v)

    return attend


def loss_fn(spec, P, xn, targets, prefix, mtp, prefix_weight):
    """The multi-token + prefix loss, one term at a time (mean over tokens)."""
    logp = torch.log_softmax(softcap(spec, xn @ P["lm_head"].T), -1)
    T = xn.size(0)
    total = xn.new_zeros(())
    for k, w in enumerate(mtp):
        for t in range(T - k):
            tg = int(targets[t + k])
            if tg >= 0:
                total = total - w * logp[t, tg]
    for t in range(T):
        if prefix[t] >= 0 and prefix_weight != 0:
            total = total - prefix_weight * logp[t, int(prefix[t])]
    return total / T


def main():
    ap = argparse.ArgumentParser(description="Write the gpt gradient fixture (float64 autograd).")
    ap.add_argument("--config", required=True, help="a deg gpt config.json (the fixture uses tiny)")
    ap.add_argument("--out", required=True, help="fixture directory to write")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = load_config(args.config)
    spec = GptSpec(cfg)
    gen = torch.Generator().manual_seed(2026)
    P = fixture_tensors(spec, gen)
    T = 40
    V = cfg["vocab_size"]
    inputs = torch.randint(0, V, (T,), generator=gen)
    targets = torch.randint(0, V, (T,), generator=gen)
    targets[7] = -1
    prefix = torch.randint(0, V, (T,), generator=gen)
    prefix[::4] = -1
    seg = torch.tensor([0] * 13 + [13] * 17 + [30] * 10)
    mtp, prefix_weight, windows = [1.0, 0.5, 0.25], 0.25, (6, 12)
    xn = forward(spec, P, inputs, ngram_rows(cfg, inputs), dense_attend(seg), windows)
    loss = loss_fn(spec, P, xn, targets, prefix, mtp, prefix_weight)
    loss.backward()
    print(f"loss {loss.item():.12f}")
    save_weights(spec, P, os.path.join(args.out, "weights.safetensors"))
    trained = list(spec.shapes())
    expected = {"loss": loss.detach().float().reshape(1)}
    for name in trained:
        expected["grad." + name] = P[name].grad.float().contiguous()
    save_file(expected, os.path.join(args.out, "expected.safetensors"), metadata={"loss": repr(loss.item())})
    batch = {"inputs": inputs.tolist(), "targets": targets.tolist(), "prefix": prefix.tolist(),
             "seg_start": seg.tolist(), "mtp_weights": mtp, "prefix_weight": prefix_weight,
             "window_short": windows[0], "window_long": windows[1]}
    with open(os.path.join(args.out, "batch.json"), "w") as f:
        json.dump(batch, f)
    shutil.copy(args.config, os.path.join(args.out, "config.json"))
    print("grad norms:", {k: round(float(P[k].grad.norm()), 6) for k in trained[:8]})


if __name__ == "__main__":
    main()
