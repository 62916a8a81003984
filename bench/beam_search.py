"""Beam search on a trained model and real sentences: ours against transformers' and Marian's.

Ours is the one where a sentence whose search is over leaves the batch
(`modeling_attn.beam_search.CompactBeamSearchMixin`); it runs against transformers' beam search on the same model,
and against `MarianMTModel` with the same weights where the model converts (post-LN models only).

    python bench/beam_search.py --model outputs/m30k-en-de-8k --threads 1 \
        --source ../shared/data/multi30k/test_2016_flickr.en.gz --sentences 256 --batch_size 32 --num_beams 4

speed.py cannot show this: with untrained weights it forces every sentence to the same length, so no sentence
finishes early. Here a trained model translates the first `--sentences` lines of `--source` in their file order
(batches as `attn translate` makes them), with the model's own generation config (its per-sentence length limit
included) and `--num_beams`. Each variant translates all batches once untimed, then `--reps` rounds in rotating
order (`common.interleaved`, CPU clock of this process); medians are reported. Ours and transformers' must produce
identical token ids (checked, the run fails otherwise); Marian's agreement is reported (its length limit is the
generation config's `max_length`, as it has no per-sentence limit).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import GenerationMixin

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn.api.convert_marian import MarianConversionError, attn_to_marian  # noqa: E402
from modeling_attn.api.translation import load_model  # noqa: E402


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a trained attn_transformer / attn_rnn model and tokenizer")
    parser.add_argument("--source", required=True, help="source sentences, one per line (.gz read as gzip)")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the CPU clock counts them all)")
    parser.add_argument("--reps", type=int, default=5, help="measured rounds after one warm-up round")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds of each variant for all the sentences."""
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
    outputs: dict[str, list[torch.Tensor]] = {"ours": [], "transformers' beam search": []}
    ours = translator(model, batches, args.num_beams, outputs["ours"])
    theirs = translator(model, batches, args.num_beams, outputs["transformers' beam search"])

    def transformers_task() -> None:
        with transformers_beam_search(model):
            theirs()

    tasks = {"ours": ours, "transformers' beam search": transformers_task}
    try:
        marian = attn_to_marian(model).eval()
    except MarianConversionError as error:
        print(f"MarianMTModel not measured: {error}")
    else:
        outputs["MarianMTModel"] = []
        tasks["MarianMTModel"] = translator(marian, batches, args.num_beams, outputs["MarianMTModel"])
    seconds = common.interleaved(tasks, args.reps, common.CLOCKS["cpu"])
    rows = {name: decoder_rows(marian if name == "MarianMTModel" else model, task) for name, task in tasks.items()}

    pairs = zip(outputs["ours"], outputs["transformers' beam search"], strict=True)
    mismatched = [i for i, (a, b) in enumerate(pairs) if a.shape != b.shape or not torch.equal(a, b)]
    if mismatched:
        raise AssertionError(f"ours and transformers' beam search translated batches {mismatched} differently")
    tokens = sum(translated_tokens(ids, model.generation_config.eos_token_id) for ids in outputs["ours"])
    print(
        f"{args.model}: {len(lines)} sentences of {args.source} in batches of {args.batch_size}, beam "
        f"{args.num_beams}, {tokens} target tokens (ours), {args.threads} thread(s), CPU clock of this process, "
        f"{platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print("| variant | s (median) | sentences/s | ours' speed-up | decoder rows | same ids as ours | rounds |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, values in seconds.items():
        pairs = zip(outputs["ours"], outputs[name], strict=True)
        same = (
            "-"
            if name == "ours"
            else "yes"
            if all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)
            else "no"
        )
        rounds = " ".join(f"{value:.3f}" for value in values)
        print(
            f"| {name} | {medians[name]:.3f} | {len(lines) / medians[name]:.1f} | "
            f"{medians[name] / medians['ours']:.2f}x | {rows[name]:,} | {same} | {rounds} |"
        )
    theirs_rows = rows["transformers' beam search"]
    print(f"rows of closed sentences in transformers' beam search: {1 - rows['ours'] / theirs_rows:.0%}")
    return medians


if __name__ == "__main__":
    main()
