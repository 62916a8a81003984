"""The default threads against every explicit --threads, as users run the commands: translate, serve, load_translator.

    python -m bench threads --model outputs/dates                    # writes bench/results/threads-dates.{json,md}
    python -m bench threads --model outputs/dates --cpus 0 0,1 --settings default 1 2

Each CPU set (`--cpus`, `taskset -c` lists: every process of a row pinned to it) x each setting (`--settings`:
`default` gives no --threads, N gives `--threads N` / `threads=N`), rounds rotating the settings, medians kept:
`attn translate --input` of the dates task's test sources at its default batch size and at `--batch_size 1`
(sentences/s by wall clock, start-up included); `attn serve`, one client's one-sentence requests back to back (p50
ms; the client outside the CPU set); `load_translator(M, threads=...)` in a fresh process, batches of 1 and 32
(sentences/s by wall clock, the load excluded). The last column is the default's speed as a share of the row's best
setting (issue 55's target: >= 0.90).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import harness
from .common import attn_server, dates_sentences

INNER = "bench.threads"  # `python -m bench.threads --inner ...`: the load_translator measurement in its own process


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench threads", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a trained model folder (its sentences: the dates task's)")
    parser.add_argument("--cpus", nargs="+", default=["0", "0,1"], help="taskset -c CPU lists (default: 0 and 0,1)")
    parser.add_argument("--settings", nargs="+", default=["default", "1", "2"], help="default and/or numbers")
    parser.add_argument("--sentences", type=int, default=1000, help="sentences of the batched runs (1000)")
    parser.add_argument("--single", type=int, default=200, help="sentences of the one-at-a-time runs (200)")
    parser.add_argument("--requests", type=int, default=100, help="requests of the serve run (100)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a short check of the script")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/threads-NAME)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.single, args.requests, args.reps = 16, 4, 4, 1
    args.output = args.output or harness.RESULTS / f"threads-{Path(args.model).name}{'-quick' if args.quick else ''}"
    return args


def flags(setting: str) -> list[str]:
    return [] if setting == "default" else ["--threads", setting]


def pinned(cpus: str, command: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *command]


def attn(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "modeling_attn.cli.main", *arguments]


def translate_run(args: argparse.Namespace, cpus: str, setting: str, source: Path, batch: list[str]) -> float:
    """Sentences/s of one `attn translate --input` run (wall clock, start-up included)."""
    count = len(source.read_text().splitlines())
    start = time.perf_counter()
    command = attn("translate", "--model", args.model, "--input", str(source), "--no_progress", *batch)
    subprocess.run(pinned(cpus, [*command, *flags(setting)]), check=True, capture_output=True)
    return count / (time.perf_counter() - start)


def serve_run(args: argparse.Namespace, cpus: str, setting: str, sentences: list[str], folder: Path) -> float:
    """p50 ms of one client's one-sentence requests to `attn serve` (started, warmed with 4 requests, stopped)."""
    import httpx

    serve_flags = ["--model", args.model, "--log_level", "warning", *flags(setting)]
    with attn_server(serve_flags, folder / "serve.log", pinned(cpus, [])) as url, httpx.Client(timeout=600) as client:
        seconds = []
        for index, line in enumerate([*sentences[:4], *sentences]):
            start = time.perf_counter()
            client.post(f"{url}/translate", json={"text": [line]}).raise_for_status()
            if index >= 4:
                seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds)


def python_run(args: argparse.Namespace, cpus: str, setting: str, batch_size: int, count: int) -> float:
    """Sentences/s of `load_translator(...).translate_batch` in a fresh pinned process (the `--inner` mode)."""
    command = [sys.executable, "-m", INNER, "--inner", args.model, setting, str(batch_size), str(count)]
    done = subprocess.run(pinned(cpus, command), check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def inner(model: str, setting: str, batch_size: int, count: int) -> None:
    """The measurement of `python_run`, in this process: what a Python user of `load_translator` runs."""
    import torch

    from modeling_attn.api.engines import load_translator

    threads = None if setting == "default" else int(setting)
    if threads:
        torch.set_num_threads(threads)  # what --threads does in the commands
    engine = load_translator(model, threads=threads)
    sentences = dates_sentences(count)
    engine.translate_batch(sentences[:batch_size])  # warm-up
    start = time.perf_counter()
    for index in range(0, len(sentences), batch_size):
        engine.translate_batch(sentences[index : index + batch_size])
    print(len(sentences) / (time.perf_counter() - start))


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    rows: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        folder = Path(tmp)
        many, one = folder / "many.txt", folder / "one.txt"
        many.write_text("".join(f"{line}\n" for line in dates_sentences(args.sentences)))
        one.write_text("".join(f"{line}\n" for line in dates_sentences(args.single)))
        requests = dates_sentences(args.requests)
        # the export made (or found) once, before any timing
        subprocess.run(attn("translate", "--model", args.model, "--no_progress", "x"), check=True, capture_output=True)
        measures = {
            "attn translate, default batch (sentences/s)": lambda cpus, s: translate_run(args, cpus, s, many, []),
            "attn translate --batch_size 1 (sentences/s)": lambda cpus, s: translate_run(
                args, cpus, s, one, ["--batch_size", "1"]
            ),
            "attn serve, 1 client, p50 (ms)": lambda cpus, s: serve_run(args, cpus, s, requests, folder),
            "load_translator, batch 1 (sentences/s)": lambda cpus, s: python_run(args, cpus, s, 1, args.single),
            "load_translator, batch 32 (sentences/s)": lambda cpus, s: python_run(args, cpus, s, 32, args.sentences),
        }
        for cpus in args.cpus:
            for name, measure in measures.items():
                row = f"{name}, CPUs {cpus}"
                values: dict[str, list[float]] = {setting: [] for setting in args.settings}
                for rep in range(args.reps):
                    shift = rep % len(args.settings)
                    for setting in args.settings[shift:] + args.settings[:shift]:
                        values[setting].append(measure(cpus, setting))
                harness.log(f"{row}: " + json.dumps({s: [round(v, 2) for v in vs] for s, vs in values.items()}))
                rows[row] = {s: {"values": vs, "median": statistics.median(vs)} for s, vs in values.items()}
                report = harness.envelope(__name__, argv, ("ctranslate2",), model=args.model, rows=rows)
                harness.write_results(args.output, report, markdown(report), quiet=True)
    report = harness.envelope(__name__, argv, ("ctranslate2",), model=args.model, rows=rows)
    harness.write_results(args.output, report, markdown(report))
    return report


def best(row: str, medians: dict[str, float]) -> str:
    lower_is_better = row.split(", CPUs")[0].endswith("(ms)")
    return (min if lower_is_better else max)(medians, key=medians.get)


def default_ratio(row: str, medians: dict[str, float]) -> float | None:
    """The default's speed as a share of the best setting's (1.0: the default is the best)."""
    if "default" not in medians:
        return None
    top = medians[best(row, medians)]
    lower_is_better = row.split(", CPUs")[0].endswith("(ms)")
    return top / medians["default"] if lower_is_better else medians["default"] / top


def markdown(report: dict) -> str:
    settings = list(next(iter(report["rows"].values()), {}))
    names = ["no --threads" if setting == "default" else f"--threads {setting}" for setting in settings]
    lines = [
        f"Model {report['model']}; medians of the rounds; **bold**: the best setting of the row; the last column: the "
        "default's speed as a share of the best's (issue 55's target: >= 0.90).",
        "",
        "| what, CPU set (taskset -c) | " + " | ".join(names) + " | default / best |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: |",
    ]
    for row, entries in report["rows"].items():
        medians = {setting: entry["median"] for setting, entry in entries.items()}
        top = best(row, medians)
        cells = [f"**{medians[s]:.1f}**" if s == top else f"{medians[s]:.1f}" for s in settings]
        ratio = default_ratio(row, medians)
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {'' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner"]:
        inner(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(sys.argv[1:])
