#!/usr/bin/env python3
"""What HF `tokenizers` makes of held-out text with a tokenizer.json that deg's trainer wrote.

The golden side of tests/tokenizer_train_test.cc (TokenizerTrainGolden): the fixture directory
tests/fixtures/tokenizers/trained_bpe holds

  train.txt       the training text (README.md and three docs/*.md, concatenated)
  tokenizer.json  `deg tokenizer train --vocab 1000 --out DIR train.txt` (DIR/tokenizer.json)
  heldout.jsonl   one JSON string per line: texts not in train.txt (unicode, numbers, whitespace
                  runs, newlines, special tokens, code)

and this script, run where `tokenizers` is installed (the GPU machine: PyPI is not reachable
here), loads that tokenizer.json with HF's loader and, for every held-out text, records

    enc = tokenizer.encode(text, add_special_tokens=False)
    {"ids": enc.ids, "offsets": compact(enc.offsets),
     "decoded": tokenizer.decode(enc.ids, skip_special_tokens=False)}

Offsets are code points (HF's Python binding), stored compactly as in tokenizer_fixtures.py: an
int L is [prev_end, prev_end + L], a pair [s, e] is given as is.

Files written to --out: expected.jsonl (one line per held-out text) and meta.json (versions,
vocabulary size, token count). Copy both into the fixture directory.

With --train-vocab N it also trains HF's own BpeTrainer on train.txt with deg's settings (ByteLevel
pre-tokenizer without prefix space, the 256-character byte alphabet, min_frequency 2,
<|endoftext|> special, the text cut at that token as deg cuts it) and writes hf_tokenizer.json,
so that deg's vocabulary and merges can be compared with HF's. A fixture directory without a
tokenizer.json then has its held-out texts encoded with HF's trained tokenizer.

usage: python3 tools/reference/bpe_tokenizer_reference.py --out DIR [--fixtures DIR]
           [--train-vocab N]
"""

import argparse
import json
import pathlib
import platform
import time

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = "<|endoftext|>"


def compact(offsets):
    out, prev = [], 0
    for s, e in offsets:
        out.append(e - s if s == prev else [s, e])
        prev = e
    return out


def hf_train(text_path, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(text_path, encoding="utf-8", errors="replace", newline="") as f:
        segments = f.read().split(SPECIAL)
    start = time.perf_counter()
    tok.train_from_iterator(segments, trainer)
    return tok, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default="tests/fixtures/tokenizers/trained_bpe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-vocab", type=int, default=0)
    args = ap.parse_args()
    fixtures, out = pathlib.Path(args.fixtures), pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    hf_trained, hf_train_s = None, None
    if args.train_vocab:
        hf_trained, hf_train_s = hf_train(fixtures / "train.txt", args.train_vocab)
        hf_trained.save(str(out / "hf_tokenizer.json"))
    ours = fixtures / "tokenizer.json"
    tok = Tokenizer.from_file(str(ours)) if ours.exists() else hf_trained
    with open(fixtures / "heldout.jsonl", encoding="utf-8", newline="") as f:
        texts = [json.loads(line) for line in f.read().split("\n") if line]

    tokens = 0
    with open(out / "expected.jsonl", "w", encoding="utf-8", newline="") as f:
        for text in texts:
            enc = tok.encode(text, add_special_tokens=False)
            tokens += len(enc.ids)
            line = {"ids": enc.ids, "offsets": compact(enc.offsets),
                    "decoded": tok.decode(enc.ids, skip_special_tokens=False)}
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")

    meta = {"tokenizers": tokenizers.__version__, "python": platform.python_version(),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True), "texts": len(texts),
            "tokens": tokens}
    if hf_train_s is not None:
        meta["hf_train_s"] = hf_train_s
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
