"""Streaming from `attn serve`: how soon a streamed document's first sentence arrives, and what the whole stream costs.

    python -m bench stream --model outputs/dates                       # writes bench/results/stream-dates.{json,md}
    python -m bench stream --model DIR --rounds 1 --output O           # a quick run (tests/test_bench.py)

A real `attn serve --model M --engine E` process on loopback (the engines' default threads unless `--threads`), one
httpx client over one keep-alive connection. The document: `--sentences` (5) sources of the embedded dates task's
test split, one a line (a line break ends a sentence, so it has exactly that many). Timed in interleaved rounds
(`harness.interleaved`, wall clock, medians): `one sentence`, the document's first sentence as a request of its own;
`document`, the document not streamed (`"format": "text"`); `document streamed` (`"stream": true`) to its `done`
event, and within it the time to its first `sentence` event. The issue's target: the first sentence within one
sentence's time + 20%. Checked before timing: the streamed events concatenate to the non-streamed document, and
`done` carries the same answer.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

from . import common, harness

TARGET = 1.2  # the first sentence of a stream within this many times one sentence's time (issue 58)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench stream", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (the README's: outputs/dates)")
    parser.add_argument("--engine", default="auto", help="the server's --engine (auto)")
    parser.add_argument("--threads", type=int, help="the server's --threads (default: none, the engines' own)")
    parser.add_argument("--sentences", type=int, default=5, help="sentences of the document (5)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds after a warm-up round (30)")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the record")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/stream-MODEL)")
    args = parser.parse_args(argv)
    args.output = args.output or harness.RESULTS / f"stream-{Path(args.model).name}"
    return args


def events(lines, started: float) -> list[tuple[str, dict, float]]:
    """The (name, data, seconds since `started`, a `perf_counter` reading) of each Server-Sent Event of a streamed
    answer's lines, as each arrives."""
    found, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((name, json.loads(line.removeprefix("data: ")), time.perf_counter() - started))
    return found


class Client:
    """The bench's requests to the server at `url`, over one keep-alive connection."""

    def __init__(self, url: str, document: str):
        import httpx

        self.http, self.url, self.document = httpx.Client(base_url=url, timeout=120), url, document
        self.first_event: list[float] = []  # seconds to each streamed call's first sentence event

    def translate(self, body: dict) -> dict:
        response = self.http.post("/translate", json=body)
        response.raise_for_status()
        return response.json()

    def one_sentence(self) -> dict:
        return self.translate({"text": [self.document.split("\n")[0]]})

    def whole(self) -> dict:
        return self.translate({"text": [self.document], "format": "text"})

    def streamed(self) -> list[tuple[str, dict, float]]:
        body = {"text": [self.document], "format": "text", "stream": True}
        started = time.perf_counter()
        with self.http.stream("POST", "/translate", json=body) as response:
            response.raise_for_status()
            found = events(response.iter_lines(), started)
        self.first_event.append(next(seconds for name, _, seconds in found if name == "sentence"))
        return found


def check(client: Client) -> dict:
    """The streamed answer against the non-streamed one: concatenation, `done`, the first event's index."""
    whole = client.whole()["translations"][0]["text"]
    found = client.streamed()
    joined = "".join(data["text"] for name, data, _ in found if name == "sentence")
    return {
        "concatenation_equals_the_answer": joined == whole,
        "done_equals_the_answer": found[-1][0] == "done" and found[-1][1]["translations"][0]["text"] == whole,
        "first_event_is_sentence_0": found[0][0] == "sentence" and found[0][1]["index"] == 0,
        "sentence_events": sum(name == "sentence" for name, _, _ in found),
    }


def markdown(report: dict) -> str:
    ms = {name: 1000 * value for name, value in report["median_s"].items()}
    lines = [
        f"A {report['sentences']}-sentence document (the dates task, one a line) from `attn serve --engine "
        f"{report['engine']}` over HTTP (httpx, loopback), {report['rounds']} interleaved rounds, medians.",
        "",
        "| request | ms |",
        "| --- | ---: |",
        *(f"| {name} | {value:.1f} |" for name, value in ms.items()),
        "",
        f"First sentence / one sentence: **{report['first_sentence_over_one_sentence']:.2f}x** (target <= {TARGET}); "
        f"whole stream / the document not streamed: **{report['stream_over_document']:.2f}x**.",
        "",
        "Checks: " + ", ".join(f"{name} {value}" for name, value in report["checks"].items()) + ".",
    ]
    if report.get("note"):
        lines += ["", f"Note: {report['note']}"]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    sentences = common.dates_sentences(args.sentences)
    document = "\n".join(sentences)
    flags = ["--model", args.model, "--engine", args.engine, "--log_level", "warning"]
    flags += [] if args.threads is None else ["--threads", str(args.threads)]
    report = harness.envelope(
        __name__, argv, ("ctranslate2", "fastapi", "uvicorn", "httpx"), model=args.model, engine=args.engine
    )
    report.update(threads=args.threads, sentences=len(sentences), rounds=args.rounds, document=document)
    report["server"] = "attn serve " + shlex.join(flags)
    folder = harness.scratch_folder("bench-stream-")
    with common.attn_server(flags, folder / "serve.log") as url:
        client = Client(url, document)
        report["checks"] = check(client)
        client.first_event.clear()
        tasks = {"one sentence": client.one_sentence, "document": client.whole, "document streamed": client.streamed}
        seconds = harness.interleaved(tasks, args.rounds)
    first = client.first_event[1:]  # the warm-up call's left out, as `interleaved` leaves it out
    report["seconds"] = {**seconds, "first sentence of the stream": first}
    report["median_s"] = {name: statistics.median(values) for name, values in report["seconds"].items()}
    median = report["median_s"]
    report["first_sentence_over_one_sentence"] = median["first sentence of the stream"] / median["one sentence"]
    report["stream_over_document"] = median["document streamed"] / median["document"]
    report["note"] = args.note
    harness.write_results(args.output, report, markdown(report))
    return report
