"""Run `attn train` on a big corpus and measure its memory, preprocessing throughput and time to the first step.

Memory is the peak of the whole process tree.

`python -m bench scale /tmp/wmt-synth --label 4.5M -- --max_steps 20` runs
`attn train --data /tmp/wmt-synth --preset small --max_steps 20 ...` (extra flags after `--`), samples the resident
memory of the command and all its children every 0.2 s, and prints one JSON line: peak RSS summed over the process tree
(and of the largest single process), peak PSS summed over the tree, seconds from start to the first logged training
step, the recipe's own timings of reading and tokenizing (from its log), and the load average at start and end (the
machine is shared); the same record goes to bench/results/scale-LABEL.{json,md} (or `--output`). Run it twice on the
same data to measure a run that reuses the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from .. import harness

SAMPLE_SECONDS = 0.2
# The recipe's own log lines with the time of each preparation step (training/train.py).
TIMINGS = {
    "read_and_check": r"read and checked in ([0-9.]+) s",
    "bpe_training": r"trained a joint BPE vocabulary of \d+ tokens in ([0-9.]+) s",
    "tokenize": r"tokenized \d+ pairs in ([0-9.]+) s",
}


def tree_memory(process: psutil.Process) -> tuple[int, int, int]:
    """(RSS sum, RSS max, PSS sum) over `process` and its descendants, in bytes. The RSS sum counts pages shared by
    forked workers once per worker; PSS divides each shared page among its sharers (their sum is the real total)."""
    rss, pss = [], []
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # exited between listing and reading
            info = member.memory_full_info()
            rss.append(info.rss)
            pss.append(info.pss)
    return sum(rss), max(rss, default=0), sum(pss)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and the rest: more `attn train` flags (after --)."""
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--label", default="")
    parser.add_argument("--output_dir", type=Path, default=None)
    parser.add_argument("--log", type=Path, default=None, help="Where the run's output goes (default: a temp file).")
    parser.add_argument("--output", type=Path, help="stem of the record (default bench/results/scale-LABEL)")
    args, extra = parser.parse_known_args(argv)
    args.output = args.output or harness.RESULTS / f"scale-{args.label or 'run'}"
    return args, [flag for flag in extra if flag != "--"]


def train_command(data: Path, output_dir: Path, extra: list[str]) -> list[str]:
    """`attn train` (as its module) on `data`: 20 steps of `small`, logging every step, no evaluation or saving."""
    fixed = "--source_lang en --target_lang de --preset small --max_steps 20 --logging_steps 1 --eval_strategy no"
    fixed += " --save_strategy no --do_eval False --do_predict False --report_to none --average_last_n 1"
    return [
        sys.executable,
        "-m",
        "modeling_attn.training",
        "--data",
        str(data),
        "--output_dir",
        str(output_dir),
        *fixed.split(),
        *extra,
    ]


def watch(command: list[str], log_path: Path) -> dict:
    """Run `command` with its output in `log_path`, sampling the tree's memory; the peaks and the first step's time."""
    start = time.monotonic()
    first_step: list[float] = []
    peaks = {"sum": 0, "max": 0, "pss": 0, "before_training": 0}
    done = threading.Event()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        watched = psutil.Process(process.pid)

        def sample() -> None:
            while not done.is_set():
                total, largest, proportional = tree_memory(watched)
                peaks["sum"], peaks["max"] = max(peaks["sum"], total), max(peaks["max"], largest)
                peaks["pss"] = max(peaks["pss"], proportional)
                if not first_step:
                    peaks["before_training"] = peaks["sum"]
                time.sleep(SAMPLE_SECONDS)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for line in process.stdout:
            log.write(line)
            log.flush()
            if not first_step and re.search(r"['\"]loss['\"]:", line):
                first_step.append(time.monotonic() - start)
        returncode = process.wait()
        done.set()
        sampler.join()
    return {
        "returncode": returncode,
        "peak_rss_tree_gb": round(peaks["sum"] / 1e9, 3),
        "peak_pss_tree_gb": round(peaks["pss"] / 1e9, 3),
        "peak_rss_largest_process_gb": round(peaks["max"] / 1e9, 3),
        "peak_rss_tree_before_first_step_gb": round(peaks["before_training"] / 1e9, 3),
        "seconds_to_first_step": round(first_step[0], 1) if first_step else None,
        "seconds_total": round(time.monotonic() - start, 1),
    }


def main(argv: list[str]) -> dict:
    args, extra = parse_args(argv)
    output_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="attn-scale-"))
    command = train_command(args.data, output_dir, extra)
    log_path = args.log or output_dir.with_suffix(".log")
    load_start = os.getloadavg()
    measured = watch(command, log_path)
    text = log_path.read_text()
    timings = {}
    for key, pattern in TIMINGS.items():
        if found := re.search(pattern, text):
            timings[key] = float(found.group(1))
    result = {
        "label": args.label,
        **measured,
        "timings_s": timings,
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "log": str(log_path),
        "command": " ".join(command),
    }
    record = harness.envelope(__name__, argv, run=result)
    table = "| " + " | ".join(measured) + " |\n|" + " --- |" * len(measured) + "\n| "
    harness.write_results(args.output, record, table + " | ".join(map(str, measured.values())) + " |\n", quiet=True)
    print(json.dumps(result))
    return record
