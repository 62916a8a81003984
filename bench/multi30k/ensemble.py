"""Ensembles on Multi30k: each run's model, the seed ensembles of the runs and each run's checkpoint ensemble.

    python -m bench multi30k_ensemble --source_lang en --target_lang de --runs outputs/seed1 outputs/seed2 \
        --last_checkpoints 4 --output bench/results/multi30k-ensemble-cpu

The runs are `recipe.py` output folders trained with different `--seed`s on one tokenizer (the second run's
`--tokenizer_name_or_path` is the first's tokenizer). Systems, each decoded with beam search (`--num_beams`):
- `run i`: the run's model (the average of its last checkpoints, as the recipe saves it);
- `seed ensemble of k`: the first k runs' models as one `AttnEnsemble` (equal weights, log_linear), k = 2..N;
- `checkpoints of run i` (of the first `--checkpoint_runs`, default all): the run's last `--last_checkpoints`
  checkpoints as members (`attn translate --model RUN --last_checkpoints K`), next to the run's model, their average.
Every system's length penalty is chosen on the validation split (`recipe.validation_choice`: lowercased tokenized
BLEU), and the validation-picked system (which members, how many) is the best of all on validation; the test split
plays no part in any choice. Test2016 is then translated once per system: lowercased tokenized BLEU (the reference
numbers' way), sacreBLEU and chrF, and the decoding time (wall seconds with this process's threads, 1,000 sentences).
Written to `--output`.json and a table to `--output`.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from modeling_attn.api.ensemble import AttnEnsemble, last_checkpoints, load_ensemble
from modeling_attn.api.translation import load_model

from .. import harness
from .bleu import lowercased_tokenized_bleu
from .recipe import DEFAULT_DATA, test_and_validation, translate_split, validation_choice


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench multi30k_ensemble", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, help="recipe.py output folders, one per seed")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Multi30k folder (default ../shared/data/multi30k)")
    parser.add_argument("--source_lang", required=True)
    parser.add_argument("--target_lang", required=True)
    parser.add_argument("--last_checkpoints", type=int, default=4, help="members of a checkpoint ensemble (4)")
    parser.add_argument("--checkpoint_runs", type=int, help="checkpoint ensembles of the first K runs only (all)")
    parser.add_argument("--num_beams", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--length_penalties", type=float, nargs="+", default=[0.6, 1.0, 1.5, 2.0])
    parser.add_argument("--max_test_samples", type=int, help="only the first N test (and validation) pairs")
    parser.add_argument("--output", required=True, help="path without extension: writes .json and .md")
    return parser.parse_args(argv)


def systems(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each system's members (model folders), by name."""
    found = {f"run {i + 1}": [run] for i, run in enumerate(args.runs)}
    found.update({f"seed ensemble of {k}": args.runs[:k] for k in range(2, len(args.runs) + 1)})
    found.update(
        {
            f"checkpoints of run {i + 1}": last_checkpoints(run, args.last_checkpoints)
            for i, run in enumerate(args.runs[: args.checkpoint_runs])
        }
    )
    return found


def score(args: argparse.Namespace, members: list[str], test, validation) -> dict:
    """One system: its validation BLEU per length penalty, the chosen one, its test scores and decoding time."""
    if len(members) == 1:
        model, tokenizer = load_model(members[0], "cpu")
    else:
        model, tokenizer = load_ensemble(members, "cpu")
    decoding = {"num_beams": args.num_beams, "batch_size": args.batch_size}
    selection = validation_choice(model, tokenizer, validation, args.target_lang, args.length_penalties, **decoding)
    length_penalty = max(selection, key=selection.get)
    start = time.perf_counter()
    scores, hypotheses = translate_split(model, tokenizer, test, length_penalty, **decoding)
    seconds = time.perf_counter() - start
    bleu, signature = lowercased_tokenized_bleu(hypotheses, list(test["target"]), args.target_lang)
    return {
        "members": members,
        "member_count": len(model.members) if isinstance(model, AttnEnsemble) else 1,
        "validation_bleu_lc_tok_by_length_penalty": {str(k): v for k, v in selection.items()},
        "length_penalty": length_penalty,
        "validation_bleu_lc_tok": selection[length_penalty],
        "bleu_lc_tok": round(bleu.score, 2),
        "bleu_lc_tok_detail": str(bleu),
        "sacrebleu": round(scores["bleu"], 2),
        "chrf": round(scores["chrf"], 2),
        "test_decode_seconds": round(seconds, 1),
        "bleu_lc_tok_signature": signature,
    }


def table(results: dict) -> str:
    lines = [
        "| system | members | length penalty (validation) | validation BLEU | test2016 BLEU (lc, tok) | sacreBLEU "
        "| chrF | test decoding (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in results["systems"].items():
        lines.append(
            f"| {name} | {row['member_count']} | {row['length_penalty']} | {row['validation_bleu_lc_tok']} | "
            f"{row['bleu_lc_tok']} | {row['sacrebleu']} | {row['chrf']} | {row['test_decode_seconds']} |"
        )
    picked = results["validation_picked"]
    lines += [
        "",
        f"Mean of the runs' models on test2016: {results['runs_mean_bleu_lc_tok']}. Validation-picked system: "
        f"{picked} ({results['systems'][picked]['bleu_lc_tok']} on test2016).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    test, validation = test_and_validation(args, with_validation=True)
    results = harness.envelope(__name__, argv, torch_threads=torch.get_num_threads(), systems={})
    for name, members in systems(args).items():
        results["systems"][name] = score(args, members, test, validation)
        print(name, json.dumps(results["systems"][name]), flush=True)
    runs = [row for name, row in results["systems"].items() if name.startswith("run ")]
    results["runs_mean_bleu_lc_tok"] = round(statistics.mean(row["bleu_lc_tok"] for row in runs), 2)
    results["validation_picked"] = max(
        results["systems"], key=lambda n: results["systems"][n]["validation_bleu_lc_tok"]
    )
    harness.write_results(args.output, results, table(results))
    return results
