"""`attn serve` under load on loopback: throughput, latency, and lost or wrong answers.

    python -m bench serve --model outputs/dates          # writes bench/results/serve-cpu.{json,md}
    python -m bench serve --model outputs/dates --quick  # 1 and 8 clients, 16 requests, stress 8 x 10

1. Sentences: distinct dates of the embedded dates task (`training.synthetic.generate_pairs`, seed 12345), one each.
2. Reference: `attn translate --model M --input pool.txt` (a subprocess): every request's right answer and the
   offline baseline (wall time with and without start and load; once per sentence on `--per_process` sentences).
3. Server: `attn serve --model M [--threads T|default: none] --engine E` on 127.0.0.1; for each of `--clients`,
   closed-loop httpx clients send one-sentence requests until `--requests` are answered: requests/s, p50/p99, checks.
4. Stress: `--stress_clients` clients x `--stress_requests` requests, each answered 200 with the reference.
5. The engine alone (`engine_alone`, before the server starts): the server's engine in this process, one sentence a
   call, p50 ms: a lone request's time without HTTP, the queue and the worker.
6. The HTTP floor (`http_floor`): GET /health, a no-op, from one httpx client timed as in 3, p50 ms back to back and
   after an idle pause as long as step 5's p50; a lone request's latency less the floor is the server's own time.
`failed(report)`: exit 1 on any lost or wrong answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from modeling_attn.training.synthetic import generate_pairs

from .. import common, harness


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench serve", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model folder (e.g. `attn train --output_dir outputs/dates`)")
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences (512)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="client counts (1 8 32)")
    parser.add_argument("--requests", type=int, default=256, help="requests per client count (256)")
    parser.add_argument("--stress_clients", type=int, default=32)
    parser.add_argument("--stress_requests", type=int, default=500, help="requests per stress client (500)")
    parser.add_argument("--per_process", type=int, default=3, help="sentences for the process-per-sentence baseline")
    parser.add_argument(
        "--threads",
        default="1",
        type=thread_setting,
        help="--threads of the server, attn translate and the engine alone (1); `default`: none given",
    )
    parser.add_argument("--engine", default="auto", help="the server's --engine, and the engine timed alone (auto)")
    parser.add_argument("--serve_flags", default="", help="more `attn serve` flags, e.g. '--max_wait_ms 5'")
    parser.add_argument("--quick", action="store_true", help="a short check of the script")
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "serve-cpu", help="stem of the report")
    args = parser.parse_args(argv)
    if args.quick:
        args.pool, args.clients, args.requests = 64, [1, 8], 16
        args.stress_clients, args.stress_requests, args.per_process = 8, 10, 1
    return args


def thread_setting(value: str) -> str:
    if value != "default" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: a number of threads or `default`")
    return value


def thread_flags(args: argparse.Namespace) -> list[str]:
    """The commands' --threads flag (none for `default`)."""
    return [] if args.threads == "default" else ["--threads", args.threads]


def attn(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "modeling_attn.cli.main", *arguments]


def reference(args: argparse.Namespace, pool: list[str], folder: Path) -> tuple[dict[str, str], dict]:
    """The translations of `attn translate` and its timings."""
    source = folder / "pool.txt"
    source.write_text("".join(f"{line}\n" for line in pool))
    start = time.perf_counter()
    done = subprocess.run(
        attn("translate", "--model", args.model, "--input", str(source), "--no_progress", *thread_flags(args)),
        capture_output=True,
        text=True,
        check=True,
    )
    total = time.perf_counter() - start
    translations = done.stdout.splitlines()
    # the same command on no sentence: the process start and the model load alone
    empty = folder / "empty.txt"
    empty.write_text("")
    start = time.perf_counter()
    subprocess.run(
        attn("translate", "--model", args.model, "--input", str(empty), "--no_progress"),
        check=True,
        capture_output=True,
    )
    startup = time.perf_counter() - start
    start = time.perf_counter()
    for line in pool[: args.per_process]:
        subprocess.run(
            attn("translate", "--model", args.model, "--no_progress", *thread_flags(args), line),
            check=True,
            capture_output=True,
        )
    per_process = (time.perf_counter() - start) / max(1, args.per_process)
    timings = {
        "sentences": len(pool),
        "seconds_with_startup": round(total, 2),
        "startup_seconds": round(startup, 2),
        "sentences_per_s": round(len(pool) / total, 2),
        "sentences_per_s_without_startup": round(len(pool) / max(1e-9, total - startup), 2),
        "one_process_per_sentence_seconds": round(per_process, 2),
    }
    return dict(zip(pool, translations, strict=True)), timings


def server(args: argparse.Namespace, folder: Path) -> contextlib.AbstractContextManager[str]:
    flags = ["--model", args.model, *thread_flags(args), "--engine", args.engine, "--log_level", "warning"]
    return common.attn_server([*flags, *shlex.split(args.serve_flags)], folder / "serve.log")


def load(
    url: str,
    clients: int,
    requests: int,
    pool: list[str],
    expected: dict[str, str],
    sentences_per_request: tuple[int, int] = (1, 1),
) -> dict:
    """`clients` closed-loop clients sharing `requests` requests; throughput, latency, and what went wrong."""
    counter = iter(range(requests))
    lock = threading.Lock()
    latencies: list[float] = []
    problems: list[str] = []

    def client(index: int) -> None:
        generator = random.Random(index)
        with httpx.Client(timeout=600) as session:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                lines = generator.sample(pool, generator.randint(*sentences_per_request))
                start = time.perf_counter()
                try:
                    response = session.post(f"{url}/translate", json={"text": lines})
                except httpx.HTTPError as error:
                    problems.append(f"lost: {type(error).__name__}: {error}")
                    continue
                elapsed = time.perf_counter() - start
                if response.status_code != 200:
                    problems.append(f"status {response.status_code}: {response.text[:200]}")
                    continue
                texts = [entry["text"] for entry in response.json()["translations"]]
                if texts != [expected[line] for line in lines]:
                    problems.append(f"wrong: {lines} -> {texts}")
                with lock:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "requests": requests,
        "answered_right": len(latencies),
        "problems": len(problems),
        "first_problems": problems[:5],
        "seconds": round(wall, 2),
        "requests_per_s": round(len(latencies) / wall, 2),
        "latency_p50_ms": round(1000 * statistics.median(ordered), 1) if ordered else None,
        "latency_p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)
        if ordered
        else None,
    }


def http_floor(url: str, requests: int, idle_s: float) -> dict:
    """GET /health from one keep-alive httpx client, timed as `load` times a request: p50 ms back to back and after
    `idle_s` of pause (interleaved): a server idle for a few ms answers slower
    (bench/results/serve-dates-auto-floor.md: 2.07 ms back to back, 2.75 ms after 6.2 ms), and a lone request's event
    loop idles while it decodes."""
    back_to_back, after_idle = [], []
    with httpx.Client(timeout=60) as session:
        session.get(f"{url}/health").raise_for_status()  # connect
        for _ in range(requests):
            for seconds, pause in ((after_idle, idle_s), (back_to_back, 0.0)):
                time.sleep(pause)
                start = time.perf_counter()
                response = session.get(f"{url}/health")
                seconds.append(time.perf_counter() - start)
                response.raise_for_status()
    return {
        "requests": requests,
        "p50_ms": round(1000 * statistics.median(back_to_back), 2),
        "idle_ms": round(1000 * idle_s, 2),
        "p50_ms_after_idle": round(1000 * statistics.median(after_idle), 2),
    }


def engine_alone(args: argparse.Namespace, sentences: list[str], expected: dict[str, str]) -> dict:
    """The server's engine in this process, one sentence a call: p50 ms per sentence (wall clock), and whether it
    gave the reference's translations."""
    import torch

    from modeling_attn.api.engines import load_translator

    threads = None if args.threads == "default" else int(args.threads)
    if threads:
        torch.set_num_threads(threads)
    engine = load_translator(args.model, engine=args.engine, device="cpu", threads=threads)
    engine.translate_batch(sentences[:4])  # warm-up
    seconds, wrong = [], 0
    for line in sentences:
        start = time.perf_counter()
        (text,) = engine.translate_batch([line])
        seconds.append(time.perf_counter() - start)
        wrong += text != expected[line]
    return {
        "engine": engine.label,
        "sentences": len(sentences),
        "wrong": wrong,
        "p50_ms": round(1000 * statistics.median(seconds), 1),
    }


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    pool = [source for source, _ in generate_pairs(args.pool, seed=12345)]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        folder = Path(tmp)
        print(f"reference: attn translate on {len(pool)} sentences", file=sys.stderr, flush=True)
        expected, baseline = reference(args, pool, folder)
        alone = engine_alone(args, pool[: args.requests], expected)
        runs = []
        with server(args, folder) as url:
            load(url, 4, 8, pool, expected)  # warm-up
            for clients in args.clients:
                print(f"{clients} client(s), {args.requests} requests", file=sys.stderr, flush=True)
                runs.append(load(url, clients, args.requests, pool, expected))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            total = args.stress_clients * args.stress_requests
            print(
                f"stress: {args.stress_clients} clients x {args.stress_requests} requests", file=sys.stderr, flush=True
            )
            stress = load(url, args.stress_clients, total, pool, expected)
            floor = http_floor(url, args.requests, alone["p50_ms"] / 1000)
            health = httpx.get(f"{url}/health").json()
    one = next((run for run in runs if run["clients"] == 1), None)
    results = harness.envelope(
        __name__,
        argv,
        ("httpx",),
        model=args.model,
        threads=args.threads,
        attn_translate=baseline,
        serve=runs,
        speedup_over_1_client={
            str(run["clients"]): round(run["requests_per_s"] / one["requests_per_s"], 2) for run in runs
        }
        if one
        else None,
        stress=stress,
        server_health_at_end=health,
        engine_alone=alone,
        http_floor=floor,
    )
    harness.write_results(args.output, results, markdown(results))
    return results


def markdown(results: dict) -> str:
    lines = [
        f"Model {results['model']}, "
        + ("no --threads (the default)." if results["threads"] == "default" else f"{results['threads']} thread(s)."),
        "",
        "| clients | requests | problems | requests/s | p50 latency ms | p99 latency ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in [*results["serve"], {**results["stress"], "clients": f"stress: {results['stress']['clients']}"}]:
        cells = [run.get(key) for key in ("clients", "requests", "problems", "requests_per_s")]
        cells += [run.get("latency_p50_ms"), run.get("latency_p99_ms")]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    alone = results.get("engine_alone")
    if alone:
        lines += [
            "",
            f"The engine alone ({alone['engine']}, in the bench's process, one sentence a call, no HTTP): p50 "
            f"{alone['p50_ms']} ms over {alone['sentences']} sentences ({alone['wrong']} unlike the reference).",
        ]
    floor, one = results.get("http_floor"), next((run for run in results["serve"] if run["clients"] == 1), None)
    if floor and one and one["latency_p50_ms"] is not None:
        lines += [
            "",
            f"The HTTP floor (GET /health, a no-op, the same httpx client, {floor['requests']} requests): p50 "
            f"{floor['p50_ms']} ms back to back, {floor['p50_ms_after_idle']} ms after {floor['idle_ms']} ms idle. "
            f"1 client's p50 less the floor: {one['latency_p50_ms'] - floor['p50_ms']:.1f} ms "
            f"({one['latency_p50_ms'] - floor['p50_ms_after_idle']:.1f} ms less the floor after idle).",
        ]
    return "\n".join(lines) + "\n"


def failed(results: dict) -> bool:
    """Whether `python -m bench serve` exits with status 1: a lost or wrong answer."""
    return results["stress"]["problems"] != 0 or any(run["problems"] != 0 for run in results["serve"])
