"""Dynamic int8 quantization against float32 and against CTranslate2 int8 of the same weights, on the CPU.

Two parts (`--parts`), written to `--output` (default bench/results/int8-cpu.{json,md}); docs/serve.md has the method:
1. speed, `--preset` (default `base`) with random weights, beam `--beams`: float32, `quantize_int8` per engine of
   `--engines` (the one `--quantize int8` picks here marked "default"), `quantize_int8_rowwise`, and CTranslate2
   int8/float32 exports of the same weights; lengths forced (`--lengths`: `min_new_tokens`, or `no_eos`: the end
   token unset, no logits processor); 1 thread and all (`--threads`); `harness.interleaved_clocks` rounds, median
   target tokens/s by wall clock and by this process's CPU time;
2. quality, with a trained model (`--model DIR`): the test split of `--data` translated in float32, int8 and
   CTranslate2 int8: sacreBLEU, chrF, translations changed, seconds; then `--alone` sentences one at a time.

    python -m bench int8 --model outputs/dates                          # dates task, base preset speed
    python -m bench int8 --model outputs/m30k-en-de --data ../shared/data/multi30k --source_lang en --target_lang de
    python -m bench int8 --quick                                        # tiny preset, a few sentences (a check)
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from modeling_attn.api.quantize import int8_engine, quantize_int8, quantize_int8_rowwise

from . import harness
from .common import PAD, generation_settings, make_batches, reference_model
from .harness import log, scratch_folder

ENGINES = list(torch.backends.quantized.supported_engines)
DEFAULT = int8_engine()  # the engine of `--quantize int8` on this CPU
ROWWISE = "int8 (rowwise)"  # `--quantize int8_rowwise`


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench int8", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base", help="model preset of the speed part (base)")
    parser.add_argument("--beams", type=int, default=4, help="beam size (4)")
    parser.add_argument("--batch_size", type=int, default=16, help="sentences per generate() call (16)")
    parser.add_argument("--batches", type=int, default=2, help="batches per timed run (2)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each model (3)")
    parser.add_argument("--threads", type=int, nargs="+", help="thread counts to time (default: 1 and all)")
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=[e for e in ("x86", "onednn") if e in ENGINES],
        help="quantized engines to measure (default: x86 and onednn, those this torch has)",
    )
    for flag, choices, text in (
        ("--lengths", ["min_new_tokens", "no_eos"], "how the speed part forces lengths (both; see the docstring)"),
        ("--parts", ["speed", "quality"], "what to measure (both; quality needs --model)"),
    ):  # one or more of the choices, all by default
        parser.add_argument(flag, nargs="+", default=list(choices), choices=choices, help=text)
    parser.add_argument("--model", help="a trained model folder for the quality part (skipped without one)")
    parser.add_argument(
        "--alone",
        type=int,
        default=160,
        help="quality part: also translate the first N test sentences one at a time, counting the "
        "translations that differ from the batched ones (160)",
    )
    parser.add_argument("--data", help="test data as attn evaluate reads it (default: the embedded dates task)")
    parser.add_argument("--source_lang")
    parser.add_argument("--target_lang")
    parser.add_argument("--max_samples", type=int, help="translate only the first N test pairs")
    parser.add_argument("--quality_threads", type=int, default=1, help="threads of the quality part (1)")
    parser.add_argument("--quick", action="store_true", help="tiny preset, 1 batch of 4, 1 rep, 16 test pairs")
    parser.add_argument("--output", default=str(harness.RESULTS / "int8-cpu"), help="JSON/MD stem")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.batch_size, args.batches, args.reps = "tiny", 4, 1, 1
        args.max_samples = args.max_samples or 16
    args.threads = args.threads or sorted({1, torch.get_num_threads()})
    return args


# -- part 1: speed -------------------------------------------------------------------------------------------------


def ct2_translator(model: torch.nn.Module, quantization: str, threads: int):
    from modeling_attn.api.export_ctranslate2 import CTranslate2Translator, export_ctranslate2

    folder = scratch_folder(f"bench-int8-ct2-{quantization}-") / "model"
    export_ctranslate2(model, folder, quantization=quantization)
    return CTranslate2Translator(
        folder, device="cpu", compute_type=quantization, inter_threads=1, intra_threads=threads
    )


def speed(args: argparse.Namespace) -> dict:
    model = reference_model(args.preset, 512, seed=0).eval()
    batches = make_batches(args.batches, args.batch_size, model.config.vocab_size, seed=1, max_length=100)
    tokens = sum(batch.input_ids.shape[0] * max(batch.target_lengths) for batch in batches)
    engines = {int8_name(engine): quantize_int8(model, engine=engine) for engine in args.engines}
    engines[ROWWISE] = quantize_int8_rowwise(model)
    results = {
        "preset": args.preset,
        "parameters": model.num_parameters(),
        "beams": args.beams,
        "sentences": args.batch_size * args.batches,
        "target_tokens_per_run": tokens,
        "threads": {},
    }
    for threads, lengths in [(threads, lengths) for threads in args.threads for lengths in args.lengths]:
        torch.set_num_threads(threads)
        runs = {"float32": lambda m=model, how=lengths: _generate_ours(m, batches, args.beams, how)}
        for name, quantized in engines.items():
            runs[name] = lambda m=quantized, how=lengths: _generate_ours(m, batches, args.beams, how)
        for quantization in ("int8", "float32"):
            try:
                translator = ct2_translator(model, quantization, threads)
            except ImportError as error:
                log(f"CTranslate2 not measured: {error}")
                break
            runs[f"CTranslate2 {quantization}"] = lambda t=translator: _generate_ct2(t, batches, args.beams)
        log(f"{threads} thread(s), lengths by {lengths}: timing {', '.join(runs)}")
        seconds = harness.interleaved_clocks(runs, args.reps, log_each=True)
        results["threads"].setdefault(str(threads), {})[lengths] = {
            name: {
                "wall_tokens_per_s": round(tokens / statistics.median(s["wall"]), 1),
                "cpu_tokens_per_s": round(tokens / statistics.median(s["cpu"]), 1),
                "wall_seconds": [round(v, 3) for v in s["wall"]],
                "cpu_seconds": [round(v, 3) for v in s["cpu"]],
            }
            for name, s in seconds.items()
        }
    return results


def int8_name(engine: str) -> str:
    """The row name of `quantize_int8(model, engine=engine)`, "default" marking `--quantize int8`'s engine here."""
    return f"int8 ({engine}{', default' if engine == DEFAULT else ''})"


def _generate_ours(model: torch.nn.Module, batches: list, beams: int, lengths: str) -> None:
    with torch.inference_mode():
        for batch in batches:
            settings = generation_settings(beams, max(batch.target_lengths))
            if lengths == "no_eos":
                settings.min_new_tokens = settings.eos_token_id = None
            out = model.generate(batch.input_ids, attention_mask=batch.attention_mask, generation_config=settings)
            assert out.shape[1] == 1 + max(batch.target_lengths), (out.shape, lengths)  # the start token + forced


def _generate_ct2(translator, batches: list, beams: int) -> None:
    for batch in batches:
        sources = [row[row != PAD].tolist() for row in batch.input_ids]
        length = max(batch.target_lengths)
        translator.translate_ids(sources, beam_size=beams, min_decoding_length=length, max_decoding_length=length)


# -- part 2: quality -----------------------------------------------------------------------------------------------


def quality(args: argparse.Namespace) -> dict:
    from modeling_attn.api.metrics import translation_scores, writes_lowercase
    from modeling_attn.api.translation import load_model
    from modeling_attn.cli.evaluate import evaluate, load_evaluation_set

    torch.set_num_threads(args.quality_threads)
    split = load_evaluation_set(
        SimpleNamespace(
            hypotheses_file=None,
            sources_file=None,
            references_file=None,
            data=args.data,
            data_config=None,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            split="test",
        )
    )
    if args.max_samples:
        split.first(args.max_samples)
    model, tokenizer = load_model(args.model, "cpu")
    results = {
        "model": args.model,
        **split.details,
        "sentences": len(split.sources),
        "threads": args.quality_threads,
        "generation": model.generation_config.to_diff_dict(),
        "runs": {},
    }
    hypotheses = {}
    candidates = [("float32", model)]
    candidates += [(int8_name(engine), quantize_int8(model, engine=engine)) for engine in args.engines]
    candidates.append((ROWWISE, quantize_int8_rowwise(model)))
    alone = min(args.alone, len(split.sources))
    results["alone"] = alone
    for name, candidate in candidates:
        log(f"quality: translating {len(split.sources)} sentences with {name}, then the first {alone} one at a time")
        start = time.perf_counter()
        scores, hypotheses[name] = evaluate(candidate, tokenizer, split.sources, split.references, batch_size=32)
        results["runs"][name] = {**_scores(scores), "seconds": round(time.perf_counter() - start, 2)}
        _, one_by_one = evaluate(candidate, tokenizer, split.sources[:alone], split.references[:alone], batch_size=1)
        results["runs"][name]["changed_alone"] = sum(
            a != b for a, b in zip(one_by_one, hypotheses[name], strict=False)
        )
    if model.config.model_type == "attn_transformer":
        translator = ct2_translator(model, "int8", args.quality_threads)
        translator._tokenizer = tokenizer
        log("quality: translating with CTranslate2 int8")
        start, found = time.perf_counter(), []
        for first in range(0, len(split.sources), 32):
            found += translator.translate(split.sources[first : first + 32])
        seconds = time.perf_counter() - start
        scores = translation_scores(found, split.references, lowercase=writes_lowercase(tokenizer))
        one_by_one = [translator.translate([source])[0] for source in split.sources[:alone]]
        changed_alone = sum(a != b for a, b in zip(one_by_one, found, strict=False))
        results["runs"]["CTranslate2 int8"] = {
            **_scores(scores),
            "seconds": round(seconds, 2),
            "changed_alone": changed_alone,
        }
        hypotheses["CTranslate2 int8"] = found
    float_hypotheses = hypotheses["float32"]
    for name, found in hypotheses.items():
        results["runs"][name]["changed_vs_float32"] = sum(a != b for a, b in zip(found, float_hypotheses, strict=True))
    return results


def _scores(scores: dict) -> dict:
    return {
        key: round(scores[key], 2) if isinstance(scores[key], float) else scores[key]
        for key in ("bleu", "chrf", "bleu_signature")
        if key in scores
    }


# -- report --------------------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    lines = ["# int8 on the CPU", ""]
    if results.get("speed"):
        lines += _speed_lines(results["speed"])
    if results.get("quality"):
        lines += _quality_lines(results["quality"])
    return "\n".join(lines) + "\n"


def _speed_lines(speed_part: dict) -> list[str]:
    lines = [
        f"## Speed: `{speed_part['preset']}` preset ({speed_part['parameters'] / 1e6:.1f}M parameters, random "
        f"weights), beam {speed_part['beams']}, {speed_part['sentences']} sentences, forced lengths",
        "",
        "Target tokens / second (median; wall clock and this process's CPU time). Lengths forced by "
        "`min_new_tokens` (its logits processor runs at every step) or by `no_eos` (no end token, no processor).",
        "",
        "| threads | lengths | model | wall tok/s | CPU tok/s | x float32 (wall) | x float32 (CPU) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, by_lengths in speed_part["threads"].items():
        for lengths, runs in by_lengths.items():
            base = runs["float32"]
            for name, run in runs.items():
                lines.append(
                    f"| {threads} | {lengths} | {name} | {run['wall_tokens_per_s']} | "
                    f"{run['cpu_tokens_per_s']} | {run['wall_tokens_per_s'] / base['wall_tokens_per_s']:.2f} | "
                    f"{run['cpu_tokens_per_s'] / base['cpu_tokens_per_s']:.2f} |"
                )
            for name in [name for name in runs if name.startswith("int8 (")] if "CTranslate2 int8" in runs else []:
                ours, ct2 = runs[name], runs["CTranslate2 int8"]
                wall, cpu = (ours[f"{clock}_tokens_per_s"] / ct2[f"{clock}_tokens_per_s"] for clock in ("wall", "cpu"))
                lines.append(f"| {threads} | {lengths} | {name} / CTranslate2 int8 | {wall:.2f} | {cpu:.2f} | | |")
    return lines


def _quality_lines(part: dict) -> list[str]:
    alone = part.get("alone", 0)
    lines = [
        "",
        f"## Quality: {part.get('data')} ({part.get('split')}, {part['sentences']} sentences), model {part['model']}",
        "",
        f"Batches of 32; the last column: of the first {alone} sentences, the "
        "translations that differ when each is translated alone.",
        "",
        "| run | BLEU | chrF | translations changed vs float32 | seconds | changed alone |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in part["runs"].items():
        lines.append(
            f"| {name} | {run['bleu']} | {run.get('chrf')} | {run['changed_vs_float32']} | "
            f"{run['seconds']} | {run.get('changed_alone')} |"
        )
    return lines


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    results = harness.envelope(
        __name__,
        argv,
        ("ctranslate2",),
        speed=speed(args) if "speed" in args.parts else None,
        quality=quality(args) if args.model and "quality" in args.parts else None,
    )
    harness.write_results(args.output, results, markdown(results))
    return results
