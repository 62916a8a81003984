"""The `attn` command line: `attn preset` (model presets), `attn train` (the training recipe, see
`training/train.py`; every Seq2SeqTrainingArguments flag is accepted), `attn average` (checkpoint averaging),
`attn translate` and `attn evaluate` (`translate.py`: translation, attention pictures, BLEU/chrF), `attn push`
(`push.py`: upload to the Hugging Face Hub), `attn convert` (`convert_marian.py`: Marian / OPUS-MT checkpoints to
attn_transformer and back) and `attn export` (`export_ctranslate2.py`: CTranslate2).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..presets import available_presets, load_preset


def _average(args: argparse.Namespace) -> int:
    from training.averaging import average_checkpoints, find_checkpoints

    checkpoints = []
    for path in args.inputs:
        found = find_checkpoints(path)
        checkpoints += found[-args.last :] if found else [path]  # a training folder: its last N checkpoints
    print(f"averaging {len(checkpoints)} checkpoints: {', '.join(map(str, checkpoints))}")
    average_checkpoints(checkpoints, args.output_dir)
    print(f"saved the averaged model in {args.output_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # Trainer's own flags are parsed by HfArgumentParser, not here
        from training.train import cli_main as train

        return train(argv[1:])
    if argv[:1] in (["convert"], ["export"]):  # Marian conversion, CTranslate2 export: their own parsers
        from .convert_marian import main as convert
        from .export_ctranslate2 import main as export

        return (convert if argv[0] == "convert" else export)(argv[1:])
    if argv[:1] == ["push"]:  # Hub upload (push.py)
        from .push import push_main

        return push_main(argv[1:])
    if argv[:1] in (["translate"], ["evaluate"]):  # their own parsers (translate.py) give `attn translate --help`
        from .evaluate import evaluate_main
        from .translate import translate_main

        return (translate_main if argv[0] == "translate" else evaluate_main)(argv[1:])

    parser = argparse.ArgumentParser(prog="attn", description="modeling-attn: attention models for transformers")
    commands = parser.add_subparsers(dest="command", required=True)
    preset = commands.add_parser("preset", help="list the model presets, or print one as a config JSON")
    preset.add_argument("name", nargs="?", help="preset to print (omit to list them)")
    commands.add_parser(
        "train", help="train or fine-tune a translation model (the paper's recipe; `attn train --help` for the flags)"
    )
    commands.add_parser("translate", help="translate sentences (arguments, --input FILE or stdin); attention pictures")
    commands.add_parser("evaluate", help="BLEU and chrF (sacreBLEU) of a model on a data split, as JSON")
    commands.add_parser("push", help="upload a trained model (code, tokenizer, generation config, card) to the Hub")
    commands.add_parser("convert", help="convert Marian (OPUS-MT) checkpoints to attn_transformer and back")
    commands.add_parser("export", help="export a model to CTranslate2 (`attn export MODEL --ctranslate2 DIR`)")
    average = commands.add_parser("average", help="average the weights of the last checkpoints (paper, Sec. 6.1)")
    average.add_argument("inputs", nargs="+", help="checkpoint folders, or a training output folder")
    average.add_argument("--output_dir", required=True, help="where to save the averaged model")
    average.add_argument("--last", type=int, default=5, help="from a training folder, its last N checkpoints (5)")
    args = parser.parse_args(argv)
    if args.command == "average" and args.last < 1:
        average.error(f"argument --last: must be a positive integer, got {args.last}")

    if args.command == "preset":
        if args.name is None:
            print("\n".join(available_presets()))
        else:
            print(json.dumps(load_preset(args.name).to_diff_dict(), indent=2))
    elif args.command == "average":
        return _average(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
