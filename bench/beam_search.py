"""Beam search on a trained model and real sentences: ours against transformers' and Marian's.

Ours is the one where a sentence whose search is over leaves the batch
(`modeling_attn.beam_search.CompactBeamSearchMixin`); it runs against transformers' beam search on the same model,
and against `MarianMTModel` with the same weights where the model converts (post-LN models only).

    python -m bench beam_search --model outputs/m30k-en-de-8k --threads 1 \
        --source ../shared/data/multi30k/test_2016_flickr.en.gz --sentences 256 --batch_size 32 --num_beams 4

speed.py cannot show this: with untrained weights it forces every sentence to the same length, so no sentence
finishes early. Here a trained model translates the first `--sentences` lines of `--source` in their file order
(batches as `attn translate` makes them), with the model's own generation config (its per-sentence length limit
included) and `--num_beams`. Each variant translates all batches once untimed, then `--reps` rounds in rotating
order (`harness.interleaved`, CPU clock of this process); medians are reported. Ours and transformers' must produce
identical token ids (checked, the run fails otherwise); Marian's agreement is reported (its length limit is the
generation config's `max_length`, as it has no per-sentence limit). Writes bench/results/beam-search-MODEL.{json,md}
(MODEL: the folder's name) or `--output`.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GenerationMixin

from modeling_attn.api.convert_marian import MarianConversionError, attn_to_marian
from modeling_attn.api.translation import load_model

from . import harness


@contextlib.contextmanager
def transformers_beam_search(model):
    """Run `model.generate` with transformers' own `_beam_search` (the class attribute is put back after)."""
    cls = type(model)
    saved = cls.__dict__.get("_beam_search")
    cls._beam_search = GenerationMixin._beam_search
    try:
        yield
    finally:
        if saved is None:
            del cls._beam_search
        else:
            cls._beam_search = saved


def read_lines(path: str, count: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in itertools.islice(handle, count)]
    if not lines:
        raise ValueError(f"--source {path} has no lines")
    return lines


def translated_tokens(sequences: torch.Tensor, eos_token_id: int | list[int]) -> int:
    """Target tokens up to and including each row's first end token (the decoder start token and the filling after
    the end, pad or end tokens, not counted)."""
    generated = sequences[:, 1:]
    is_eos = torch.isin(generated, torch.tensor(eos_token_id).reshape(-1))
    before_end = (is_eos.cumsum(dim=1) - is_eos.long()) == 0
    return int(before_end.sum())


def decoder_rows(model, task: Callable[[], None]) -> int:
    """Decoder rows (sentences x beams, summed over the steps) that one run of `task` feeds through `model`."""
    rows = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["decoder_input_ids"].shape[0]), with_kwargs=True
    )
    try:
        task()
    finally:
        handle.remove()
    return sum(rows)


def translator(model, batches: list[dict], num_beams: int, outputs: list) -> Callable[[], None]:
    def task() -> None:
        outputs.clear()
        with torch.inference_mode():
            for batch in batches:
                outputs.append(model.generate(**batch, num_beams=num_beams))

    return task


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench beam_search", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a trained attn_transformer / attn_rnn model and tokenizer")
    parser.add_argument("--source", required=True, help="source sentences, one per line (.gz read as gzip)")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the CPU clock counts them all)")
    parser.add_argument("--reps", type=int, default=5, help="measured rounds after one warm-up round")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/beam-search-MODEL)")
    args = parser.parse_args(argv)
    args.output = args.output or harness.RESULTS / f"beam-search-{Path(args.model).name}"
    return args


def measure(model, batches: list[dict], args: argparse.Namespace) -> tuple[dict, dict, dict, str | None]:
    """Each variant's outputs, its seconds per round and its decoder rows; why Marian was not measured (or None)."""
    outputs: dict[str, list[torch.Tensor]] = {"ours": [], "transformers' beam search": []}
    ours = translator(model, batches, args.num_beams, outputs["ours"])
    theirs = translator(model, batches, args.num_beams, outputs["transformers' beam search"])

    def transformers_task() -> None:
        with transformers_beam_search(model):
            theirs()

    tasks = {"ours": ours, "transformers' beam search": transformers_task}
    models = dict.fromkeys(tasks, model)
    not_measured = None
    try:
        models["MarianMTModel"] = attn_to_marian(model).eval()
    except MarianConversionError as error:
        not_measured = f"MarianMTModel not measured: {error}"
    else:
        outputs["MarianMTModel"] = []
        tasks["MarianMTModel"] = translator(models["MarianMTModel"], batches, args.num_beams, outputs["MarianMTModel"])
    seconds = harness.interleaved(tasks, args.reps, "cpu")
    rows = {name: decoder_rows(models[name], task) for name, task in tasks.items()}
    return outputs, seconds, rows, not_measured


def markdown(report: dict) -> str:
    lines = [
        f"{report['model']}: {report['sentences']} sentences of {report['source']} in batches of "
        f"{report['batch_size']}, beam {report['num_beams']}, {report['target_tokens']} target tokens (ours), "
        f"{report['threads']} thread(s), CPU clock of this process, median of {report['reps']} rounds.",
        "",
        "| variant | s (median) | sentences/s | ours' speed-up | decoder rows | same ids as ours | rounds |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    ours = report["variants"]["ours"]["median_s"]
    for name, entry in report["variants"].items():
        same = "-" if name == "ours" else "yes" if entry["same_ids_as_ours"] else "no"
        rounds = " ".join(f"{value:.3f}" for value in entry["seconds"])
        lines.append(
            f"| {name} | {entry['median_s']:.3f} | {report['sentences'] / entry['median_s']:.1f} | "
            f"{entry['median_s'] / ours:.2f}x | {entry['decoder_rows']:,} | {same} | {rounds} |"
        )
    theirs_rows = report["variants"]["transformers' beam search"]["decoder_rows"]
    closed = 1 - report["variants"]["ours"]["decoder_rows"] / theirs_rows
    lines += ["", f"rows of closed sentences in transformers' beam search: {closed:.0%}"]
    if report["marian"]:
        lines.append(report["marian"])
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    """Measure, write the report and return it (`variants`: each variant's seconds, median, rows, agreement)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device="cpu")
    lines = read_lines(args.source, args.sentences)
    batches = [
        dict(
            tokenizer(
                lines[start : start + args.batch_size], return_tensors="pt", padding=True, return_token_type_ids=False
            )
        )
        for start in range(0, len(lines), args.batch_size)
    ]
    outputs, seconds, rows, not_measured = measure(model, batches, args)

    def same(name: str) -> bool:
        pairs = zip(outputs["ours"], outputs[name], strict=True)
        return all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)

    if not same("transformers' beam search"):
        raise AssertionError("ours and transformers' beam search translated the batches differently")
    tokens = sum(translated_tokens(ids, model.generation_config.eos_token_id) for ids in outputs["ours"])
    report = harness.envelope(
        __name__,
        argv,
        **{key: getattr(args, key) for key in ("model", "source", "batch_size", "num_beams", "threads", "reps")},
        sentences=len(lines),
        target_tokens=tokens,
        marian=not_measured,
        variants={
            name: {
                "seconds": values,
                "median_s": statistics.median(values),
                "decoder_rows": rows[name],
                "same_ids_as_ours": same(name),
            }
            for name, values in seconds.items()
        },
    )
    harness.write_results(args.output, report, markdown(report))
    return report
