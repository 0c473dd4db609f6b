#!/usr/bin/env bash
# Makes the tiny checkpoint the load test of `deg serve` runs on (docs/serve.md, "Load test"),
# on the CPU and on CUDA alike: the random 2-layer Qwen3.5 of the golden fixtures
# (tests/fixtures/qwen35/fl_tied: hidden 64, vocab 512) with a byte-level BPE tokenizer of 512
# tokens trained by `deg tokenizer train` on the example documents (ChatML's special tokens
# included), then fresh heads (`deg init`). The figures measure the server, not the model: its
# answers are noise.
#   bench/serve_load_model.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=${1:?usage: serve_load_model.sh BUILD_DIR OUT_DIR}
out=${2:?usage: serve_load_model.sh BUILD_DIR OUT_DIR}
deg="$build/deg"
root="$(cd "$(dirname "$0")/.." && pwd)"
fixture="$root/tests/fixtures/qwen35/fl_tied"
base="$out.base"
rm -rf "$base" && mkdir -p "$base"
cp "$fixture/config.json" "$fixture/generation_config.json" "$fixture/model.safetensors" "$base/"
for i in $(seq 1 50); do cat "$root"/examples/*.txt; done > "$base/corpus.txt"
"$deg" tokenizer train --vocab 512 --out "$base" --quiet --special '<|endoftext|>' \
  --special '<|im_start|>' --special '<|im_end|>' "$base/corpus.txt"
"$deg" init --base "$base" --out "$out"
rm -rf "$base"
