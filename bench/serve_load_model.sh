#!/usr/bin/env bash
# Makes the tiny checkpoint the CPU load test of `deg serve` runs on (docs/serve.md, "Load
# test"), with deg's own commands: a byte-level BPE tokenizer of 512 tokens and a `gpt` trunk
# (the `tiny` preset: 48 wide, seconds of training) on the example documents, then fresh heads
# (`deg init`). The figures measure the server, not the model: its answers are random.
#   bench/serve_load_model.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=${1:?usage: serve_load_model.sh BUILD_DIR OUT_DIR}
out=${2:?usage: serve_load_model.sh BUILD_DIR OUT_DIR}
deg="$build/deg"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$out.work"
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 50); do cat "$root"/examples/*.txt; echo "<|endoftext|>"; done > "$work/train.txt"
cat "$root"/examples/*.txt > "$work/val.txt"
"$deg" tokenizer train --vocab 512 --out "$work/tok" --quiet "$work/train.txt"
"$deg" shard --tokenizer "$work/tok" --out "$work/data" --val "$work/val.txt" "$work/train.txt"
"$deg" pretrain --config tiny --data "$work/data" --steps 20 --out "$work/trunk" \
  --batch-tokens 256 --max-seq-len 128 --val-tokens 128 --quiet
"$deg" init --base "$work/trunk" --out "$out"
rm -rf "$work"
