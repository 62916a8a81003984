"""The Multi30k recipe: train with `attn train`, translate test2016 with beam search, score it three ways.

    python -m bench multi30k --source_lang en --target_lang de --output_dir outputs/m30k-en-de
    python -m bench multi30k --source_lang de --target_lang en --model_type attn_rnn --output_dir outputs/m30k-rnn
    python -m bench multi30k ... --evaluate_only          # score the model already in --output_dir

1. Training: `attn train` with the flags of `configuration/multi30k-transformer.yaml` or `multi30k-rnn.yaml`, then
   any `attn train` flag given after ours (they win: `--max_steps 500`), on `--data` (default
   `../shared/data/multi30k`; test split `test_2016_flickr`); the average of the last checkpoints is saved.
2. Test: the saved model translates test2016 with `--num_beams` (5) via `modeling_attn.cli.evaluate.evaluate`, with
   the length penalty of `--length_penalties` that scores best on the validation split (written into the model's
   generation_config.json by `modeling_attn.api.hub.paper_generation_config`); the test split plays no part in it.
3. Scores: sacreBLEU (cased, 13a) and chrF on the raw text, with signatures, and BLEU on lowercased Moses-tokenized
   text (`bleu.py`: the reference numbers' way). Written to `--output_dir/multi30k_results.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path

import torch
import yaml

from .. import harness
from .bleu import lowercased_tokenized_bleu

RECIPES = {"attn_transformer": "multi30k-transformer.yaml", "attn_rnn": "multi30k-rnn.yaml"}
DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def recipe_flags(model_type: str) -> list[str]:
    """The `attn train` flags of the model type's recipe YAML, as command-line arguments."""
    text = (resources.files("modeling_attn.configuration") / RECIPES[model_type]).read_text()
    flags = []
    for key, value in yaml.safe_load(text).items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and the rest: `attn train` flags that override the recipe's."""
    parser = argparse.ArgumentParser(prog="python -m bench multi30k", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Multi30k folder (default ../shared/data/multi30k)")
    parser.add_argument("--source_lang", required=True, help="en, de or fr")
    parser.add_argument("--target_lang", required=True, help="en, de or fr")
    parser.add_argument("--model_type", default="attn_transformer", choices=sorted(RECIPES))
    parser.add_argument("--output_dir", required=True, help="training output and the model to evaluate")
    parser.add_argument("--num_beams", type=int, default=5, help="beam size of the test translation (5)")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per generate() call (64)")
    parser.add_argument("--max_test_samples", type=int, help="translate only the first N test (and validation) pairs")
    parser.add_argument(
        "--length_penalties",
        type=float,
        nargs="+",
        default=[0.6, 1.0, 1.5, 2.0],
        help="beam length penalties tried on the validation split; the best is used on test (one value: no search)",
    )
    parser.add_argument("--evaluate_only", action="store_true", help="skip training; score --output_dir's model")
    return parser.parse_known_args(argv)


def train(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], float]:
    """Run `attn train` with the recipe's flags; returns the command line and the wall time in seconds."""
    from modeling_attn.cli.train import train as attn_train

    command = [
        "--data",
        args.data,
        "--source_lang",
        args.source_lang,
        "--target_lang",
        args.target_lang,
        "--model_type",
        args.model_type,
        "--output_dir",
        args.output_dir,
        *recipe_flags(args.model_type),
        *extra,
    ]
    start = time.perf_counter()
    status = attn_train(command)
    if status != 0:
        raise SystemExit(f"attn train failed with status {status}")
    return command, time.perf_counter() - start


def test_and_validation(args: argparse.Namespace, with_validation: bool) -> tuple:
    """The test split and (`with_validation`) the validation split of `--data`, each cut to `--max_test_samples`."""
    from modeling_attn.training.data import load_parallel_data, require_splits

    parallel = load_parallel_data(args.data, args.source_lang, args.target_lang)
    splits = ["test", "validation"] if with_validation else ["test"]
    require_splits(parallel, splits, args.data)

    def first_pairs(name: str):
        table = parallel.splits[name]
        return table.select(range(min(args.max_test_samples, len(table)))) if args.max_test_samples else table

    return first_pairs("test"), (first_pairs("validation") if with_validation else None)


def translate_split(
    model, tokenizer, split, length_penalty: float, num_beams: int, batch_size: int
) -> tuple[dict, list]:
    """`attn evaluate`'s translation and scores (sacreBLEU, chrF) of a split's pairs with beam search."""
    from modeling_attn.cli.evaluate import evaluate as translate_and_score

    sources, references = list(split["source"]), list(split["target"])
    return translate_and_score(
        model, tokenizer, sources, references, batch_size, num_beams=num_beams, length_penalty=length_penalty
    )


def validation_choice(
    model, tokenizer, validation, target_lang: str, length_penalties: list[float], num_beams: int, batch_size: int
) -> dict[float, float]:
    """The validation split's lowercased tokenized BLEU with each length penalty ({} without a validation split):
    the test is translated with the best, so that the test split plays no part in the choice."""
    selection = {}
    for length_penalty in length_penalties if validation is not None else []:
        _, hypotheses = translate_split(model, tokenizer, validation, length_penalty, num_beams, batch_size)
        score, _ = lowercased_tokenized_bleu(hypotheses, list(validation["target"]), target_lang)
        selection[length_penalty] = round(score.score, 2)
    return selection


def evaluate(args: argparse.Namespace) -> dict:
    """Translate test2016 with the model in --output_dir and score it (sacreBLEU, chrF, lowercased tokenized BLEU)."""
    from modeling_attn.api.hub import paper_generation_config
    from modeling_attn.api.translation import load_model

    test, validation = test_and_validation(args, with_validation=len(args.length_penalties) > 1)
    model, tokenizer = load_model(args.output_dir)
    output_dir = Path(args.output_dir)
    decoding = {"num_beams": args.num_beams, "batch_size": args.batch_size}
    selection = validation_choice(model, tokenizer, validation, args.target_lang, args.length_penalties, **decoding)
    length_penalty = args.length_penalties[0] if validation is None else max(selection, key=selection.get)  # 1st tie
    # The model's decoding (modeling_attn.api.hub's one owner of it) with the test's beams and length penalty:
    # the folder saved here, and what `attn push` uploads with multi30k_results.json, decode as the test did.
    chosen = {"num_beams": args.num_beams, "length_penalty": length_penalty}
    model.generation_config = paper_generation_config(model, chosen)
    model.generation_config.save_pretrained(output_dir)
    start = time.perf_counter()
    scores, hypotheses = translate_split(model, tokenizer, test, length_penalty, **decoding)
    seconds = time.perf_counter() - start
    lc_bleu, lc_signature = lowercased_tokenized_bleu(hypotheses, list(test["target"]), args.target_lang)
    (output_dir / f"test2016.hyp.{args.target_lang}").write_text("".join(f"{h}\n" for h in hypotheses), "utf-8")
    return {
        "direction": f"{args.source_lang}-{args.target_lang}",
        "model_type": model.config.model_type,
        "parameters": model.num_parameters(),
        "test_sentences": len(hypotheses),
        "num_beams": args.num_beams,
        "length_penalty": length_penalty,
        "validation_bleu_lc_tok_by_length_penalty": {str(k): v for k, v in selection.items()},
        "bleu_lc_tok": round(lc_bleu.score, 2),
        "bleu_lc_tok_detail": str(lc_bleu),
        "bleu_lc_tok_signature": lc_signature,
        "sacrebleu": round(scores["bleu"], 2),
        "sacrebleu_signature": scores["bleu_signature"],
        "chrf": round(scores["chrf"], 2),
        "chrf_signature": scores["chrf_signature"],
        "translate_seconds": round(seconds, 1),
    }


def check_data(folder: str, source_lang: str) -> None:
    """One line and exit status 2 where `folder` holds no Multi30k training file: where to get it."""
    if not list(Path(folder).glob(f"train.{source_lang}*")):
        print(
            f"python -m bench multi30k: error: no Multi30k training file train.{source_lang}[.gz] in {folder}; get "
            "the data as docs/multi30k.md ('Get the data') says and pass its folder with --data",
            file=sys.stderr,
        )
        raise SystemExit(2)


def main(argv: list[str]) -> dict:
    args, extra = parse_args(argv)
    check_data(args.data, args.source_lang)
    if args.evaluate_only and extra:
        raise SystemExit(f"--evaluate_only takes no attn train flags, got {extra}")
    results_path = Path(args.output_dir) / "multi30k_results.json"
    results = harness.envelope(__name__, argv, torch_threads=torch.get_num_threads())
    if not args.evaluate_only:
        command, seconds = train(args, extra)
        results.update(attn_train_args=command, train_seconds=round(seconds, 1))
    elif results_path.is_file():  # keep the training record of an earlier run
        results.update(
            {k: v for k, v in json.loads(results_path.read_text()).items() if k.startswith(("attn", "train"))}
        )
    results.update(evaluate(args))
    scores = ("bleu_lc_tok", "sacrebleu", "chrf", "length_penalty")
    table = "| " + " | ".join(scores) + " |\n|" + " --- |" * len(scores) + "\n| "
    table += " | ".join(str(results.get(key)) for key in scores) + " |\n"
    harness.write_results(results_path.with_suffix(""), results, table, quiet=True)
    print(json.dumps(results, indent=2))
    return results
