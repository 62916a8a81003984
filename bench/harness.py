"""The suite's harness: interleaved timing, first call then rounds, the results envelope and its one writer.

Every bench is a module of this package with `main(argv) -> dict`, run by `python -m bench NAME [flags]`
(`bench/__main__.py`). It times with `interleaved` (one untimed call of each task, then rounds in rotating order,
wall-clock or the CPU time of this process, or both) or `first_call_then_rounds` (the first call timed alone, its
output compared with the first variant's, then interleaved rounds); it opens its report with `envelope` (bench name,
the command that reproduces it, date, machine, versions) and writes it with `write_results` to
bench/results/NAME.{json,md}, the Markdown under the same envelope. Nothing here knows a model.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from . import BENCHES

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
VERSIONED = ("torch", "transformers")  # the packages every envelope names; a bench adds its own


# ----------------------------------------------------------------------------------------------------------------
# Timing


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved_clocks(
    tasks: dict[str, Callable[[], None]], reps: int, log_each: bool = False
) -> dict[str, dict[str, list[float]]]:
    """Run each task once untimed (warm-up), then `reps` timed rounds, each round all tasks in rotating order;
    seconds of each call by both clocks (`CLOCKS`: "wall", and "cpu", the CPU time of this process, all its threads:
    on a machine shared with other jobs, the work done, free of the time spent waiting for a core)."""
    for task in tasks.values():
        task()
    seconds: dict[str, dict[str, list[float]]] = {name: {clock: [] for clock in CLOCKS} for name in tasks}
    names = list(tasks)
    for rep in range(reps if names else 0):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            starts = {clock: read() for clock, read in CLOCKS.items()}
            tasks[name]()
            synchronize()
            for clock, read in CLOCKS.items():
                seconds[name][clock].append(read() - starts[clock])
            if log_each:
                log(f"  {name}: {seconds[name]['wall'][-1]:.2f} s wall, {seconds[name]['cpu'][-1]:.2f} s CPU")
    return seconds


def interleaved(tasks: dict[str, Callable[[], None]], reps: int, clock: str = "wall") -> dict[str, list[float]]:
    """`interleaved_clocks`, the seconds of one clock ("wall" or "cpu")."""
    return {name: by_clock[clock] for name, by_clock in interleaved_clocks(tasks, reps).items()}


def first_call_then_rounds(
    calls: dict[str, Callable[[], Any]],
    tasks: dict[str, Callable[[], None]],
    reps: int,
    clock: str,
    agreement: Callable[[Any, Any], Any],
) -> dict[str, dict]:
    """Each of `calls` once, timed alone by the wall clock (compiling or exporting, then one run: `first_call_s`),
    its output compared with the first call's by `agreement(output, first output)` (`same_ids`); then `tasks` (the
    same work, by name) in `interleaved` rounds (`seconds`)."""
    entries: dict[str, dict] = {}
    reference = None
    for name, call in calls.items():
        started = time.perf_counter()
        with torch.inference_mode():
            output = call()
        synchronize()
        entries[name] = {"first_call_s": time.perf_counter() - started}
        reference = output if reference is None else reference
        entries[name]["same_ids"] = agreement(output, reference)
    for name, seconds in interleaved(tasks, reps, clock).items():
        entries.setdefault(name, {})["seconds"] = seconds
    return entries


def patched(step: Callable, *patches: tuple[object, str, Any]) -> Callable:
    """`step` with each `(owner, name, value)` set while it runs (`unittest.mock.patch.object`), undone after each
    call: a change's ablation, timed in the same rounds as the step itself."""

    def run(*args) -> None:
        with ExitStack() as stack:
            for owner, name, value in patches:
                stack.enter_context(mock.patch.object(owner, name, value))
            step(*args)

    return run


# ----------------------------------------------------------------------------------------------------------------
# The envelope and the writer


def installed(package: str) -> str | None:
    """The installed version of `package`, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPU cores"


def bench_name(module: str) -> str:
    """The suite's name of a bench module (`BENCHES`), e.g. "bench.train_step" -> "train_step"."""
    return next(name for name, path in BENCHES.items() if path == module)


def command(module: str, argv: list[str]) -> str:
    """The command that reruns the bench module `module` with `argv`, from the repository's root."""
    return shlex.join(["python", "-m", "bench", bench_name(module), *argv])


def envelope(module: str, argv: list[str], packages: tuple[str, ...] = (), **settings: Any) -> dict:
    """The head of every report: bench, command, date, machine, python and package versions, then `settings`."""
    return head(bench_name(module), command(module, argv), packages) | settings


def head(name: str, command_line: str, packages: tuple[str, ...] = ()) -> dict:
    """`envelope` of a record that no bench module makes (the oldest-transformers compat run of .ci/run)."""
    versions = {"python": platform.python_version()}
    versions |= {package: installed(package) for package in (*VERSIONED, *packages)}
    return {
        "bench": name,
        "command": command_line,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "versions": versions,
    }


def header(report: dict) -> str:
    """The envelope as the first lines of a report's Markdown (a report from before the envelope: its own fields)."""
    versions = report.get("versions") or {key: report[key] for key in ("python", *VERSIONED) if key in report}
    shown = ", ".join(f"{name} {version}" for name, version in versions.items())
    date = f"; {report['date']}" if "date" in report else ""
    return f"Command: `{report['command']}`\n\nMachine: {report['machine']}; {shown}{date}.\n\n"


def write_results(stem: str | Path, report: dict, markdown: str, quiet: bool = False) -> None:
    """`report` to `stem`.json and `header(report)` + `markdown` to `stem`.md (folders made); the Markdown on stdout
    unless `quiet` (a report rewritten after each measurement)."""
    output = Path(stem)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_name(output.name + ".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    output.with_name(output.name + ".md").write_text(header(report) + markdown.rstrip("\n") + "\n")
    if not quiet:
        print(header(report) + markdown)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


_SCRATCH: list[tempfile.TemporaryDirectory] = []


def scratch_folder(prefix: str) -> Path:
    """A new temporary folder, removed when the process ends (an export a runtime reads while it is timed)."""
    _SCRATCH.append(tempfile.TemporaryDirectory(prefix=prefix))
    return Path(_SCRATCH[-1].name)


def run_presets(report: dict, stem: Path, presets: list[str], bench_preset: Callable, markdown: Callable) -> dict:
    """Benchmarks each of `presets` with `bench_preset(preset, save)` into `report["results"]`, writing the report
    after each part (`save(partial)`: what a run cut short has measured) and at the end; prints the Markdown."""

    def save(partial: dict | None = None, quiet: bool = True) -> None:
        shown = {**report, "results": report["results"] + ([partial] if partial is not None else [])}
        write_results(stem, shown, markdown(shown), quiet=quiet)

    for preset in presets:
        report["results"].append(bench_preset(preset, save))
    save(quiet=False)
    return report
