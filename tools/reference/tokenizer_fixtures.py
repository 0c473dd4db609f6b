#!/usr/bin/env python3
"""Expected tokenizer outputs from HF `tokenizers` (the reference deg's src/text must match).

Runs on the GPU machine (tokenizers 0.23 is installed there; PyPI is not reachable here). For
each of the five real tokenizer.json files (fetched by scripts/fetch-test-data) and each variant
in tests/fixtures/tokenizers/variants.json (a real file with some top-level sections replaced,
to exercise normalizers / pre-tokenizers / decoders / added-token options the real files do not
use), it encodes every text of corpus.jsonl with

    tokenizer.encode(text, add_special_tokens=False)

and records ids and offsets. Offsets: HF's Python binding calls encode_char_offsets, so they
are indices into the Python str, i.e. Unicode code points (not bytes, not UTF-16 units).

Files written to --out:
  expected_<config>.jsonl  one line per corpus text: {"ids": [...], "offsets": [...]} where the
                           offsets are stored compactly: an int L means [prev_end, prev_end + L],
                           a pair [s, e] is given as is; prev_end starts at 0 and becomes e.
  decode_<config>.jsonl    {"ids": [...], "skip_special": bool, "text": tokenizer.decode(...)}
  meta.json                versions and counts.

usage (device): python3 tools/reference/tokenizer_fixtures.py --cache DIR --out DIR
  DIR/<name>/tokenizer.json, or --cache-tar FILE.tar.xz holding <name>/tokenizer.json.
"""

import argparse
import json
import pathlib
import random
import sys
import tarfile
import tempfile
import zlib

import tokenizers
from tokenizers import Tokenizer

NAMES = ["qwen3", "gemma3", "llama3", "deepseek_v3", "gptoss"]
# Token strings whose decoding is interesting when they exist (byte fallback, partial UTF-8
# bytes in byte-level alphabets, metaspace markers).
PROBE_TOKENS = ["<0xE2>", "<0x82>", "<0xAC>", "<0x41>", "<0xFF>", "<0x0A>", "\u2581", "\u0120",
                "\u00e2\u0124", "\u00ac", "\u00f0\u0141", "\u010a"]


def compact(offsets):
    out, prev = [], 0
    for s, e in offsets:
        out.append(e - s if s == prev else [s, e])
        prev = e
    return out


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        return [line for line in f.read().split("\n") if line]


def configs(cache, variants):
    base = {}
    for name in NAMES:
        text = (cache / name / "tokenizer.json").read_text(encoding="utf-8")
        base[name] = text
        yield name, text
    for v in variants:
        j = json.loads(base[v["base"]])
        for key, value in v.get("set", {}).items():
            j[key] = value
        j["added_tokens"] = j.get("added_tokens", []) + v.get("add_tokens", [])
        yield v["name"], json.dumps(j, ensure_ascii=False)


def decode_cases(name, tok, encodings):
    cases = []
    for i, enc in enumerate(encodings):
        if i % 10 == 0:
            cases.append((enc, True))
        elif i % 10 == 1:
            cases.append((enc, False))
    rng = random.Random(zlib.crc32(name.encode()))
    size = tok.get_vocab_size(with_added_tokens=True)
    for k in range(6):
        cases.append(([rng.randrange(size) for _ in range(40)], k % 2 == 0))
    probes = [tok.token_to_id(t) for t in PROBE_TOKENS]
    probes = [p for p in probes if p is not None]
    if probes:
        cases.append((probes, True))
        for _ in range(4):
            cases.append(([rng.choice(probes) for _ in range(12)], True))
    cases.append(([], True))
    cases.append(([size + 5, 0, size + 1000], True))  # unknown ids are skipped
    return cases


def main():
    ap = argparse.ArgumentParser()
    here = pathlib.Path(__file__).resolve().parent
    fixtures = here.parent.parent / "tests/fixtures/tokenizers"
    ap.add_argument("--cache", default=str(here.parent.parent / ".cache/tokenizers"))
    ap.add_argument("--cache-tar", default="")
    ap.add_argument("--fixtures", default=str(fixtures))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    cache = pathlib.Path(args.cache)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cache_tar:
        cache = pathlib.Path(tempfile.mkdtemp())
        with tarfile.open(args.cache_tar) as tar:
            tar.extractall(cache)
    fixtures = pathlib.Path(args.fixtures)
    texts = [json.loads(line) for line in read_lines(fixtures / "corpus.jsonl")]
    variants = json.loads((fixtures / "variants.json").read_text(encoding="utf-8"))

    meta = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
            "texts": len(texts), "configs": {}}
    for name, text in configs(cache, variants):
        tok = Tokenizer.from_str(text)
        encodings = []
        with open(out / f"expected_{name}.jsonl", "w", encoding="utf-8") as f:
            for t in texts:
                enc = tok.encode(t, add_special_tokens=False)
                encodings.append(list(enc.ids))
                f.write(json.dumps({"ids": enc.ids, "offsets": compact(enc.offsets)},
                                   separators=(",", ":")) + "\n")
        n_decode = 0
        with open(out / f"decode_{name}.jsonl", "w", encoding="utf-8") as f:
            for ids, skip in decode_cases(name, tok, encodings):
                text_out = tok.decode(ids, skip_special_tokens=skip)
                f.write(json.dumps({"ids": ids, "skip_special": skip, "text": text_out},
                                   ensure_ascii=False, separators=(",", ":")) + "\n")
                n_decode += 1
        meta["configs"][name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                 "tokens": sum(len(e) for e in encodings), "decodes": n_decode}
        print(name, meta["configs"][name], flush=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
