"""The peer of `deg bench --device cuda`: HF transformers' Qwen3.5 at Qwen3.5-0.8B dims with random
bf16 weights on the same GPU, as a pip user gets it (no flash-linear-attention / causal-conv1d
packages: transformers' PyTorch fallbacks), timed the same way — the median of REPEATS runs after
one warm-up, each run synchronised.

Prints one JSON object: the GPU, and per prefill length the tokens per second; a decode step of
one row (greedy, with the KV / recurrent cache) after a prompt.

Usage (on the GPU machine): python3 bench/qwen35_hf.py [--prefill 512,2048,4096] [--repeats 5]
"""

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def qwen35_08b_config():
    # The dims of Qwen3.5-0.8B (deg's Qwen35Config::preset("0.8b")).
    c = Qwen3_5TextConfig()
    c.vocab_size = 248320
    c.hidden_size = 1024
    c.intermediate_size = 3584
    c.num_hidden_layers = 24
    c.num_attention_heads = 8
    c.num_key_value_heads = 2
    c.head_dim = 256
    c.linear_num_key_heads = 16
    c.linear_num_value_heads = 16
    c.linear_key_head_dim = 128
    c.linear_value_head_dim = 128
    c.linear_conv_kernel_dim = 4
    c.layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(24)]
    c.tie_word_embeddings = True
    c.rope_parameters = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    return c


def median_seconds(repeats, fn):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", default="512,2048,4096")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-prompt", type=int, default=2048)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(qwen35_08b_config()).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "params": sum(p.numel() for p in model.parameters()), "prefill": []}
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for n in [int(x) for x in args.prefill.split(",")]:
            ids = torch.randint(0, vocab, (1, n), device="cuda", generator=gen)
            # The backbone only (deg's prefill returns final-norm hidden states, no LM head).
            dt = median_seconds(args.repeats, lambda: model.model(input_ids=ids, use_cache=False))
            out["prefill"].append({"tokens": n, "tok_per_s": n / dt, "ms": 1e3 * dt})
        ids = torch.randint(0, vocab, (1, args.decode_prompt), device="cuda", generator=gen)
        first = model.model(input_ids=ids, use_cache=True)
        cache = first.past_key_values
        nxt = torch.randint(0, vocab, (1, 1), device="cuda", generator=gen)

        def step():
            model.model(input_ids=nxt, past_key_values=cache, use_cache=True)

        # Each step extends the cache by one position: a few steps, timed together.
        steps = 8
        dt = median_seconds(args.repeats, lambda: [step() for _ in range(steps)])
        out["decode"] = {"rows": 1, "prompt": args.decode_prompt, "step_ms": 1e3 * dt / steps}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
