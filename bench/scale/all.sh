#!/usr/bin/env bash
# The measurements of bench/scale/README.md: corpora of 0.5M, 1.5M and 4.5M pairs under $ROOT (default /tmp/attn-scale),
# one `attn train --max_steps 20` on each, and a second run on 4.5M that reuses the cache. One JSON line per run in
# $ROOT/results.jsonl. Usage: bash bench/scale/all.sh [ROOT]  (hours on a shared 2-core machine).
set -euo pipefail
ROOT=${1:-/tmp/attn-scale}
mkdir -p "$ROOT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
FLAGS=(--preprocessing_num_workers 2 --max_tokens_per_batch 1024)
for pairs in 4500000 1500000 500000; do
  [ -f "$ROOT/c$pairs/train.de.gz" ] || python bench/scale/make_corpus.py "$ROOT/c$pairs" --pairs "$pairs"
done
python bench/scale/run.py "$ROOT/c4500000" --label "4.5M first run" --log "$ROOT/4.5M-1.log" -- "${FLAGS[@]}" >> "$ROOT/results.jsonl"
python bench/scale/run.py "$ROOT/c4500000" --label "4.5M cached" --log "$ROOT/4.5M-2.log" -- "${FLAGS[@]}" >> "$ROOT/results.jsonl"
python bench/scale/run.py "$ROOT/c1500000" --label "1.5M" --log "$ROOT/1.5M.log" -- "${FLAGS[@]}" >> "$ROOT/results.jsonl"
python bench/scale/run.py "$ROOT/c500000" --label "0.5M" --log "$ROOT/0.5M.log" -- "${FLAGS[@]}" >> "$ROOT/results.jsonl"
