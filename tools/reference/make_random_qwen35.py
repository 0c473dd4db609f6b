"""A tiny random Qwen3.5 HF snapshot with a real tokenizer, made by HF transformers itself (runs on
the GPU machine): the base model of the README's worked example and a check that deg reads a
genuine save_pretrained output with a full-size vocabulary.

Writes OUT/config.json, OUT/model.safetensors (bf16), OUT/tokenizer.json (copied) and
OUT/meta.json (num_parameters as PyTorch counts them).

Usage: python3 make_random_qwen35.py --tokenizer PATH/tokenizer.json --out OUT [--seed N]
"""

import argparse
import json
import os
import shutil

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.tokenizer) as f:
        tok = json.load(f)
    vocab = len(tok["model"]["vocab"]) + sum(
        1 for t in tok.get("added_tokens", []) if t["content"] not in tok["model"]["vocab"])
    vocab = max(vocab, max(t["id"] for t in tok.get("added_tokens", [])) + 1)
    torch.manual_seed(args.seed)
    cfg = Qwen3_5TextConfig()
    L, F = "linear_attention", "full_attention"
    for k, v in dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                     linear_value_head_dim=8, linear_conv_kernel_dim=4,
                     layer_types=[L, L, L, F], tie_word_embeddings=True).items():
        setattr(cfg, k, v)
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = model.to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    shutil.copy(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    meta = {"num_parameters": sum(p.numel() for p in model.parameters()), "vocab_size": vocab,
            "seed": args.seed, "transformers": __import__("transformers").__version__}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
