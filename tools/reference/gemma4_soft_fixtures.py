"""Golden fixture for deg's soft tokens (media parts given as precomputed embeddings) on Gemma 4,
made with HF transformers' Gemma4ForConditionalGeneration (runs on the GPU machine).

HF merges media into the text stream in Gemma4Model.forward: placeholder ids (image_token_id /
audio_token_id) are replaced by the text pad id for the token embedding and the per-layer
embedding lookup, then the encoder's features overwrite the embeddings at those positions
(masked_scatter), and the per-layer projection reads the merged embeddings. This script runs that
code unchanged: the vision / audio encoders are replaced by functions that return fixed features,
so the merge, masks and per-layer inputs are HF's own.

Writes tests/fixtures/gemma4/<name>/ (multimodal snapshot layout):
  config.json, model.safetensors   save_pretrained of Gemma4ForConditionalGeneration
  ids.npy                          int64 [T] ids with placeholder runs wrapped in their markers
  soft.npy                         float32 [n, C] the media features, in placeholder order
  logits.npy                       float32 [T, V] HF logits (soft-capped), fp32 CPU eager
  meta.json                        token ids used, what was merged

Usage: python3 gemma4_soft_fixtures.py --out DIR
"""

import argparse
import json
import os
import sys
import types

import numpy as np
import torch

import transformers
from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma4_fixtures import S, F, eager, make_config, perturb  # noqa: E402

SPEC = dict(
    vocab_size=256, hidden_size=32, intermediate_size=48, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=16,
    layer_types=[S, S, F, S, F], num_kv_shared_layers=1, hidden_size_per_layer_input=8,
    use_double_wide_mlp=False, final_logit_softcapping=3.0, tokens=0)
# Marker and placeholder ids inside the tiny vocabulary; the text pad id is not 0 so a reader
# that looks up the wrong id at soft positions shows.
TOKENS = dict(boi_token_id=250, eoi_token_id=251, image_token_id=252, boa_token_id=253,
              eoa_token_index=254, audio_token_id=255, video_token_id=249)
PAD = 5


def build_ids(rng, image_runs, audio_run):
    """Text, an image, text, an audio clip, text, the second image, text."""
    def text(n):
        return list(rng.integers(6, 240, size=n))
    ids = text(21)
    ids += [TOKENS["boi_token_id"]] + [TOKENS["image_token_id"]] * image_runs[0] + [TOKENS["eoi_token_id"]]
    ids += text(9)
    if audio_run:
        ids += [TOKENS["boa_token_id"]] + [TOKENS["audio_token_id"]] * audio_run + [TOKENS["eoa_token_index"]]
    ids += text(14)
    ids += [TOKENS["boi_token_id"]] + [TOKENS["image_token_id"]] * image_runs[1] + [TOKENS["eoi_token_id"]]
    ids += text(30)
    return np.array(ids, dtype=np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    print("torch", torch.__version__, "transformers", transformers.__version__, flush=True)

    torch.manual_seed(77)
    cfg = make_config(SPEC)
    cfg.pad_token_id = PAD
    lm = eager(Gemma4ForCausalLM(cfg)).float().eval()
    perturb(lm, 78)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    # A tiny audio tower too, so the saved config names both encoders (deg offers a media kind
    # only when the snapshot has its encoder's config).
    audio = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 subsampling_conv_channels=[8, 4], conv_kernel_size=3, output_proj_dims=16)
    try:
        mcfg = Gemma4Config(text_config=cfg.to_dict(), vision_config=vision, audio_config=audio,
                            tie_word_embeddings=cfg.tie_word_embeddings, **TOKENS)
        mm = Gemma4ForConditionalGeneration(mcfg).eval()
    except Exception as e:
        print("tiny audio tower failed:", repr(e), flush=True)
        raise
    missing = mm.model.language_model.load_state_dict(lm.model.state_dict(), strict=False)
    assert not missing.missing_keys, missing
    mm = eager(mm)

    rng = np.random.default_rng(91)
    C = cfg.hidden_size
    image_runs = (12, 7)
    image_feats = torch.tensor(rng.standard_normal((sum(image_runs), C)) * 0.5, dtype=torch.float32)
    audio_n = 5
    audio_feats = torch.tensor(rng.standard_normal((audio_n, C)) * 0.5, dtype=torch.float32)

    def fake_image_features(pixel_values, image_position_ids=None, **kw):
        return types.SimpleNamespace(pooler_output=[image_feats[:image_runs[0]], image_feats[image_runs[0]:]])

    def fake_audio_features(input_features, input_features_mask, **kw):
        return types.SimpleNamespace(pooler_output=audio_feats[None],
                                     attention_mask=torch.ones(1, audio_n, dtype=torch.bool))

    mm.model.get_image_features = fake_image_features
    mm.model.get_audio_features = fake_audio_features

    with_audio = True
    ids = build_ids(rng, image_runs, audio_n)
    try:
        out = mm(input_ids=torch.tensor(ids)[None], pixel_values=torch.zeros(2, 1, 1),
                 input_features=torch.zeros(1, 1, 1),
                 input_features_mask=torch.ones(1, 1, dtype=torch.bool), use_cache=False)
    except Exception as e:  # this transformers routes audio differently: images only
        print("audio merge failed:", repr(e), "- writing an image-only fixture", flush=True)
        with_audio = False
        ids = build_ids(np.random.default_rng(91), image_runs, 0)
        out = mm(input_ids=torch.tensor(ids)[None], pixel_values=torch.zeros(2, 1, 1),
                 use_cache=False)
    logits = out.logits[0].float().numpy()

    # The features really entered: the same ids with other features give other logits.
    saved = image_feats.clone()
    image_feats.mul_(-1.0)
    kw = dict(input_features=torch.zeros(1, 1, 1),
              input_features_mask=torch.ones(1, 1, dtype=torch.bool)) if with_audio else {}
    other = mm(input_ids=torch.tensor(ids)[None], pixel_values=torch.zeros(2, 1, 1),
               use_cache=False, **kw).logits[0].float().numpy()
    image_feats.copy_(saved)
    moved = float(np.abs(other - logits).max() / np.abs(logits).max())
    print("negated image features move the logits by", moved, flush=True)
    assert moved > 1e-2

    name = "soft_media"
    out_dir = os.path.join(args.out, name)
    os.makedirs(out_dir, exist_ok=True)
    mm.save_pretrained(out_dir)
    for f in ("generation_config.json",):
        p = os.path.join(out_dir, f)
        if os.path.exists(p):
            os.remove(p)
    soft = [image_feats[:image_runs[0]]]
    if with_audio:
        soft.append(audio_feats)
    soft.append(image_feats[image_runs[0]:])
    np.save(os.path.join(out_dir, "ids.npy"), ids)
    np.save(os.path.join(out_dir, "soft.npy"), torch.cat(soft).numpy().astype(np.float32))
    np.save(os.path.join(out_dir, "logits.npy"), logits.astype(np.float32))
    meta = {"name": name, "tokens": TOKENS, "pad_token_id": PAD, "image_runs": list(image_runs),
            "audio_run": audio_n if with_audio else 0, "tokens_total": int(len(ids)),
            "negated_images_move_logits": moved, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "reference": "HF Gemma4ForConditionalGeneration fp32 CPU eager, encoders replaced "
                         "by fixed features"}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    with open(os.path.join(out_dir, "config.json")) as f:
        saved_cfg = json.load(f)
    print("config root keys", sorted(saved_cfg.keys()), flush=True)
    print(name, "T", len(ids), "audio", with_audio, "|logits|max", float(np.abs(logits).max()),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
