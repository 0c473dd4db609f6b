#!/usr/bin/env bash
# Many short documents streamed through `deg fill --jsonl` (issue #13): the requests of the dev
# splits of SNIPS, ATIS and MIT movie / restaurant, cycled to N lines, filled against the SNIPS
# schema with the default model (or --model); prints the lines out and documents/s. Not a test.
#   bench/fill_jsonl.sh DEG DATA_DIR [N] [BATCH] [-- deg fill options...]
# DATA_DIR holds <task>/dev.jsonl and snips/schema.json (../shared/data, or what
# scripts/device-test unpacks on the GPU machine: /tmp/deg-dev-data).
set -euo pipefail
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the --; what follows goes to deg fill
if [ ${#positional[@]} -lt 2 ]; then
  echo "usage: bench/fill_jsonl.sh DEG DATA_DIR [N] [BATCH] [-- deg fill options...]" >&2
  exit 2
fi
deg=${positional[0]} data=${positional[1]} n=${positional[2]:-10000} batch=${positional[3]:-256}
docs=$(mktemp) out=$(mktemp)
trap 'rm -f "$docs" "$out"' EXIT
python3 - "$data" "$n" >"$docs" <<'PY'
import json, sys
data, n = sys.argv[1], int(sys.argv[2])
texts = [json.loads(line)["document"]
         for t in ("snips", "atis", "mit_movie", "mit_restaurant")
         for line in open(f"{data}/{t}/dev.jsonl")]
for i in range(n):
    print(json.dumps({"document": texts[i % len(texts)]}))
PY
start=$(date +%s.%N)
"$deg" fill --schema "$data/snips/schema.json" --jsonl --batch "$batch" "$@" <"$docs" >"$out"
end=$(date +%s.%N)
python3 -c "import sys; n = sum(1 for _ in open('$out')); t = $end - $start; \
print(f'deg fill --jsonl --batch $batch: {n} lines in {t:.1f} s = {n / t:.1f} documents/s')"
