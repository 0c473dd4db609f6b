"""The `gpt` family (seed 003, modded-nanogpt track 1 short GPT) in plain PyTorch: the one model
definition that both the float64 gradient fixture (gpt_reference.py) and the bf16 training
reference (gpt_train_reference.py) run.

Written from the seed's GPT.forward and modded-nanogpt's track_1_short/model/attention.py,
perf/kernels/qkv_rope.py, ngram_table.py and perf/kernels/cross_entropy.py in their plain-torch
spelling (no fp8, no fused kernels), with the topology read from a deg gpt config.json. Paired
heads and the key offset are spelled as the seed's older train_gpt.py does (view/reshape and a
shifted copy), independently of deg's index arithmetic.

Tensors travel as one dict by deg's names (src/train/gpt_params.h): the trained ones and the
buffers `ngram_sign_pool`, `rotary.{narrow,wide}.freq`. The attention core is a callable
`attend(q, k, v, paired, window, scale)` over q, k [N, S, dq], v [N, S, dv] (N positions, S head
slots): the fixture passes a dense masked softmax, the trainer flex_attention.

Letters: T tokens of the packed stream, C model dim, H heads, V vocab.
"""
import json

import torch
import torch.nn.functional as F


def load_config(path):
    with open(path) as f:
        return json.load(f)


def gate_lanes(c):
    """init_mudd_gate's lane layout, generalised to the config's lists."""
    H, pg = c["num_heads"], c["post_gate_layer"]
    lanes = {k: {} for k in ("xsa", "attn_gate", "x0", "ngram")}
    pre = 0
    for l in c["xsa_layers"]:
        lanes["xsa"][l] = (0, pre); pre += H
    for l in c["attn_gate_layers"]:
        if l < pg: lanes["attn_gate"][l] = (0, pre); pre += H
    for l in c["x0_inject_layers"]:
        if l < pg: lanes["x0"][l] = (0, pre); pre += 1
    for l in c["ngram_inject_layers"]:
        if l < pg: lanes["ngram"][l] = (0, pre); pre += 1
    post = 0
    for l in c["attn_gate_layers"]:
        if l >= pg: lanes["attn_gate"][l] = (1, post); post += H
    for l in c["x0_inject_layers"]:
        if l >= pg: lanes["x0"][l] = (1, post); post += 1
    for l in c["ngram_inject_layers"]:
        if l >= pg: lanes["ngram"][l] = (1, post); post += 1
    skip = post
    post += 1
    lanes.update(pre_count=pre, post_count=post, skip=skip)
    return lanes


class GptSpec:
    """A config.json plus what follows from it: widths per layer, gate lanes, tensor shapes."""

    def __init__(self, cfg):
        self.cfg = c = cfg
        self.nmu = max(14, len(c["post_mix_sources"]))
        self.lanes = gate_lanes(c)
        self.ng = max(self.lanes["pre_count"], self.lanes["post_count"])
        self.attn_scale = {"narrow": c["narrow_attn_scale"], "wide": c["wide_attn_scale"]}

    def qk_dim(self, i):
        c = self.cfg
        return c["head_dim"] if i in c["wide_qk_layers"] else c["narrow_head_dim"]

    def v_dim(self, i):
        c = self.cfg
        return c["narrow_head_dim"] if i in c["half_v_layers"] else c["head_dim"]

    def shapes(self):
        """The trained tensors in GptParams::create's order: name -> shape."""
        c = self.cfg
        C, V, H, L = c["model_dim"], c["vocab_size"], c["num_heads"], c["num_layers"]
        nmu, ng = self.nmu, self.ng
        shapes = {
            "embed": (V, C), "lm_head": (V, C),
            "value_embeds": (len(c["value_embed_layers"]), V, C),
            "ngram_table": (c["ngram_vocab"], c["ngram_dim"]),
            "smear_gate": (1, c["smear_channels"]),
            "ve_gate": (len(c["value_embed_gate_layers"]), H, 2 * c["value_embed_gate_channels"]),
            "scalars": (2 * L + 2,), "resid_lambdas": (L, 2), "post_lambdas": (L, 2),
        }
        for i in range(L):
            if i in c["attn_layers"]:
                dq, dv = self.qk_dim(i), self.v_dim(i)
                shapes[f"layers.{i}.attn.qk"] = (2 * H * dq, C)
                shapes[f"layers.{i}.attn.v"] = (H * dv, C)
                shapes[f"layers.{i}.attn.o"] = (C, H * dv)
            if i not in c["no_mlp_layers"]:
                shapes[f"layers.{i}.mlp.fc"] = (c["mlp_hidden"], C)
                shapes[f"layers.{i}.mlp.proj"] = (c["mlp_hidden"], C)
        if c["parallel_mlp_layer"] >= 0:
            shapes["parallel_mlp.fc"] = (c["mlp_hidden"], C)
            shapes["parallel_mlp.proj"] = (c["mlp_hidden"], C)
        shapes.update({
            "mudd_w1": (2, c["mudd_dim"], C), "mudd_w2": (2, nmu, c["mudd_dim"]),
            "mudd_b2": (2, nmu), "mudd_w2g": (nmu, c["mudd_groups"], c["mudd_dim"]),
            "mudd_gate_w1": (2, c["mudd_gate_dim"], C), "mudd_gate_w2": (2, ng, c["mudd_gate_dim"]),
            "mudd_gate_b2": (2, ng), "mudd_gate_scale": (1,),
        })
        return shapes


def rotary_freq(width, rotary_dim):
    """(1/1024)^linspace(0, 1, rotary_dim/2), each repeated for its pair, zeros after: [width]."""
    f = (1 / 1024) ** torch.linspace(0, 1, steps=rotary_dim // 2, dtype=torch.float32)
    f = f.repeat_interleave(2)
    return torch.cat([f, f.new_zeros(width - rotary_dim)])


def norm(x, eps):
    return F.rms_norm(x, (x.size(-1),), eps=eps)


def rotary_tables(freq, positions, paired):
    """factor1/factor2 as Yarn builds them (odd lanes of factor2 negated), float64."""
    t = positions.to(torch.float64)
    f = freq.to(torch.float64)
    if not paired:
        theta = torch.outer(t, f)
        f1, f2 = theta.cos(), theta.sin()
    else:
        th1, th2 = torch.outer(2 * t, f), torch.outer(2 * t + 1, f)
        f1 = torch.cat((th1.cos(), th2.cos()), -1)
        f2 = torch.cat((th1.sin(), th2.sin()), -1)
    f2 = f2.clone()
    f2[..., 1::2] *= -1
    return f1, f2


def rotary(x, f1, f2):  # x [T, heads, d], tables [T, d]
    f1, f2 = f1.to(x.dtype), f2.to(x.dtype)
    x_flip = x.view(*x.shape[:-1], x.shape[-1] // 2, 2).flip(-1).view(x.shape)
    return f1[:, None, :] * x + f2[:, None, :] * x_flip


def attention(spec, P, i, x, aux_v, xsa_alpha, gate, o_scale, attend, windows):
    c = spec.cfg
    T, H, hd, rot = x.size(0), c["num_heads"], c["head_dim"], c["rotary_dim"]
    dq, dv = spec.qk_dim(i), spec.v_dim(i)
    paired = i in c["paired_head_layers"]
    key_offset = i in c["long_window_layers"]
    window = windows[1] if key_offset else windows[0]
    kind = "wide" if i in c["wide_qk_layers"] else "narrow"
    freq = P[f"rotary.{kind}.freq"]
    sa0 = P["scalars"][2 * i]
    qkv = x @ (sa0 * torch.cat((P[f"layers.{i}.attn.qk"], P[f"layers.{i}.attn.v"]))).T
    qk, v = qkv.split((2 * H * dq, H * dv), dim=-1)
    qk = qk.view(T, 2 * H, dq)
    q, k = norm(qk[:, :H], c["norm_eps"]), norm(qk[:, H:], c["norm_eps"])
    v = v.reshape(T, H, dv)
    aux = None if aux_v is None else aux_v.view(T, H, hd)[..., :dv]
    pos = torch.arange(T, device=x.device)
    if not paired:
        f1, f2 = rotary_tables(freq, pos, False)
        q, k = rotary(q, f1, f2), rotary(k, f1, f2)
        if key_offset:  # k[:, 1:, :, rot:] = k[:, :-1, :, rot:]
            stat = torch.cat((k[:1, :, rot:], k[:-1, :, rot:]), 0)
            k = torch.cat((k[:, :, :rot], stat), -1)
        if aux is not None:
            v = v + aux
    else:
        f1, f2 = rotary_tables(freq, pos, True)
        q = rotary(q.reshape(T, H // 2, 2 * dq), f1, f2).reshape(2 * T, H // 2, dq)
        k = rotary(k.reshape(T, H // 2, 2 * dq), f1, f2).reshape(2 * T, H // 2, dq)
        v = v.reshape(2 * T, H // 2, dv)
        if aux is not None:
            v = v + aux.reshape(2 * T, H // 2, dv)
    y = attend(q, k, v, paired, window, spec.attn_scale[kind])
    y = y.reshape(T, H, dv)
    if xsa_alpha is not None and not paired:
        dot = (y * v).sum(-1, keepdim=True)
        denom = v.square().sum(-1, keepdim=True).clamp_min(1e-8)
        y = y - torch.tanh(xsa_alpha).reshape(T, H, 1) * (dot / denom) * v
    if gate is not None:
        y = y * gate.reshape(T, H, 1)
    y = y.reshape(T, H * dv)
    return y @ (o_scale * P[f"layers.{i}.attn.o"]).T


def mlp(x, fc, proj):
    return F.relu(x @ fc.T).square() @ proj


def ngram_rows(c, x):
    """ngram_row_ids and the sign-pool hashes of the token stream x [T], int32 wrap-around
    (ngram_table.py, ngram_embed.py): (table rows [2T], bigram sign rows [T], trigram [T])."""
    x = x.to(torch.int32)
    n, V2 = x.numel(), c["ngram_vocab"]
    half = V2 // 2
    bmod, tmod = half - 1, V2 - half - 1
    bm, tm = c["bigram_row_muls"], c["trigram_row_muls"]
    out = torch.empty(2 * n, dtype=torch.int32, device=x.device)
    big, tri = out[:n], out[n:]
    big.copy_(x)
    big[0] = bmod
    big[1:] = torch.bitwise_xor(bm[0] * big[1:], bm[1] * big[:-1]) % bmod
    tri[0] = tri[1] = half + tmod
    tri[2:] = torch.bitwise_xor(torch.bitwise_xor(tm[0] * x[2:], tm[1] * x[1:-1]), tm[2] * x[:-2]) % tmod + half
    mask = c["ngram_sign_rows"] - 1
    bs, ts = c["bigram_sign_muls"], c["trigram_sign_muls"]
    sb = torch.zeros(n, dtype=torch.int32, device=x.device)
    st = torch.zeros(n, dtype=torch.int32, device=x.device)
    sb[1:] = ((bs[1] * x[:-1]) ^ (bs[0] * x[1:])) & mask
    st[2:] = ((ts[2] * x[:-2]) ^ (ts[1] * x[1:-1]) ^ (ts[0] * x[2:])) & mask
    return out.long(), sb.long(), st.long()


def forward(spec, P, inputs, ngram, attend, windows):
    """The final normed hidden state [T, C] of the token stream `inputs` [T]; `ngram` is
    ngram_rows(cfg, inputs), windows (short, long)."""
    c = spec.cfg
    T, C, H, hd, Dn, L = inputs.numel(), c["model_dim"], c["num_heads"], c["head_dim"], c["ngram_dim"], c["num_layers"]
    eps = c["norm_eps"]
    lanes = spec.lanes
    L1 = L - 1
    late = c["late_layer"]

    def mudd(x, id_, n):
        h = F.gelu(x @ P["mudd_w1"][id_].T)
        return (h @ P["mudd_w2"][id_, :n].T + P["mudd_b2"][id_, :n]) * c["mudd_scale"], h

    def mudd_gate(x, id_):
        h = F.gelu(x @ P["mudd_gate_w1"][id_].T)
        return (h @ P["mudd_gate_w2"][id_].T + P["mudd_gate_b2"][id_]) * P["mudd_gate_scale"][0]

    gates = [None, None]

    x = P["embed"][inputs]
    rows, sb, st = ngram
    tab, sign_pool = P["ngram_table"], P["ngram_sign_pool"]
    x0_ngram = tab[rows[:T]] * sign_pool[sb] + tab[rows[T:]] * sign_pool[st]
    nve = len(c["value_embed_layers"])
    ve_planes = P["value_embeds"].view(nve, c["vocab_size"], C)[:, inputs]
    ve = {l: ve_planes[j] for j, l in enumerate(c["value_embed_layers"])}
    sc = c["smear_channels"]
    smear_lambda, skip_lambda = P["scalars"][2 * L], P["scalars"][2 * L + 1]
    smear = smear_lambda * torch.sigmoid(x[1:, :sc] @ P["smear_gate"].T)
    x = torch.cat([x[:1], x[1:] + smear * x[:-1]])
    x = x0 = norm(x, eps)
    gates[0] = mudd_gate(x0, 0)

    def g(kind, i):
        gid, start = lanes[kind][i]
        return gates[gid][:, start:start + 1]

    def ngram_add(x, coef):
        return torch.cat([x[:, :Dn] + coef * x0_ngram, x[:, Dn:]], -1)

    if 0 in c["ngram_inject_layers"]:
        x = ngram_add(x0, g("ngram", 0))
    cache = {0: x}

    def inject(i, x):
        if i in c["x0_inject_layers"]:
            x = x + x0 * g("x0", i)
        if i in c["ngram_inject_layers"] and i != 0:
            x = ngram_add(x, g("ngram", i))
        return x

    late_in = None
    mlp_in = None
    for i in range(L):
        mu = None
        if i == c["post_gate_layer"]:
            gates[1] = mudd_gate(x, 1)
        if i == c["skip_layer"]:
            x = x + torch.sigmoid(skip_lambda) * gates[1][:, lanes["skip"]:lanes["skip"] + 1] * cache[c["skip_source"]]
        elif i not in c["attn_layers"]:
            x = inject(i, P["resid_lambdas"][i, 0] * x)
        else:
            if late >= 0 and i > late:
                if late_in is None:
                    late_in = norm(cache[late], eps)
                attn_in = late_in
            else:
                attn_in = norm(x, eps)
            if i == L1:
                cache[L1 - 1] = x
                mu, _ = mudd(x, 0, 14)
                mu = mu.split(1, -1)
                v_mudd = mu[0] * cache[0] + mu[1] * cache[late] + mu[2] * x
                x = (1 + mu[5]) * x + mu[3] * cache[0] + mu[4] * cache[late]
                ve_gate = torch.cat([mu[6], mu[7]], -1).repeat_interleave(H // 2, -1).unsqueeze(-1)
                aux_v = (ve_gate * ve[i].view(T, H, hd)).view(T, C) + v_mudd
            elif i in ve:
                if i in c["value_embed_gate_layers"]:
                    j = c["value_embed_gate_layers"].index(i)
                    gc = c["value_embed_gate_channels"]
                    gate_in = torch.cat([attn_in[:, :gc], ve[i][:, :gc]], -1)
                    gv = 2 * torch.sigmoid(gate_in @ P["ve_gate"][j].T)
                    aux_v = (gv.view(T, H, 1) * ve[i].view(T, H, hd)).view(T, C)
                else:
                    aux_v = ve[i]
            else:
                aux_v = None
            xsa = None
            if i in lanes["xsa"]:
                gid, s0 = lanes["xsa"][i]
                xsa = gates[gid][:, s0:s0 + H]
            agate = None
            if i in lanes["attn_gate"]:
                gid, s0 = lanes["attn_gate"][i]
                agate = gates[gid][:, s0:s0 + H]
            sa1 = P["scalars"][2 * i + 1]
            o_scale = sa1 if mu is not None else sa1 * P["post_lambdas"][i, 0]
            out = attention(spec, P, i, attn_in, aux_v, xsa, agate, o_scale, attend, windows)
            if mu is not None:
                x = mu[8] * x + mu[9] * out + mu[10] * cache[0]
                x = ngram_add(x, mu[11])
            else:
                x = inject(i, P["resid_lambdas"][i, 0] * x + out)
        if i in c["no_mlp_layers"]:
            x = P["resid_lambdas"][i, 1] * x
        else:
            mlp_in = norm(x, eps)
            mo = mlp(mlp_in, P[f"layers.{i}.mlp.fc"], P[f"layers.{i}.mlp.proj"])
            if mu is not None:
                x = mu[12] * x + mu[13] * mo
            else:
                x = P["resid_lambdas"][i, 1] * x + P["post_lambdas"][i, 1] * mo
                if i == c["parallel_mlp_layer"]:
                    x = x + P["post_lambdas"][i, 1] * mlp(mlp_in, P["parallel_mlp.fc"], P["parallel_mlp.proj"])
        if i < L1:
            cache[i] = x if i > 0 else cache[0]
    # post-loop MUDD mix (forward_mudd_grouped)
    srcs = []
    for s in c["post_mix_sources"]:
        if s["kind"] == "cache":
            srcs.append(cache[s["layer"]])
        elif s["kind"] == "value_embed":
            srcs.append(ve[s["layer"]])
        elif s["kind"] == "last_mlp_in":
            srcs.append(mlp_in)
        else:
            srcs.append(late_in)
    n = len(srcs)
    h = F.gelu(x @ P["mudd_w1"][1].T)
    mu = (h @ P["mudd_w2"][1, :n].T + P["mudd_b2"][1, :n]) * c["mudd_scale"]
    deltas = torch.einsum("td,kgd->tkg", h, P["mudd_w2g"][:n]) * c["mudd_scale"]
    G = c["mudd_groups"]
    mixed = x.unflatten(-1, (G, -1))
    for k, src in enumerate(srcs):
        mixed = mixed + (mu[:, k:k + 1] + deltas[:, k, :]).unsqueeze(-1) * src.unflatten(-1, (G, -1))
    return norm(mixed.flatten(-2), eps)


def softcap(spec, z):
    """The head's soft cap of the raw logits z = xn lm_head^T: a * sigmoid((z + b) / c)."""
    a, b, cc = spec.cfg["softcap"]
    return a * torch.sigmoid((z + b) / cc)
