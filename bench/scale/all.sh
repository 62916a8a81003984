#!/usr/bin/env bash
# The measurements of bench/scale/README.md: a synthetic corpus of 4.5M pairs under $ROOT (default /tmp/attn-scale)
# and its first 1.5M and 0.5M pairs (the generator is chunked, so these equal what --pairs 1500000 would write), one
# `attn train --max_steps 20` on each size, and a second 4.5M run that reuses the cache. One JSON line per run in
# $ROOT/results.jsonl. Usage: bash bench/scale/all.sh [ROOT]  (about an hour on a shared 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root: `python -m bench` runs from there
ROOT=${1:-/tmp/attn-scale}
mkdir -p "$ROOT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
FLAGS=(--preprocessing_num_workers 2 --max_tokens_per_batch 1024)
[ -f "$ROOT/c4500000/test.de.gz" ] || python -m bench scale_corpus "$ROOT/c4500000" --pairs 4500000
for pairs in 1500000 500000; do
  mkdir -p "$ROOT/c$pairs"
  for lang in en de; do
    # head closes the pipe early: zcat's SIGPIPE is expected, not a failure (pipefail would stop the script)
    { zcat "$ROOT/c4500000/train.$lang.gz" || true; } | head -n "$pairs" | gzip -1 > "$ROOT/c$pairs/train.$lang.gz"
    cp "$ROOT/c4500000/valid.$lang.gz" "$ROOT/c4500000/test.$lang.gz" "$ROOT/c$pairs/"
  done
done
run() { python -m bench scale "$1" --label "$2" --log "$ROOT/$2.log" -- "${FLAGS[@]}" >> "$ROOT/results.jsonl"; }
run "$ROOT/c4500000" "4.5M-first"
run "$ROOT/c4500000" "4.5M-cached"
run "$ROOT/c1500000" "1.5M-first"
run "$ROOT/c500000" "0.5M-first"
