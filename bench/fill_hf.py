"""The peer of bench/fill_bench (issue 13): HF transformers' Qwen3.5 at Qwen3.5-0.8B dims with
random bf16 weights, on the same GPU, writing the filled JSON the way a user of a generative
extractor would get it — the document and the schema as the prompt, the JSON text generated
token by token (greedy, with the KV / recurrent cache) — as a pip user gets transformers (its
PyTorch fallbacks for the linear attention and the conv).

Random weights cannot write the JSON, so the work is pinned instead: the prompt is as many
tokens as the document plus the schema text under the same tokenizer, and generation runs
exactly as many new tokens as fill_bench's filled JSON of its document 0 has (min_new_tokens =
max_new_tokens). Prints one JSON object: the GPU, the token counts, the median seconds of
--repeats generations after a warm-up, and (with --deg FILE, fill_bench's --json output) the
ratio of that time to deg's single-document fill.

Usage (on the GPU machine):
  python3 bench/fill_hf.py --deg fill.json --tokenizer .cache/tokenizers/qwen3/tokenizer.json
"""

import argparse
import json
import statistics
import time

import torch
from tokenizers import Tokenizer

from qwen35_hf import qwen35_08b_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deg", required=True, help="fill_bench --json output")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--schema", default="bench/fill_schema.json")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from transformers import Qwen3_5ForCausalLM

    deg = json.load(open(args.deg))
    tok = Tokenizer.from_file(args.tokenizer)
    schema_text = open(args.schema).read()
    prompt_tokens = deg["document_tokens"] + len(tok.encode(schema_text).ids)
    new_tokens = len(tok.encode(deg["output_json"]).ids)

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(qwen35_08b_config()).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), device="cuda",
                        generator=gen)

    def generate(n):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       min_new_tokens=n, max_new_tokens=n, use_cache=True, pad_token_id=0)

    with torch.inference_mode():
        generate(8)  # warm-up
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            generate(new_tokens)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "seconds": s,
           "ms_per_new_token": 1e3 * s / new_tokens}
    if "one_document_40_fields_ms" in deg:
        out["deg_one_document_40_fields_ms"] = deg["one_document_40_fields_ms"]
        out["ratio_hf_over_deg"] = 1e3 * s / deg["one_document_40_fields_ms"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
