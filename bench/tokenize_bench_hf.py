#!/usr/bin/env python3
"""HF tokenizers (Python) peer for bench/tokenize_bench.cc on the GPU machine: the same corpus,
one thread (TOKENIZERS_PARALLELISM=false makes encode_batch run the documents one after another),
add_special_tokens=False, offsets included (as deg computes them).

usage: TOKENIZERS_PARALLELISM=false python3 bench/tokenize_bench_hf.py TOKENIZER.json CORPUS.jsonl [repeat]
"""
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def main():
    path, corpus = sys.argv[1], sys.argv[2]
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load_s = time.perf_counter() - t0
    docs = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                j = json.loads(line)
                docs.append(j if isinstance(j, str) else j.get("text", j.get("document")))
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))

    def best(fn):
        b = 1e30
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            b = min(b, time.perf_counter() - t)
        return b

    batch = best(lambda: tok.encode_batch(docs, add_special_tokens=False))
    single = best(lambda: [tok.encode(d, add_special_tokens=False) for d in docs])
    par = os.environ.get("TOKENIZERS_PARALLELISM")
    print(f"hf   load {load_s:.2f}s  docs {len(docs)}  {mb:.2f} MB  {tokens} tokens")
    print(f"hf   encode_batch (TOKENIZERS_PARALLELISM={par}): {mb / batch:8.2f} MB/s  {tokens / batch:10.0f} tokens/s")
    print(f"hf   encode per doc: {mb / single:8.2f} MB/s  {tokens / single:10.0f} tokens/s")


if __name__ == "__main__":
    main()
