#!/usr/bin/env bash
# The EN->DE hyperparameter sweep behind configuration/multi30k-transformer.yaml: every configuration below runs the
# recipe (bench/multi30k/recipe.py: training, length penalty on validation, test2016 with beam 5) as its own process,
# all at once, on one GPU. Each stops after LIMIT seconds (default 540); finished ones print their scores.
#
#   DATA=../shared/data/multi30k LIMIT=540 bash bench/multi30k/sweep.sh
#
# Flags given here win over the recipe's YAML. The first sweep (bench/multi30k/README.md) ran with the YAML of
# the time (cased, 2,048-token batches, peak 0.002, 400 warmup steps, 8,000 steps); these are its configurations.
set -u
DATA=${DATA:-../shared/data/multi30k}
LIMIT=${LIMIT:-540}
RUNS=${RUNS:-/tmp/m30k-sweep}
OLD="--lowercase false --split_punctuation false --max_tokens_per_batch 2048 --max_steps 8000 --save_steps 200"
OLD="$OLD --learning_rate 0.002 --warmup_steps 400"
declare -A CFG=(
  [base]="$OLD"
  [punct]="$OLD --split_punctuation true"
  [lc]="$OLD --lowercase true"
  [lcp]="$OLD --lowercase true --split_punctuation true"
  [lcp_lr4]="$OLD --lowercase true --split_punctuation true --learning_rate 0.004 --warmup_steps 1000"
  [lcp_b4k]="$OLD --lowercase true --split_punctuation true --max_tokens_per_batch 4096 --max_steps 4000 --save_steps 100"
  [lcp_v4k]="$OLD --lowercase true --split_punctuation true --vocab_size 4000"
  [lcp_v10k]="$OLD --lowercase true --split_punctuation true --vocab_size 10000"
)
mkdir -p "$RUNS"
start=$(date +%s)
pids=()
for name in "${!CFG[@]}"; do
  # shellcheck disable=SC2086  # the flags are meant to split
  HF_HOME="$RUNS/hf_$name" OMP_NUM_THREADS=2 python -m bench multi30k --data "$DATA" --source_lang en \
    --target_lang de --output_dir "$RUNS/$name" ${CFG[$name]} > "$RUNS/$name.log" 2>&1 &
  pids+=($!)
done
running() { for pid in "${pids[@]}"; do kill -0 "$pid" 2> /dev/null && return 0; done; return 1; }
while [ $(( $(date +%s) - start )) -lt "$LIMIT" ] && running; do sleep 15; done
kill "${pids[@]}" 2> /dev/null
for name in "${!CFG[@]}"; do
  echo "== $name: ${CFG[$name]}"
  echo "training loss every 1,000 steps: $(grep -oE "'loss': '?[0-9.]+" "$RUNS/$name.log" | awk 'NR%10==0' \
    | grep -oE "[0-9.]+$" | paste -sd' ')"
  python - "$RUNS/$name/multi30k_results.json" <<'PY'
import json, sys, pathlib
path = pathlib.Path(sys.argv[1])
keys = ["bleu_lc_tok", "sacrebleu", "chrf", "length_penalty", "validation_bleu_lc_tok_by_length_penalty", "train_seconds"]
print(json.dumps({k: json.loads(path.read_text()).get(k) for k in keys}) if path.is_file() else "not finished")
PY
done
