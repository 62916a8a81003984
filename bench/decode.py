"""Every decoding engine on one model, as `attn translate --engine NAME` runs it: sentences/s and agreement.

    python -m bench decode --model outputs/dates --sentences 64               # the README's model, its test split
    python -m bench decode --preset base --sentences 32 --max_new_tokens 30   # random weights, forced lengths
    python -m bench decode --quick                                            # tiny random model, one round

Engines (`--engines`): torch, ctranslate2, onnxruntime and auto opened with `load_translator`, float32 and with
`--quantize int8` where the engine has it; "generate()", the model's `generate()` as `translate_batch` ran it before
the torch engine's own loop; and the peer, "CTranslate2 direct" (float32, int8): the same export in a
`ctranslate2.Translator` called as its documentation shows, the reference of every ratio. Greedy and beam 4, batch 1
and `--batch_size`, all engines in interleaved rounds; "same" = translations equal to the torch engine's. `--model`
takes a trained folder and the dates task's test sources; `--preset` random weights, a word-level tokenizer,
Multi30k-like lengths and exactly `--max_new_tokens` tokens (a random model almost never ends a sentence).
`--threads` (1 by default): each setting is a row of every engine; N is what `--threads N` does (the peer:
`intra_threads=N`), `default` what a user naming none gets (the peer: CTranslate2's own default). Sentences/s: over
the median CPU time of this process with one thread, else over the median wall-clock time (what a user waits).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from . import common, harness

ENGINES = [
    "CTranslate2 direct",
    "CTranslate2 direct int8",
    "generate()",
    "torch",
    "torch int8",
    "ctranslate2",
    "ctranslate2 int8",
    "onnxruntime",
    "auto",
    "auto int8",
]
PEER = "CTranslate2 direct"  # the ratios' reference: CTranslate2 as a user calls it on the same export
SETTINGS = {"greedy": {"num_beams": 1}, "beam4": {"num_beams": 4}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench decode", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="a trained model folder (its sentences: the dates task's test split)")
    source.add_argument("--preset", help="a preset with random weights (configuration/)")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--single", type=int, default=None, help="sentences of the batch-1 runs (default: all)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=30, help="with --preset: tokens decoded per sentence")
    parser.add_argument(
        "--threads", nargs="+", default=["1"], type=thread_setting, help="numbers and/or `default` (default: 1)"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="default: 1 and --batch_size")
    parser.add_argument("--quick", action="store_true", help="the tiny preset, 8 sentences, one round")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/decode-NAME)")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.sentences, args.reps, args.batch_size, args.max_new_tokens = "tiny", 8, 1, 4, 6
    if args.model is None and args.preset is None:
        parser.error("give --model FOLDER (a trained model) or --preset NAME (random weights)")
    args.batches = args.batches or [1, args.batch_size]
    name = Path(args.model).name if args.model else args.preset
    args.output = args.output or harness.RESULTS / f"decode-{name}{'-quick' if args.quick else ''}"
    return args


def thread_setting(value: str) -> str:
    if value != "default" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: a number of threads or `default`")
    return value


def labelled(label: str, setting: str, settings: list[str]) -> str:
    """The row of `label` at thread `setting` (the label alone with one setting, as the records before it)."""
    if len(settings) == 1:
        return label
    return f"{label} ({'no --threads' if setting == 'default' else f'--threads {setting}'})"


def random_preset_folder(preset: str, sentences: int, max_new_tokens: int) -> tuple[Path, list[str]]:
    """`preset` with random weights saved with a word-level tokenizer of its vocabulary, its generation config set
    to decode `max_new_tokens` tokens, and `sentences` sentences of Multi30k-like lengths."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modeling_attn import AttnTransformerForConditionalGeneration
    from modeling_attn.api.presets import load_preset

    config = load_preset(preset, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    words = [f"w{i}" for i in range(config.vocab_size - 3)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{word: 3 + i for i, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    model = AttnTransformerForConditionalGeneration(config).eval()
    model.generation_config.update(max_new_tokens=max_new_tokens, num_beams=1, eos_token_id=2, pad_token_id=0)
    folder = harness.scratch_folder(f"decode-{preset}-")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 24, (sentences,), generator=generator).tolist()  # Multi30k's source words: 8-23
    texts = [" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=generator)) for n in lengths]
    return folder, texts


def open_engines(folder: Path, labels: list[str], settings: list[str]) -> dict[str, Callable]:
    """label -> translate(sentences, options) for each engine asked for at each thread setting (exports made now,
    before timing); each call first sets torch's threads as that setting's command would (its number, or torch's
    own count)."""
    own = torch.get_num_threads()
    opened = {}
    for setting in settings:
        threads = None if setting == "default" else int(setting)
        for label, run in open_at(folder, labels, threads).items():

            def call(batch, options, run=run, count=threads or own):
                torch.set_num_threads(count)
                return run(batch, options)

            opened[labelled(label, setting, settings)] = call
    return opened


def open_at(folder: Path, labels: list[str], threads: int | None) -> dict[str, Callable[[list[str], dict], list[str]]]:
    from modeling_attn.api import translation
    from modeling_attn.api.engines import load_translator

    opened = {}
    for label in labels:
        if label.startswith(PEER):
            opened[label] = direct_ctranslate2(folder, "int8" if label.endswith("int8") else "default", threads)
            continue
        if label == "generate()":
            model, tokenizer = translation.load_model(str(folder), "cpu")

            def generate(batch, options, model=model, tokenizer=tokenizer):
                # create=True: the same patch on a tree whose translate_batch has no loop of its own
                with harness.mock.patch.object(translation, "fast_generate", lambda *a, **k: None, create=True):
                    return translation.translate_batch(model, tokenizer, batch, **options)[0]

            opened[label] = generate
            continue
        name, _, quantize = label.partition(" ")
        engine = load_translator(str(folder), engine=name, device="cpu", quantize=quantize or None, threads=threads)
        opened[label] = lambda batch, options, engine=engine: engine.translate_batch(batch, **options)
    return opened


def direct_ctranslate2(folder: Path, compute_type: str, threads: int | None) -> Callable[[list[str], dict], list[str]]:
    """CTranslate2 on the engine's export, called directly: tokenize, translate_batch, decode (`threads` None:
    CTranslate2's own default, `intra_threads=0`)."""
    import ctranslate2
    from transformers import AutoTokenizer, GenerationConfig

    from modeling_attn.api.engines import load_translator

    export = load_translator(str(folder), engine="ctranslate2", device="cpu").export  # made (or found) once
    translator = ctranslate2.Translator(str(export), compute_type=compute_type, intra_threads=threads or 0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)

    def translate(batch: list[str], options: dict) -> list[str]:
        tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(batch)["input_ids"]]
        limit = config.max_new_tokens or max(len(row) for row in tokens) + config.max_length_over_source - 1
        results = translator.translate_batch(
            tokens,
            beam_size=options.get("num_beams", config.num_beams),
            length_penalty=1.0 if config.length_penalty is None else config.length_penalty,
            max_decoding_length=limit,
            min_decoding_length=0,  # generate() may end at once (CTranslate2's default forbids it)
            max_input_length=0,
        )
        ids = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    return translate


def run_setting(engines: dict, sentences: list[str], batch_size: int, options: dict, reps: int, clock: str) -> dict:
    chunks = [sentences[start : start + batch_size] for start in range(0, len(sentences), batch_size)]
    outputs = {label: [text for chunk in chunks for text in run(chunk, options)] for label, run in engines.items()}
    tasks = {label: (lambda run=run: [run(chunk, options) for chunk in chunks]) for label, run in engines.items()}
    seconds = harness.interleaved_clocks(tasks, reps)
    reference = next((outputs[label] for label in outputs if label.partition(" (")[0] == "torch"), None)
    reference = reference or next(iter(outputs.values()))
    results = {}
    for label in engines:
        results[label] = {
            "sentences_per_s": len(sentences) / statistics.median(seconds[label][clock]),
            "cpu_s": seconds[label]["cpu"],
            "wall_s": seconds[label]["wall"],
            "same_as_torch": sum(a == b for a, b in zip(outputs[label], reference, strict=True)),
        }
    return results


def markdown(report: dict) -> str:
    columns = list(report["results"])
    settings = report["threads"] if isinstance(report["threads"], list) else [str(report["threads"])]
    clock = "CPU time" if report.get("clock", "cpu") == "cpu" else "wall-clock time"
    lines = [
        f"{report['sentences']} sentences ({report['single']} at batch 1), threads: {', '.join(settings)}; "
        f"sentences/s by {clock} (median of the rounds); x = against CTranslate2 direct at the same thread setting "
        "in the same column (an int8 row: against CTranslate2 direct int8); same = translations equal to the torch "
        "engine's.",
        "",
        "| engine | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---:" for _ in columns) + " |",
    ]
    for label in report["engines"]:
        cells = []
        for column in columns:
            entry = report["results"][column].get(label)
            if entry is None:
                cells.append("")
                continue
            engine, _, setting = label.partition(" (")
            peer_label = PEER + (" int8" if engine.endswith("int8") else "") + (f" ({setting}" if setting else "")
            peer = report["results"][column].get(peer_label)
            ratio = f" ({entry['sentences_per_s'] / peer['sentences_per_s']:.2f}x)" if peer else ""
            total = report["single"] if column.startswith("batch 1 ") else report["sentences"]
            cells.append(f"{entry['sentences_per_s']:.1f}{ratio}, same {entry['same_as_torch']}/{total}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    argv = list(argv or [])
    args = parse_args(argv)
    clock = "cpu" if args.threads == ["1"] else "wall"
    if args.model:
        folder, sentences = Path(args.model), common.dates_sentences(args.sentences)
    else:
        folder, sentences = random_preset_folder(args.preset, args.sentences, args.max_new_tokens)
    single = sentences[: args.single or len(sentences)]
    engines = open_engines(folder, args.engines, args.threads)
    report = harness.envelope(
        __name__,
        argv,
        ("ctranslate2", "onnxruntime"),
        model=str(args.model or f"{args.preset} (random weights)"),
        sentences=len(sentences),
        single=len(single),
        threads=args.threads,
        clock=clock,
        engines=list(engines),
        results={},
    )
    for setting in args.settings:
        for batch_size in args.batches:
            column = f"batch {batch_size} {setting}"
            harness.log(f"{column} ...")
            texts = single if batch_size == 1 else sentences
            report["results"][column] = run_setting(engines, texts, batch_size, SETTINGS[setting], args.reps, clock)
            harness.write_results(args.output, report, markdown(report), quiet=True)
    harness.write_results(args.output, report, markdown(report))
    return report
