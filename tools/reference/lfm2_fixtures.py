"""Golden fixtures for deg's LFM2 / LFM2.5 backbone, made with HF transformers (runs on the GPU
machine).

For each tiny random config below this writes tests/fixtures/lfm2/<name>/:
  config.json, model.safetensors   save_pretrained output (model_type `lfm2`)
  ids.npy                          int64 [T] input token ids
  logits.npy                       float32 [T, V] HF logits, computed in fp32 on CPU (eager)
  hidden.npy                       float32 [T, C] final-norm hidden states (embedding_norm output)
  logits_native_bf16.npy           (bf16 model only) HF logits computed in bf16, for a loose check
  meta.json                        num_parameters = sum(p.numel() for p in model.parameters())
                                   (torch dedups tied weights), ffn_width (the MLP width HF built
                                   after block_auto_adjust_ff_dim), dtype, shapes, tensor names

The bf16 fixture's logits.npy is HF run in fp32 on the bf16-rounded weights (model.float()): the
same math deg runs (bf16 weights, f32 activations and accumulation).

With --bench it also times HF itself at LFM2.5-1.2B dimensions (random bf16 weights, on the
GPU when there is one): prefill tokens/s at 1k / 4k tokens, the "what a user would pick instead"
figure for `deg bench --family lfm2` (printed, not a fixture).

Usage: python3 lfm2_fixtures.py --out DIR [--bench]
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from safetensors.torch import load_file

import transformers
from transformers import Lfm2Config, Lfm2ForCausalLM

C, A = "conv", "full_attention"

# name -> config attributes. Tiny sizes: all fixtures together stay < 2 MB.
CONFIGS = {
    # conv-heavy like the real model; GQA 2; tied; HF's FFN width rule with a multiplier:
    # int(2 * 100 / 3) = 66 -> int(1.25 * 66) = 82 -> rounded up to a multiple of 16 = 96.
    "ccaca_tied": dict(
        vocab_size=256, hidden_size=32, intermediate_size=100, num_attention_heads=4,
        num_key_value_heads=2, layer_types=[C, C, A, C, A], conv_L_cache=3,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.25, block_multiple_of=16,
        tie_word_embeddings=True, tokens=120),
    # attention first; MQA (4 q heads over 1 kv head, head_dim 12); untied head; conv kernel 4;
    # no FFN adjustment; rope theta 1e4.
    "acc_untied": dict(
        vocab_size=192, hidden_size=48, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=1, layer_types=[A, C, C], conv_L_cache=4,
        block_auto_adjust_ff_dim=False, tie_word_embeddings=False, rope_theta=1e4, tokens=100),
    # conv layers only; kernel 2; FFN adjusted with multiplier 1 and multiple 1:
    # int(2 * 64 / 3) = 42. (transformers 5.x refuses a None multiplier.)
    "cc_conv2": dict(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, layer_types=[C, C], conv_L_cache=2,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0, block_multiple_of=1,
        tie_word_embeddings=True,
        tokens=60),
    # attention only, MHA (2 heads of 16); default multiplier 1.0: int(2 * 80 / 3) = 53 ->
    # rounded up to a multiple of 64 = 64.
    "aa_mha": dict(
        vocab_size=128, hidden_size=32, intermediate_size=80, num_attention_heads=2,
        num_key_value_heads=2, layer_types=[A, A], block_auto_adjust_ff_dim=True,
        block_multiple_of=64, tie_word_embeddings=True, tokens=70),
    # bf16 weights, the shapes of ccaca_tied, a longer input.
    "ccaca_bf16": dict(
        vocab_size=256, hidden_size=32, intermediate_size=100, num_attention_heads=4,
        num_key_value_heads=2, layer_types=[C, C, A, C, A], conv_L_cache=3,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.25, block_multiple_of=16,
        tie_word_embeddings=True, tokens=130, bf16=True),
}

SPECIAL = ("tokens", "bf16", "rope_theta")
DEFAULT_THETA = 1e6


def make_config(spec, theta_style):
    kw = {k: v for k, v in spec.items() if k not in SPECIAL}
    kw["num_hidden_layers"] = len(spec["layer_types"])
    kw["pad_token_id"] = 0
    theta = spec.get("rope_theta", DEFAULT_THETA)
    if theta_style == "kwarg":
        kw["rope_theta"] = theta
    cfg = Lfm2Config(**kw)
    if theta_style == "rope_parameters":
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    return cfg, theta


def inv_freq_ok(model, cfg, theta):
    """Whether the built rotary table is HF's default one for `theta` (None: no table found)."""
    d = cfg.hidden_size // cfg.num_attention_heads
    want = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    tables = [b for n, b in model.named_buffers() if n.endswith("inv_freq")]
    if not tables:
        return None
    got = tables[0].float().cpu()
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-6, atol=0)


def build(spec):
    """Lfm2ForCausalLM with the spec's rope theta; the theta goes in as a constructor kwarg or,
    if this transformers ignores that, as rope_parameters (checked on the built rotary table).
    Either way the saved config.json describes the model that made the fixture."""
    first = None
    for style in ("kwarg", "rope_parameters"):
        try:
            cfg, theta = make_config(spec, style)
            model = Lfm2ForCausalLM(cfg)
        except Exception as e:  # this transformers wants rope settings in another form
            print("rope theta via", style, "failed:", repr(e), flush=True)
            continue
        ok = inv_freq_ok(model, cfg, theta)
        print("rope theta", theta, "via", style, "->", ok, flush=True)
        if ok is None or ok:
            return model, cfg
        first = first or (model, cfg)
    print("WARNING: rope theta not applied; using the config's own", flush=True)
    assert first is not None
    return first


def perturb(model, seed):
    """randn * 0.02 on every matrix, * 0.1 on vectors (norm weights), so norms matter and logits
    depend on the context; the short-conv path gets larger weights (in_proj * 0.1, the conv
    kernel * 0.3) so that B * x, the conv and the C gate are O(1) and conv layers move the logits
    well above the tests' 1e-4 tolerance (meta.json records by how much)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.02 if p.dim() > 1 else 0.1
            if name.endswith("conv.in_proj.weight"):
                scale = 0.1
            elif name.endswith("conv.conv.weight"):
                scale = 0.3
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale)


def path_effect(model, ids, logits, suffix):
    """max |logits - logits without the mixers whose out_proj ends in `suffix`| / max |logits|:
    how much those layers move the output (None when the model has none)."""
    params = [p for n, p in model.named_parameters() if n.endswith(suffix)]
    if not params:
        return None
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.zero_()
        without = run_logits(model, ids)
        for p, s in zip(params, saved):
            p.copy_(s)
    return float(np.abs(without - logits).max() / np.abs(logits).max())


def run_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.logits[0].float().numpy()


def run_hidden(model, ids):
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.last_hidden_state[0].float().numpy()


def eager(model):
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # older API
        print("set_attn_implementation failed:", e, "- using config._attn_implementation")
        model.config._attn_implementation = "eager"
    return model


def bench_hf():
    """HF Lfm2ForCausalLM prefill throughput at LFM2.5-1.2B dims, random bf16 weights."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    attn = [2, 5, 8, 10, 12, 14]
    cfg = Lfm2Config(vocab_size=65536, hidden_size=2048, intermediate_size=12288,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     layer_types=[A if i in attn else C for i in range(16)], conv_L_cache=3,
                     block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
                     block_multiple_of=256, tie_word_embeddings=True)
    with torch.device(dev):
        model = Lfm2ForCausalLM(cfg).to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"bench: HF Lfm2ForCausalLM {n / 1e6:.0f}M params bf16 on {name}, "
          f"attn {model.config._attn_implementation}", flush=True)
    for tokens in (1024, 4096):
        ids = torch.randint(0, cfg.vocab_size, (1, tokens), device=dev)
        for rep in range(3):
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
            if dev == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        print(f"bench: prefill {tokens} tokens {dt * 1e3:.1f} ms = {tokens / dt:.0f} tok/s",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    rng = np.random.default_rng(4321)
    for i, (name, spec) in enumerate(CONFIGS.items()):
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        torch.manual_seed(300 + i)
        lm, cfg = build(spec)
        lm = eager(lm).float().eval()
        perturb(lm, 400 + i)
        if spec.get("bf16"):
            lm = lm.to(torch.bfloat16)
        ids = rng.integers(0, cfg.vocab_size, size=spec["tokens"], dtype=np.int64)
        lm.save_pretrained(out_dir)

        # Reference in fp32 on CPU: the bf16 model is upcast (its weights are bf16-exact).
        ref = eager(Lfm2ForCausalLM(lm.config)).eval()
        ref.load_state_dict({k: v.float() for k, v in lm.state_dict().items()})
        ref = ref.float()
        logits = run_logits(ref, ids)
        hidden = run_hidden(ref, ids)
        conv_effect = path_effect(ref, ids, logits, "conv.out_proj.weight")
        attention_effect = path_effect(ref, ids, logits, "self_attn.out_proj.weight")
        print(name, "relative effect of conv layers", conv_effect, "of attention layers",
              attention_effect, flush=True)
        np.save(os.path.join(out_dir, "ids.npy"), ids)
        np.save(os.path.join(out_dir, "logits.npy"), logits.astype(np.float32))
        np.save(os.path.join(out_dir, "hidden.npy"), hidden.astype(np.float32))
        if spec.get("bf16"):
            native = run_logits(lm, ids)
            np.save(os.path.join(out_dir, "logits_native_bf16.npy"), native.astype(np.float32))
            print(name, "native bf16 vs fp32 max abs diff",
                  float(np.abs(native - logits).max()), flush=True)

        # The saved directory loads back in HF and gives the same logits.
        back = eager(Lfm2ForCausalLM.from_pretrained(out_dir, dtype=torch.float32)).eval()
        again = run_logits(back, ids)
        err = float(np.abs(again - logits).max())
        print(name, "reload max abs diff", err, flush=True)
        assert err < 1e-5, (name, err)

        keys = sorted(load_file(os.path.join(out_dir, "model.safetensors")).keys())
        assert any(k.startswith("model.layers.") for k in keys), keys[:5]
        with open(os.path.join(out_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        ffn = lm.model.layers[0].feed_forward
        meta = {
            "name": name,
            "model_type": saved_cfg.get("model_type"),
            "dtype": "bf16" if spec.get("bf16") else "f32",
            "num_parameters": int(sum(p.numel() for p in lm.parameters())),
            "ffn_width": int(ffn.w1.out_features),
            "tied": bool(cfg.tie_word_embeddings),
            "layer_types": list(cfg.layer_types),
            "tokens": int(len(ids)),
            "vocab_size": int(cfg.vocab_size),
            "hidden_size": int(cfg.hidden_size),
            "rope_theta_requested": float(spec.get("rope_theta", DEFAULT_THETA)),
            "conv_path_effect": conv_effect,
            "attention_path_effect": attention_effect,
            "tensors": keys,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "reference": "HF Lfm2ForCausalLM fp32 CPU eager",
        }
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(name, "params", meta["num_parameters"], "ffn", meta["ffn_width"], "logits",
              logits.shape, "|logits|max", float(np.abs(logits).max()), "std",
              float(logits.std()), flush=True)
    print(json.dumps(saved_cfg, indent=1), flush=True)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print("done, total bytes", total, flush=True)
    if args.bench:
        try:
            bench_hf()
        except Exception as e:  # the fixtures above are what matters
            print("bench failed:", repr(e), flush=True)


if __name__ == "__main__":
    sys.exit(main())
