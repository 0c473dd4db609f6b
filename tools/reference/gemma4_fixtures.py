"""Golden fixtures for deg's Gemma 4 backbone, made with HF transformers (runs on the GPU machine).

For each tiny random config below this writes tests/fixtures/gemma4/<name>/:
  config.json, model.safetensors   save_pretrained output (plain `gemma4_text` layout, or the
                                   multimodal `gemma4` layout with text_config and
                                   model.language_model.* weights)
  ids.npy                          int64 [T] input token ids (T longer than the sliding window)
  logits.npy                       float32 [T, V] HF logits (soft-capped), fp32 on CPU, eager
  hidden.npy                       float32 [T, C] final-norm hidden states (last_hidden_state)
  logits_native_bf16.npy           (bf16 model only) HF logits computed in bf16, a loose check
  meta.json                        num_parameters = sum(p.numel() for p in model.parameters())
                                   (torch dedups tied weights), saved buffers, layout, shapes

The configs cover: sliding layers whose window is shorter than the input (and, in one, longer
than deg's 64-token test read chunk), global layers with their own head dim and proportional
partial rotary, K/V-sharing layers (sliding and global sources), per-layer embeddings (PLE),
the double-wide MLP on shared layers, the final logit soft-cap, a perturbed layer scalar, an
untied head without PLE / sharing / soft-cap, and the multimodal snapshot layout.

Every parameter gets randn * 0.02 (matrices) or randn * 0.1 (norm vectors) on top of HF's init,
the q/k norm weights are then scaled by head_dim^-1/4 (see perturb);
the layer_scalar buffers are drawn from U(0.5, 1.5) so the scalar matters. The bf16 fixture's
logits.npy is HF run in fp32 on the bf16-rounded weights (model.float()): the math deg runs.

Usage: python3 gemma4_fixtures.py --out DIR [--sources DIR]
  --sources: also write the installed transformers' Gemma 4 / rope / masking sources there.
"""

import argparse
import inspect
import json
import os
import sys
import traceback

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

S, F = "sliding_attention", "full_attention"

# name -> config. `global_head_dim`: head dim of the full-attention layers (per_layer_config).
# Tiny sizes: all fixtures together stay under 2 MB.
CONFIGS = {
    # 2 sliding : 1 global twice; GQA 2; window 8 over 40 tokens; the last two layers share
    # K/V (layer 4 reads layer 3's sliding K/V, layer 5 layer 2's global K/V); PLE 8; cap 1.
    "ssf_shared_f32": dict(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8,
        layer_types=[S, S, F, S, S, F], num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        use_double_wide_mlp=False, final_logit_softcapping=1.0, tokens=40),
    # bf16; 3 sliding : 1 global; MQA; window 16 over 150 tokens (3 reads of 64); 3 shared
    # layers with the double-wide MLP; PLE 4; global rotary 0.5 of head dim 64.
    "sssf_wide_bf16": dict(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=16,
        layer_types=[S, S, S, F, S, S, S, F], num_kv_shared_layers=3,
        hidden_size_per_layer_input=4, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        global_partial_rotary=0.5, global_theta=50000.0, tokens=150, bf16=True),
    # multimodal layout (gemma4 + text_config, model.language_model.*); window 80 longer than a
    # 64-token read over 150 tokens; GQA 4; one shared global layer; PLE 8; cap 2.
    "sfssf_multimodal": dict(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=80,
        layer_types=[S, F, S, S, F], num_kv_shared_layers=1, hidden_size_per_layer_input=8,
        use_double_wide_mlp=False, final_logit_softcapping=2.0, sliding_theta=20000.0,
        tokens=150, multimodal=True),
    # no PLE, no sharing, no soft-cap, untied head, MHA, window 4 over 30 tokens.
    "ssf_plain_untied": dict(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, global_head_dim=16, sliding_window=4,
        layer_types=[S, S, F], num_kv_shared_layers=0, hidden_size_per_layer_input=0,
        use_double_wide_mlp=False, final_logit_softcapping=None, tie_word_embeddings=False,
        tokens=30),
}

SPECIAL = ("tokens", "multimodal", "bf16", "global_head_dim", "global_partial_rotary",
           "global_theta", "sliding_theta")


def make_config(spec):
    cfg = Gemma4TextConfig()
    for k, v in spec.items():
        if k not in SPECIAL:
            setattr(cfg, k, v)
    layer_types = spec["layer_types"]
    cfg.num_hidden_layers = len(layer_types)
    cfg.vocab_size_per_layer_input = spec["vocab_size"]
    cfg.tie_word_embeddings = spec.get("tie_word_embeddings", True)
    cfg.max_position_embeddings = 4096
    cfg.pad_token_id = 0
    cfg.bos_token_id = 2
    cfg.eos_token_id = 1
    for off in ("enable_moe_block", "attention_k_eq_v"):
        if hasattr(cfg, off):
            setattr(cfg, off, False)
    if hasattr(cfg, "use_bidirectional_attention"):
        cfg.use_bidirectional_attention = None
    # Global layers' head dim: per_layer_config naming every full-attention layer (REFERENCE-NOTES).
    width = len(str(len(layer_types) - 1))
    plc = {str(i).zfill(max(2, width)): {"head_dim": spec["global_head_dim"]}
           for i, t in enumerate(layer_types) if t == F}
    try:
        cfg.per_layer_config = plc
    except Exception as e:
        print("per_layer_config assignment failed:", repr(e), "- setting global_head_dim", flush=True)
        cfg.global_head_dim = spec["global_head_dim"]
    rp = {k: dict(v) for k, v in (cfg.rope_parameters or {}).items() if isinstance(v, dict)}
    rp.setdefault(S, {"rope_type": "default", "rope_theta": 10000.0})
    rp.setdefault(F, {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                      "rope_theta": 1000000.0})
    if "global_partial_rotary" in spec:
        rp[F]["partial_rotary_factor"] = spec["global_partial_rotary"]
    if "global_theta" in spec:
        rp[F]["rope_theta"] = spec["global_theta"]
    if "sliding_theta" in spec:
        rp[S]["rope_theta"] = spec["sliding_theta"]
    cfg.rope_parameters = rp
    return cfg


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.02 if p.dim() > 1 else 0.1
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                # Gemma 4 attends with scaling 1.0 over normed q and k: with weights near 1 the
                # scores have a spread of sqrt(head_dim), the softmax is nearly one-hot and the
                # logits move ~1e-3 for a 1e-7 change of the weights (measured with the double-
                # precision reference in tests/gemma4_property_test.cc). head_dim^-1/4 on both
                # norms keeps the spread near 1, so the fixtures carry more digits than 1e-4.
                p.mul_(p.numel() ** -0.25)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_((torch.rand(b.shape, generator=g) + 0.5).to(b.dtype))


def eager(model):
    try:
        model.set_attn_implementation("eager")
    except Exception as e:
        print("set_attn_implementation failed:", e, "- using config._attn_implementation")
        model.config._attn_implementation = "eager"
    return model


def run_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.logits[0].float().numpy()


def run_hidden(text_model, ids):
    with torch.no_grad():
        out = text_model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return out.last_hidden_state[0].float().numpy()


def describe(lm):
    """What HF built, layer by layer (the facts deg's config reader must reproduce)."""
    rows = []
    for i, layer in enumerate(lm.model.layers):
        a = layer.self_attn
        rows.append(dict(
            layer=i, type=lm.config.layer_types[i], head_dim=a.head_dim,
            q_out=a.q_proj.out_features, has_k=hasattr(a, "k_proj"),
            k_out=a.k_proj.out_features if hasattr(a, "k_proj") else None,
            shared=bool(getattr(a, "is_kv_shared_layer", False)),
            store_full=bool(getattr(a, "store_full_length_kv", False)),
            window=getattr(a, "sliding_window", None), scaling=getattr(a, "scaling", None),
            mlp=layer.mlp.gate_proj.out_features,
            scalar=float(layer.layer_scalar.flatten()[0])))
    rot = {}
    for name, buf in lm.model.rotary_emb.named_buffers():
        if name.endswith("_inv_freq") and "original" not in name:
            rot[name] = [float(x) for x in buf.flatten()]
    return rows, rot


def multimodal_save(lm, cfg, out_dir):
    """A Gemma4ForConditionalGeneration with a tiny vision tower around the text model's
    weights, saved: the real multimodal snapshot layout. Returns that model."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    mcfg = Gemma4Config(text_config=cfg.to_dict(), vision_config=vision, audio_config=None,
                        tie_word_embeddings=cfg.tie_word_embeddings)
    mm = Gemma4ForConditionalGeneration(mcfg).eval()
    missing = mm.model.language_model.load_state_dict(lm.model.state_dict(), strict=False)
    print("multimodal load_state_dict:", missing, flush=True)
    assert not missing.missing_keys, missing
    mm.save_pretrained(out_dir)
    return mm


def manual_save(lm, cfg, out_dir):
    """The multimodal layout without HF's multimodal class: text_config nested under a
    `gemma4` config, every `model.` key renamed to `model.language_model.`."""
    sd = {k: v.contiguous() for k, v in lm.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in sd.items()}
    save_file(renamed, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    top = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
           "text_config": json.loads(cfg.to_json_string()),
           "tie_word_embeddings": bool(cfg.tie_word_embeddings)}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(top, f, indent=2)


def dump_sources(out):
    os.makedirs(out, exist_ok=True)
    import importlib

    for mod in ("transformers.models.gemma4.modeling_gemma4",
                "transformers.models.gemma4.configuration_gemma4",
                "transformers.modeling_rope_utils", "transformers.masking_utils",
                "transformers.configuration_utils"):
        try:
            m = importlib.import_module(mod)
            with open(os.path.join(out, mod.split(".")[-1] + ".py"), "w") as f:
                f.write(inspect.getsource(m))
        except Exception as e:
            print("source of", mod, "failed:", repr(e), flush=True)
    try:
        with open(os.path.join(out, "default_text_config.json"), "w") as f:
            f.write(Gemma4TextConfig().to_json_string())
    except Exception as e:
        print("default config failed:", repr(e), flush=True)


def make_fixture(i, name, spec, out_root, rng):
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(100 + i)
    cfg = make_config(spec)
    lm = eager(Gemma4ForCausalLM(cfg)).float().eval()
    perturb(lm, 200 + i)
    if spec.get("bf16"):
        lm = lm.to(torch.bfloat16)
    layers, rot = describe(lm)
    for r in layers:
        print(name, r, flush=True)
    print(name, "rotary", json.dumps(rot), flush=True)
    ids = rng.integers(0, cfg.vocab_size, size=spec["tokens"], dtype=np.int64)

    manual = False
    model = lm
    if spec.get("multimodal"):
        try:
            model = eager(multimodal_save(lm, cfg, out_dir))
        except Exception:
            print(name, "Gemma4ForConditionalGeneration failed:", traceback.format_exc(), flush=True)
            manual = True
            for f in os.listdir(out_dir):
                os.remove(os.path.join(out_dir, f))
            manual_save(lm, cfg, out_dir)
            model = lm
    else:
        lm.save_pretrained(out_dir)

    # Reference in fp32 on CPU from the text model (the bf16 model's weights are bf16-exact).
    ref = eager(Gemma4ForCausalLM(lm.config)).eval()
    ref.load_state_dict({k: v.float() for k, v in lm.state_dict().items()})
    ref = ref.float()
    for (n1, b1), (n2, b2) in zip(ref.named_buffers(), lm.named_buffers()):
        assert n1 == n2
        if n1.endswith("layer_scalar"):
            assert torch.equal(b1, b2.float()), n1
    logits = run_logits(ref, ids)
    hidden = run_hidden(ref.model, ids)
    meta_extra = {}
    if spec.get("multimodal") and not manual:
        try:
            mm_logits = run_logits(model.float(), ids)
            d = float(np.abs(mm_logits - logits).max())
            print(name, "multimodal vs text-only HF max abs diff", d, flush=True)
            meta_extra["multimodal_vs_text_max_abs_diff"] = d
        except Exception:
            print(name, "multimodal forward failed:", traceback.format_exc(), flush=True)
    np.save(os.path.join(out_dir, "ids.npy"), ids)
    np.save(os.path.join(out_dir, "logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(out_dir, "hidden.npy"), hidden.astype(np.float32))
    if spec.get("bf16"):
        native = run_logits(lm, ids)
        np.save(os.path.join(out_dir, "logits_native_bf16.npy"), native.astype(np.float32))
        print(name, "native bf16 vs fp32 max abs diff", float(np.abs(native - logits).max()),
              flush=True)

    # The saved directory loads back in HF and gives the same logits.
    if not spec.get("multimodal"):
        back = eager(Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32)).eval()
        again = run_logits(back, ids)
        err = float(np.abs(again - logits).max())
        print(name, "reload max abs diff", err, flush=True)
        meta_extra["reload_max_abs_diff"] = err

    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    keys = sorted(tensors.keys())
    prefix = "model.language_model." if spec.get("multimodal") else "model."
    assert any(k.startswith(prefix + "layers.") for k in keys), keys[:5]
    with open(os.path.join(out_dir, "config.json")) as f:
        saved_cfg = json.load(f)
    param_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    if manual:
        param_names = {"model.language_model." + n[len("model."):] if n.startswith("model.") else n
                       for n in param_names}
    saved_buffers = {k: int(v.numel()) for k, v in tensors.items() if k not in param_names}
    meta = {
        "name": name,
        "model_type": saved_cfg.get("model_type"),
        "layout": "multimodal" if spec.get("multimodal") else "text",
        "layout_built_by_hand": manual,
        "dtype": "bf16" if spec.get("bf16") else "f32",
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "num_text_parameters": int(sum(p.numel() for p in lm.parameters())),
        "saved_buffers": saved_buffers,
        "tied": bool(cfg.tie_word_embeddings),
        "layer_types": list(cfg.layer_types),
        "layers": layers,
        "sliding_window": int(cfg.sliding_window),
        "tokens": int(len(ids)),
        "vocab_size": int(cfg.vocab_size),
        "hidden_size": int(cfg.hidden_size),
        "tensors": keys,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "reference": "HF Gemma4ForCausalLM fp32 CPU eager",
        **meta_extra,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(name, "params", meta["num_parameters"], "logits", logits.shape, "|logits|max",
          float(np.abs(logits).max()), "std", float(logits.std()), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sources")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    if args.sources:
        dump_sources(args.sources)
    failed = []
    for i, (name, spec) in enumerate(CONFIGS.items()):
        try:
            make_fixture(i, name, spec, args.out, np.random.default_rng(1234 + i))
        except Exception:
            print(name, "FAILED:", traceback.format_exc(), flush=True)
            failed.append(name)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print("done, total bytes", total, "failed", failed, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
