#!/usr/bin/env python3
"""HF `tokenizers` as the reference for `deg tokenizer train` and for encoding with its output.

The golden side of tests/tokenizer_train_test.cc (TokenizerTrainGolden). The fixture directory
tests/fixtures/tokenizers/trained_bpe holds

  train.txt       the training text: README.md, docs/tokenizer.md, docs/training.md of commit
                  90a89ae, concatenated
  heldout.jsonl   held-out texts, one JSON string per line: every third text of
                  tests/fixtures/tokenizers/corpus.jsonl (unicode, numbers, whitespace runs,
                  newlines, special-token strings, code)
  tokenizer.json  what `deg tokenizer train --vocab 1000 --out DIR train.txt` wrote

This script, run where `tokenizers` is installed (the GPU machine: PyPI is not reachable here):

1. trains HF's own BpeTrainer on train.txt with deg's settings (ByteLevel pre-tokenizer without
   prefix space, the 256-character byte alphabet, min_frequency 2, <|endoftext|> special, the
   text cut at that token as deg cuts it; deg's post-processor and decoder sections) and writes
   hf_tokenizer.json, which the test compares with deg's tokenizer.json as JSON;
2. loads tokenizer.json (HF's trained one when the directory has none) and, for every held-out
   text, records

       enc = tokenizer.encode(text, add_special_tokens=False)
       {"ids": enc.ids, "offsets": compact(enc.offsets),
        "decoded": tokenizer.decode(enc.ids, skip_special_tokens=False)}

   in expected.jsonl. Offsets are code points (HF's Python binding), stored compactly as in
   tokenizer_fixtures.py: an int L is [prev_end, prev_end + L], a pair [s, e] is given as is;
3. writes meta.json (versions, vocabulary size, token count, HF's training time).

usage: python3 tools/reference/bpe_tokenizer_reference.py --out DIR [--fixtures DIR] [--vocab N]
"""

import argparse
import json
import pathlib
import platform
import time

import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tokenizer_fixtures import compact  # beside this script

SPECIAL = "<|endoftext|>"
# deg's post_processor and decoder sections (src/text/bpe_train.cc, bpe_tokenizer_json).
DEG_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": True}


def hf_train(text_path, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(text_path, encoding="utf-8", errors="replace", newline="") as f:
        segments = f.read().split(SPECIAL)
    start = time.perf_counter()
    tok.train_from_iterator(segments, trainer)
    seconds = time.perf_counter() - start
    j = json.loads(tok.to_str())
    j["post_processor"] = DEG_BYTE_LEVEL
    j["decoder"] = DEG_BYTE_LEVEL
    return Tokenizer.from_str(json.dumps(j)), seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default="tests/fixtures/tokenizers/trained_bpe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=1000)
    args = ap.parse_args()
    fixtures, out = pathlib.Path(args.fixtures), pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    trained, train_s = hf_train(fixtures / "train.txt", args.vocab)
    trained.save(str(out / "hf_tokenizer.json"), pretty=False)
    ours = fixtures / "tokenizer.json"
    tok = Tokenizer.from_file(str(ours)) if ours.exists() else trained

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
            "encoded_with": "tokenizer.json" if ours.exists() else "hf_tokenizer.json",
            "vocab_size": tok.get_vocab_size(with_added_tokens=True), "texts": len(texts),
            "tokens": tokens, "hf_train_s": round(train_s, 3)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
