"""Golden fixtures for deg's Qwen3.5 backbone, made with HF transformers (runs on the GPU machine).

For each tiny random config below this writes tests/fixtures/qwen35/<name>/:
  config.json, model.safetensors   save_pretrained output (plain `qwen3_5_text` layout, or the
                                   multimodal `qwen3_5` layout with text_config and
                                   model.language_model.* weights)
  ids.npy                          int64 [T] input token ids
  logits.npy                       float32 [T, V] HF logits, computed in fp32 on CPU (eager)
  hidden.npy                       float32 [T, C] final-norm hidden states (last_hidden_state)
  logits_native_bf16.npy           (bf16 model only) HF logits computed in bf16, for a loose check
  meta.json                        num_parameters = sum(p.numel() for p in model.parameters())
                                   (torch dedups tied weights), dtype, layout, shapes

The bf16 fixture's logits.npy is HF run in fp32 on the bf16-rounded weights (model.float()):
the same math deg runs (bf16 weights, f32 activations and accumulation).

Usage: python3 qwen35_fixtures.py --out DIR
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

L, F = "linear_attention", "full_attention"

# name -> config attributes. Tiny sizes: all fixtures together stay < 3 MB.
CONFIGS = {
    # 3 linear : 1 full like the real model; GQA 2; grouped value heads (4 v over 2 k); dk != dv.
    "lllf_untied": dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, layer_types=[L, L, L, F],
        tie_word_embeddings=False, tokens=150),
    # attention first; GQA 4; no value grouping; tied head; head_dim 32 (rotary dim 8).
    "fl_tied": dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, layer_types=[F, L],
        tie_word_embeddings=True, rope_theta=1e6, tokens=100),
    # multimodal layout (qwen3_5 + text_config, model.language_model.*); MHA; value heads 4 per
    # key head; partial_rotary_factor 0.5 (rotary dim 16 of head_dim 32); tied.
    "lflf_multimodal": dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, layer_types=[L, F, L, F],
        tie_word_embeddings=True, partial_rotary_factor=0.5, tokens=90, multimodal=True),
    # bf16 weights, same shapes as lllf_untied, a longer input (3 delta-rule chunks).
    "lllf_bf16": dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, layer_types=[L, L, L, F],
        tie_word_embeddings=False, tokens=170, bf16=True),
    # only linear layers, conv kernel 3 (not the default 4).
    "ll_conv3": dict(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=16, layer_types=[L, L],
        linear_conv_kernel_dim=3, tie_word_embeddings=False, tokens=70),
}

SPECIAL = ("tokens", "multimodal", "bf16", "partial_rotary_factor", "rope_theta")


def make_config(spec):
    cfg = Qwen3_5TextConfig()
    for k, v in spec.items():
        if k not in SPECIAL:
            setattr(cfg, k, v)
    cfg.num_hidden_layers = len(spec["layer_types"])
    rp = dict(cfg.rope_parameters or {})
    rp.setdefault("rope_type", "default")
    rp.setdefault("rope_theta", 10000.0)
    if "partial_rotary_factor" in spec:
        rp["partial_rotary_factor"] = spec["partial_rotary_factor"]
    if "rope_theta" in spec:
        rp["rope_theta"] = spec["rope_theta"]
    cfg.rope_parameters = rp
    cfg.pad_token_id = 0
    return cfg


def perturb(model, seed):
    """randn * 0.02 on every matrix, * 0.1 on vectors (norm weights, dt_bias) so norms and gates
    matter; A_log redrawn as log(U(0.005, 2)) so some heads keep state across 64-token chunks
    (HF's init, log(U(0.01, 16)), forgets within a few tokens on most heads)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                u = torch.rand(p.shape, generator=g) * (2 - 0.005) + 0.005
                p.copy_(u.log().to(p.dtype))
                continue
            scale = 0.02 if p.dim() > 1 else 0.1
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale)


def run_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.logits[0].float().numpy()


def run_hidden(text_model, ids):
    with torch.no_grad():
        out = text_model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.last_hidden_state[0].float().numpy()


def eager(model):
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # older API
        print("set_attn_implementation failed:", e, "- using config._attn_implementation")
        model.config._attn_implementation = "eager"
    return model


def multimodal_save(lm, cfg, out_dir):
    """Builds a Qwen3_5ForConditionalGeneration with a tiny vision tower around the text model's
    weights and saves it: the real multimodal snapshot layout. Returns that model."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3,
                  patch_size=2, temporal_patch_size=1, spatial_merge_size=1,
                  out_hidden_size=cfg.hidden_size, num_position_embeddings=16)
    mcfg = Qwen3_5Config(text_config=cfg.to_dict(), vision_config=vision,
                         tie_word_embeddings=cfg.tie_word_embeddings)
    mm = Qwen3_5ForConditionalGeneration(mcfg).eval()
    mm.model.language_model.load_state_dict(lm.model.state_dict(), strict=True)
    with torch.no_grad():
        if not cfg.tie_word_embeddings:
            mm.lm_head.weight.copy_(lm.lm_head.weight)
    mm.save_pretrained(out_dir)
    return mm


def manual_save(lm, cfg, out_dir):
    """The multimodal layout without HF's multimodal class: text_config nested under a
    `qwen3_5` config, every `model.` key renamed to `model.language_model.`."""
    sd = {k: v.contiguous() for k, v in lm.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in sd.items()}
    save_file(renamed, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    text = cfg.to_dict()
    top = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "text_config": text, "tie_word_embeddings": bool(cfg.tie_word_embeddings)}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    rng = np.random.default_rng(1234)
    for i, (name, spec) in enumerate(CONFIGS.items()):
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        torch.manual_seed(100 + i)
        cfg = make_config(spec)
        lm = eager(Qwen3_5ForCausalLM(cfg)).float().eval()
        perturb(lm, 200 + i)
        if spec.get("bf16"):
            lm = lm.to(torch.bfloat16)
        ids = rng.integers(0, cfg.vocab_size, size=spec["tokens"], dtype=np.int64)

        manual = False
        if spec.get("multimodal"):
            try:
                model = eager(multimodal_save(lm, cfg, out_dir))
            except Exception as e:  # build the layout by hand: nest the config, rename keys
                print(name, "Qwen3_5ForConditionalGeneration failed:", repr(e), flush=True)
                manual = True
                manual_save(lm, cfg, out_dir)
                model = lm
        else:
            lm.save_pretrained(out_dir)
            model = lm

        # Reference in fp32 on CPU: the bf16 model is upcast (its weights are bf16-exact).
        ref = eager(type(model)(model.config)).eval()
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        ref = ref.float()
        logits = run_logits(ref, ids)
        text_model = ref.model.language_model if spec.get("multimodal") and not manual else ref.model
        hidden = run_hidden(text_model, ids)
        if spec.get("multimodal") and not manual:
            plain = run_logits(lm.float(), ids)
            print(name, "multimodal vs text-only HF max abs diff",
                  float(np.abs(plain - logits).max()), flush=True)
            assert np.abs(plain - logits).max() < 1e-5
        np.save(os.path.join(out_dir, "ids.npy"), ids)
        np.save(os.path.join(out_dir, "logits.npy"), logits.astype(np.float32))
        np.save(os.path.join(out_dir, "hidden.npy"), hidden.astype(np.float32))
        if spec.get("bf16"):
            native = run_logits(model, ids)
            np.save(os.path.join(out_dir, "logits_native_bf16.npy"), native.astype(np.float32))
            print(name, "native bf16 vs fp32 max abs diff",
                  float(np.abs(native - logits).max()), flush=True)

        # The saved directory loads back in HF and gives the same logits.
        if not manual:
            cls = type(model)
            back = eager(cls.from_pretrained(out_dir, dtype=torch.float32)).eval()
            again = run_logits(back, ids)
            err = float(np.abs(again - logits).max())
            print(name, "reload max abs diff", err, flush=True)
            assert err < 1e-5, (name, err)

        keys = sorted(load_file(os.path.join(out_dir, "model.safetensors")).keys())
        prefix = "model.language_model." if spec.get("multimodal") else "model."
        assert any(k.startswith(prefix + "layers.") for k in keys), keys[:5]
        with open(os.path.join(out_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        meta = {
            "name": name,
            "model_type": saved_cfg.get("model_type"),
            "layout": "multimodal" if spec.get("multimodal") else "text",
            "layout_built_by_hand": manual,
            "dtype": "bf16" if spec.get("bf16") else "f32",
            "num_parameters": int(sum(p.numel() for p in model.parameters())),
            "num_text_parameters": int(sum(p.numel() for p in lm.parameters())),
            "tied": bool(cfg.tie_word_embeddings),
            "layer_types": list(cfg.layer_types),
            "tokens": int(len(ids)),
            "vocab_size": int(cfg.vocab_size),
            "hidden_size": int(cfg.hidden_size),
            "tensors": keys,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "reference": "HF Qwen3_5ForCausalLM fp32 CPU eager" if not spec.get("multimodal")
            else "HF Qwen3_5ForConditionalGeneration fp32 CPU eager (text only)",
        }
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(name, "params", meta["num_parameters"], "logits", logits.shape,
              "|logits|max", float(np.abs(logits).max()), "std", float(logits.std()), flush=True)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print("done, total bytes", total, flush=True)


if __name__ == "__main__":
    sys.exit(main())
