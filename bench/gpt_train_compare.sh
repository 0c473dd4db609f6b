#!/usr/bin/env bash
# deg pretrain beside PyTorch's reference (tools/reference/gpt_train_reference.py) on the same
# shards, seeds and schedule, on one GPU: the validation loss at equal tokens and the tokens/s of
# each run (issue 14's Done-when). Run on the GPU machine from the repository root, after
# `scripts/device-build build-device deg` (or give --deg).
#
# Data: data/corpus/ (committed) decompressed; every 20th document of every source is held out
# for validation; a byte-level BPE of --vocab tokens is trained on the rest (`deg tokenizer
# train`) and both sets are sharded (`deg shard`). Runs: for each config and seed, deg (bf16) and
# the reference, the same --steps (both schedules span them), --batch-tokens, --max-seq-len,
# --val-every and --val-tokens. --concurrent starts a config's runs together on the one GPU (its
# memory permitting): the losses at equal tokens do not depend on speed, but the tokens/s then
# do, so the speed table is only meaningful for runs made alone.
#
# usage: bench/gpt_train_compare.sh [--configs "small speedrun-124m-1gpu"] [--seeds "1 2"]
#          [--steps 1500] [--batch-tokens 49152] [--max-seq-len 1024] [--vocab 32768]
#          [--val-every 250] [--val-tokens 131072] [--out DIR] [--deg PATH] [--concurrent]
#          [--device cuda|cpu]   (cpu: deg's runs only — the reference needs a GPU — for trying it)
set -euo pipefail

configs="small speedrun-124m-1gpu"
seeds="1 2"
steps=1500
batch=49152
seq=1024
vocab=32768
val_every=250
val_tokens=131072
out=${OUT:-/tmp/gpt_compare}
deg=build-device/deg
concurrent=0
device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --configs) configs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch-tokens) batch=$2; shift 2 ;;
    --max-seq-len) seq=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --val-every) val_every=$2; shift 2 ;;
    --val-tokens) val_tokens=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deg) deg=$2; shift 2 ;;
    --concurrent) concurrent=1; shift ;;
    --device) device=$2; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "gpt_train_compare: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
[ -x "$deg" ] || { echo "gpt_train_compare: no deg binary at $deg (build it, or give --deg)" >&2; exit 1; }
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

data=$out/data
if [ ! -f "$data/shards/data.json" ]; then
  mkdir -p "$data/text"
  for f in data/corpus/*.txt.zst; do zstd -dcq "$f" > "$data/text/$(basename "$f" .zst)"; done
  python3 - "$data/text" "$data/train.txt" "$data/val.txt" <<'EOF'
import glob, os, sys
src, train, val = sys.argv[1:4]
sep = "<|endoftext|>"
with open(train, "w", encoding="utf-8") as t, open(val, "w", encoding="utf-8") as v:
    for path in sorted(glob.glob(os.path.join(src, "*.txt"))):
        docs = [d for d in open(path, encoding="utf-8").read().split(sep) if d.strip()]
        for i, d in enumerate(docs):
            (v if i % 20 == 19 else t).write(d + sep)
EOF
  "$deg" tokenizer train --quiet --vocab "$vocab" --out "$data/tok" "$data/train.txt"
  "$deg" shard --tokenizer "$data/tok" --out "$data/shards" --val "$data/val.txt" "$data/train.txt"
  say "data: $(cat "$data/shards/data.json")"
fi

run_deg() {  # config seed
  "$deg" pretrain --quiet --config "$1" --seed "$2" --data "$data/shards" --device "$device" \
    --precision bf16 --steps "$steps" --batch-tokens "$batch" --max-seq-len "$seq" \
    --val-every "$val_every" --val-tokens "$val_tokens" --out "$out/deg_$1_$2" \
    > "$out/deg_$1_$2.log" 2>&1
}
run_ref() {
  [ "$device" = cuda ] || return 0
  python3 tools/reference/gpt_train_reference.py --config "$1" --seed "$2" --data "$data/shards" \
    --steps "$steps" --batch-tokens "$batch" --max-seq-len "$seq" --val-every "$val_every" \
    --val-tokens "$val_tokens" --out "$out/ref_$1_$2" > "$out/ref_$1_$2.json" 2> "$out/ref_$1_$2.err"
}
for c in $configs; do
  pids=()
  for s in $seeds; do
    if [ "$concurrent" = 1 ]; then
      run_deg "$c" "$s" & pids+=($!)
      run_ref "$c" "$s" & pids+=($!)
    else
      run_deg "$c" "$s" || say "deg $c seed $s failed: $(tail -2 "$out/deg_${c}_$s.log")"
      say "deg $c seed $s done"
      run_ref "$c" "$s" || say "reference $c seed $s failed: $(tail -2 "$out/ref_${c}_$s.err")"
      say "reference $c seed $s done"
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || say "a run of $c failed (see $out)"; done
done

# The table: validation loss at each validation step both runs of a (config, seed) reached, the
# relative difference, and each run's tokens/s.
python3 - "$out" "$configs" "$seeds" <<'EOF'
import json, os, sys
out, configs, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def read(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows
print(f"{'config':<20} {'seed':>4} {'step':>6} {'deg val':>9} {'ref val':>9} {'diff':>8}")
for c in configs:
    for s in seeds:
        d = read(os.path.join(out, f"deg_{c}_{s}", "metrics.jsonl"))
        r = read(os.path.join(out, f"ref_{c}_{s}", "metrics.jsonl"))
        dv = {m["step"]: m["val_loss"] for m in d if m.get("val_loss") is not None}
        rv = {m["step"]: m["val_loss"] for m in r if m.get("val_loss") is not None}
        for step in sorted(set(dv) & set(rv)):
            print(f"{c:<20} {s:>4} {step:>6} {dv[step]:>9.4f} {rv[step]:>9.4f} "
                  f"{(dv[step] - rv[step]) / rv[step]:>+8.2%}")
        # deg's figure is its whole run's (validation included); the reference's summary leaves
        # out its compiling first step and its validations.
        a = d[-1]["tokens_per_s"] if d else None
        am = d[-1].get("mfu") if d else None
        try:
            summary = json.load(open(os.path.join(out, f"ref_{c}_{s}.json")))
            b, bm = summary["steady_tokens_per_s"], summary.get("steady_mfu")
        except (OSError, ValueError, KeyError):
            b = bm = None
        if a and b:
            mfu = f" (MFU {am:.1%} / {bm:.1%})" if am is not None and bm is not None else ""
            print(f"{c:<20} {s:>4} tokens/s: deg {a:,.0f}, reference {b:,.0f}, ratio {a / b:.2f}{mfu}")
EOF
