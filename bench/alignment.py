"""Alignment error rate (AER) on the embedded dates task, without and with guided alignment training.

Both model types are measured (issue 31: with guided training <= 5% for the Transformer).

The dates generator knows the true word alignment of every pair (`modeling_attn.training.synthetic`, "alnum" words:
"1987-03-03" is "1987-", "03-", "03"). For each model type the script trains twice with `attn train` on the embedded
task, the same seed and steps: once plain, once with `--alignment_file` (the true alignments of the training pairs)
and `--alignment_words alnum`. It then aligns held-out test pairs (forced alignment, `api.alignment.align_pairs`:
the reference target read teacher-forced, each target word linked to its argmax source word) and scores them against
the true links (AER, Och & Ney 2003, sure links only: 1 - F1). For the plain Transformer it also scores every decoder
layer (mean of heads) and every head of the default layer, to show how much a choice of layer or head gains without
supervision. Greedy exact match on the same test sentences shows what guided training costs the translations.

    python -m bench alignment                       # defaults below; ~1 h on 2 busy CPU cores; writes
    python -m bench alignment --steps 50 --test-pairs 50 --output /tmp/aer   # bench/results/alignment-aer.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from modeling_attn.training.synthetic import build_dataset

from modeling_attn.api.alignment import align_pairs, alignment_error_rate, parse_pharaoh
from modeling_attn.api.translation import load_model, translate_batch

from . import harness
from .harness import log


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench alignment", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="training steps per run")
    parser.add_argument("--presets", nargs=2, default=["small", "rnn-small"], metavar=("TRANSFORMER", "RNN"))
    parser.add_argument("--train-pairs", type=int, default=20_000, help="--max_train_samples")
    parser.add_argument("--tokens-per-batch", type=int, default=1024, help="--max_tokens_per_batch")
    parser.add_argument("--test-pairs", type=int, default=1000, help="held-out pairs scored")
    parser.add_argument("--weight", type=float, default=None, help="--guided_alignment_weight (default: the flag's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/attn-bench-alignment"), help="training folders")
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "alignment-aer")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, preset: str, alignment_file: Path | None, folder: Path) -> float:
    """One `attn train` run on the embedded task; returns its wall time in seconds."""
    command = [
        sys.executable,
        "-m",
        "modeling_attn.cli.main",
        "train",
        "--preset",
        preset,
        "--output_dir",
        str(folder),
        "--overwrite_output_dir",
        "--max_steps",
        str(args.steps),
        "--max_train_samples",
        str(args.train_pairs),
        "--max_tokens_per_batch",
        str(args.tokens_per_batch),
        "--seed",
        str(args.seed),
        *shlex.split("--eval_strategy no --do_eval false --do_predict false --save_strategy no --average_last_n 1"),
        *shlex.split("--report_to none --disable_tqdm true --logging_steps 50"),
    ]
    if alignment_file is not None:
        command += ["--alignment_file", str(alignment_file), "--alignment_words", "alnum"]
        if args.weight is not None:
            command += ["--guided_alignment_weight", str(args.weight)]
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    log("$ " + shlex.join(command))
    start = time.perf_counter()
    subprocess.run(command, check=True, env=environment, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def score(folder: Path, test, config_changes: dict | None = None) -> dict:
    """AER of the model in `folder` on the test pairs (with `config_changes` to its alignment layer/heads)."""
    model, tokenizer = load_model(str(folder), "cpu", eager=True)
    for name, value in (config_changes or {}).items():
        setattr(model.config, name, value)
    found = align_pairs(model, tokenizer, test["source"], test["target"], words="alnum", batch_size=64)
    sure = [parse_pharaoh(line) for line in test["alignment"]]
    return {
        "aer": alignment_error_rate([alignment.pairs for alignment in found], sure),
        "model": model,
        "tokenizer": tokenizer,
    }


def exact_match(model, tokenizer, test) -> float:
    hits = 0
    for start in range(0, len(test), 64):
        rows = test[start : start + 64]
        translations, _ = translate_batch(model, tokenizer, rows["source"], num_beams=1, max_new_tokens=16)
        hits += sum(
            hypothesis == reference for hypothesis, reference in zip(translations, rows["target"], strict=True)
        )
    return hits / len(test)


def breakdown(folder: Path, test, config) -> dict[str, float]:
    """AER of every decoder layer (mean of its heads) and of every head of the default layer."""
    rows = {}
    for layer in range(config.decoder_layers):
        rows[f"layer {layer}, mean of heads"] = score(folder, test, {"alignment_layer": layer, "alignment_heads": 0})[
            "aer"
        ]
    default = config.alignment_layer
    for head in range(config.num_heads):  # head h alone: the first h+1 heads minus the first h, by hand
        model, tokenizer = load_model(str(folder), "cpu", eager=True)
        rows[f"layer {default}, head {head}"] = _single_head_aer(model, tokenizer, test, default, head)
    return rows


def _single_head_aer(model, tokenizer, test, layer: int, head: int) -> float:
    """AER of one head: the model's cross-attention of `layer` with only `head` kept (the config averages the first
    n heads, so a single head other than the first is picked by permuting the heads' query projections)."""
    attention = model.model.decoder.layers[layer].encoder_attn
    head_dim = attention.head_dim
    order = [head] + [h for h in range(model.config.num_heads) if h != head]
    rows = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in order])
    with torch.no_grad():  # permuting q, k, v and the input columns of out_proj alike leaves the output unchanged
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.weight.copy_(projection.weight[rows])
            projection.bias.copy_(projection.bias[rows])
        attention.out_proj.weight.copy_(attention.out_proj.weight[:, rows])
    model.config.alignment_layer, model.config.alignment_heads = layer, 1
    found = align_pairs(model, tokenizer, test["source"], test["target"], words="alnum", batch_size=64)
    return alignment_error_rate([a.pairs for a in found], [parse_pharaoh(line) for line in test["alignment"]])


def markdown(report: dict) -> str:
    lines = [
        "# Alignment error rate on the dates task",
        "",
        f"{report['threads']} thread(s).",
        "",
        f"Training: `attn train` on the embedded dates task, {report['steps']} steps of at most "
        f"{report['tokens_per_batch']} tokens, {report['train_pairs']} training pairs, seed {report['seed']}; guided: "
        f"`--alignment_file` (the true alignments) `--alignment_words alnum`, weight {report['weight']}. "
        f"AER (Och & Ney 2003; sure links only, so 1 - F1) of the forced alignment of {report['test_pairs']} held-out "
        "test pairs against their true word alignments; exact match: greedy translations equal to the reference.",
        "",
        "| model | preset | training | alignment from | AER | exact match | training s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for run in report["runs"]:
        lines.append(
            f"| {run['model_type']} | {run['preset']} | {'guided' if run['guided'] else 'plain'}"
            f" | {run['alignment_from']}"
            f" | {100 * run['aer']:.1f}% | {100 * run['exact_match']:.1f}% | {run['train_seconds']:.0f} |"
        )
    if report.get("transformer_breakdown"):
        lines += [
            "",
            "Plain Transformer, other layers and heads (no supervision):",
            "",
            "| attention | AER |",
            "| --- | ---: |",
        ]
        lines += [f"| {name} | {100 * aer:.1f}% |" for name, aer in report["transformer_breakdown"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    dataset = build_dataset(alignments=True)  # the embedded task's splits, as `attn train` builds them
    alignment_file = args.work / "train.align"
    alignment_file.write_text("\n".join(dataset["train"]["alignment"]) + "\n")
    test = dataset["test"].select(range(min(args.test_pairs, len(dataset["test"]))))
    settings = {key: getattr(args, key) for key in ("threads", "steps", "tokens_per_batch", "train_pairs", "seed")}
    report = harness.envelope(__name__, argv, **settings, test_pairs=len(test), weight=args.weight, runs=[])
    from modeling_attn.loss import GUIDED_ALIGNMENT_WEIGHT

    report["weight"] = args.weight if args.weight is not None else GUIDED_ALIGNMENT_WEIGHT
    for preset in args.presets:
        for guided in (False, True):
            folder = args.work / f"{preset}-{'guided' if guided else 'plain'}"
            seconds = train(args, preset, alignment_file if guided else None, folder)
            scored = score(folder, test)
            config = scored["model"].config
            source = (
                f"layer {config.alignment_layer}, "
                + ("all heads" if config.alignment_heads == 0 else f"{config.alignment_heads} head(s)")
                if hasattr(config, "alignment_layer")
                else "alignment weights alpha"
            )
            run = {
                "model_type": config.model_type,
                "preset": preset,
                "guided": guided,
                "alignment_from": source,
                "aer": scored["aer"],
                "exact_match": exact_match(scored["model"], scored["tokenizer"], test),
                "train_seconds": seconds,
            }
            log(json.dumps(run))
            report["runs"].append(run)
            if not guided and hasattr(config, "alignment_layer"):
                report["transformer_breakdown"] = breakdown(folder, test, config)
    harness.write_results(args.output, report, markdown(report))
    return report
