#!/usr/bin/env bash
# The tokenizer benchmark on the GPU machine (16 quiet cores), where HF tokenizers' Python
# package is installed: builds tokenize_bench from a source tarball against the carried Debian
# packages (as scripts/device-build does), then runs deg and HF over the same corpora.
# carry: .devdeps .cache/tokenizers-carry.tar.xz .cache/tokbench-src.tar.gz .cache/bench_emails.jsonl
#        .cache/bench_multi.jsonl      (see docs/tokenizer.md for how they are made)
set -euo pipefail
cd "$(dirname "$0")/.."
root=/opt/degroot
arch=x86_64-linux-gnu
mkdir -p "$root"
for f in .devdeps/*.deb; do dpkg -x "$f" "$root"; done
grep -rlI --include='*.pc' --include='*.cmake' '/usr' "$root/usr" 2>/dev/null |
  xargs -r sed -i "s#\([\"= ]\)/usr\([/\"]\)#\1$root/usr\2#g; s#^prefix=/usr#prefix=$root/usr#"
export PKG_CONFIG_PATH=$root/usr/lib/$arch/pkgconfig:$root/usr/share/pkgconfig
export LD_LIBRARY_PATH=$root/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
src=/tmp/tokbench-src
mkdir -p "$src" /tmp/tok
tar xzf .cache/tokbench-src.tar.gz -C "$src"
tar xJf .cache/tokenizers-carry.tar.xz -C /tmp/tok
cmake -S "$src" -B /tmp/tokbench-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEG_CUDA=OFF \
  -DDEG_BUILD_TESTS=OFF -DDEG_BUILD_BENCH=ON -DCMAKE_PREFIX_PATH="$root/usr;$root/usr/lib/$arch/cmake" \
  -DCMAKE_INCLUDE_PATH="$root/usr/include" -DCMAKE_LIBRARY_PATH="$root/usr/lib/$arch" >/dev/null
cmake --build /tmp/tokbench-build -j "$(nproc)" --target tokenize_bench >/dev/null
lscpu | grep -E "Model name|^CPU\(s\)"
for corpus in emails multi; do
  for name in qwen3 gemma3 llama3 deepseek_v3 gptoss; do
    echo "== $corpus $name"
    /tmp/tokbench-build/bench/tokenize_bench --model /tmp/tok/$name --corpus .cache/bench_$corpus.jsonl --repeat 3
    TOKENIZERS_PARALLELISM=false python3 bench/tokenize_bench_hf.py /tmp/tok/$name/tokenizer.json .cache/bench_$corpus.jsonl 3
  done
done
