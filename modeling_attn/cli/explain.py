"""`attn explain`: how a trained model translates one sentence, as one interactive, self-contained HTML page.

`attn explain --model DIR [--model DIR2] "a sentence" --output explain.html` runs the model (or two models, shown
side by side) on the sentence and writes a page with the model's own numbers: the translation token by token, the
beam search tree, the cross-attention of every layer and head, the Transformer's encoder and masked decoder
self-attention, one head's attention computed step by step, and the RNN's alignment step
(`modeling_attn.api.explain`; docs/explain.md). The page holds its script, style and data: it opens from `file://`
with no network.

The flags are dataclasses parsed by `parser.CommandParser` (the `attn` convention; `parse_flags` of
`options.py`); `--model` is given once per model. An existing `--output` file is replaced only if it is an
explainer page, or with `--force`; a user error is one line `attn explain: error: ...` with exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.choices import ATTENTION_KINDS
from ..api.errors import CommandLineError
from ..api.values import COUNT
from .options import parse_flags, shown_defaults
from .parser import CommandParser
from .report import run_command

PROG = "attn explain"


@dataclass
class ExplainArguments:
    """`attn explain`'s flags."""

    # `append`: one value per --model, collected in a list (a list-typed field would make `--model A B sentence`
    # swallow the sentence as a third model)
    model: str | None = field(
        default=None,
        metadata={
            "help": "Model folder or Hub repo (with its tokenizer); give --model twice to show two models "
            "side by side.",
            "action": "append",
            "aliases": ["--model_name_or_path"],
        },
    )
    output: str | None = field(default=None, metadata={"help": "The HTML file to write.", "metavar": "FILE"})
    force: bool = field(default=False, metadata={"help": "Replace --output even if it is not an explainer page."})
    num_beams: int | None = field(
        default=None,
        metadata={"help": "Beam size (default: the model's generation_config; 1: greedy).", "range": COUNT},
    )
    length_penalty: float | None = field(
        default=None, metadata={"help": "Beam search length penalty (default: the model's generation_config)."}
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Longest translation in tokens (default: the model's generation_config).", "range": COUNT},
    )
    walkthrough: str = field(
        default="cross",
        metadata={"help": "The Transformer attention computed step by step on the page.", "choices": ATTENTION_KINDS},
    )
    walkthrough_layer: int | None = field(
        default=None, metadata={"help": "Its layer, 1 = the first (default: the last layer).", "range": COUNT}
    )
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1... (default: cuda if available)."})


def explain_parser() -> CommandParser:
    parser = CommandParser(
        ExplainArguments,
        prog=PROG,
        description="Write an interactive page of how one model (or two, side by side) translates a sentence: "
        "beam search, cross- and self-attention per layer and head, one head computed, the RNN's alignment step.",
    )
    parser.add_argument("sentence", nargs="*", metavar="SENTENCE", help="the sentence to translate (quote it)")
    return shown_defaults(parser)


def main(argv: list[str] | None = None) -> int:
    """`attn explain`: see the module docstring and `attn explain --help`."""
    return run_command(PROG, lambda: explain(argv))


def explain(argv: list[str] | None) -> int:
    parser = explain_parser()
    args = parse_flags(parser, argv)
    if not args.model:
        raise CommandLineError("the following arguments are required: --model")
    if len(args.model) > 2:
        raise CommandLineError(f"--model given {len(args.model)} times; the page shows one model or two side by side")
    if args.output is None:
        raise CommandLineError("the following arguments are required: --output")
    if len(args.sentence) != 1:
        raise CommandLineError(f"give the sentence as one argument (quote it); got {len(args.sentence)} arguments")
    from ..api.explain import write_explainer

    generation = {name: getattr(args, name) for name in ("num_beams", "length_penalty", "max_new_tokens")}
    layer = None if args.walkthrough_layer is None else args.walkthrough_layer - 1
    path = write_explainer(
        args.model,
        args.sentence[0],
        args.output,
        force=args.force,
        device=args.device,
        walkthrough=(args.walkthrough, layer),
        **{name: value for name, value in generation.items() if value is not None},
    )
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): open it in a browser")
    return 0


__all__ = ["ExplainArguments", "explain_parser", "main"]
