#!/usr/bin/env bash
# One-off: deg bench before (bench-old = 01c4c8b) and after (working tree) the op interface.
set -uo pipefail
lib=/opt/degroot/usr/lib/x86_64-linux-gnu
scripts/device-build build-new deg_cli > $OUT/build-new.log 2>&1 || { tail -30 $OUT/build-new.log; exit 1; }
(cd bench-old && ln -sfn ../.devdeps .devdeps && scripts/device-build build-old deg_cli) > $OUT/build-old.log 2>&1 || { tail -30 $OUT/build-old.log; exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu.txt
run() {  # which family extra...
  local which=$1 fam=$2; shift 2
  local bin=build-new/deg; [[ $which == old ]] && bin=bench-old/build-old/deg
  LD_LIBRARY_PATH=$lib $bin bench --family $fam --prefill 512,2048 --peak-seconds 1 "$@" \
    --json $OUT/$fam-$which.json > $OUT/$fam-$which.txt 2>&1
  echo "== $fam $which"; grep -E "tok/s|ms" $OUT/$fam-$which.txt | head -12
}
for fam in qwen3_5 lfm2; do run old $fam; run new $fam; done
run old gemma4 --layers 10; run new gemma4 --layers 10
