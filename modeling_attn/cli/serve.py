"""`attn serve`: a translation server over HTTP (FastAPI on uvicorn), for a model folder or Hub repo.

    attn serve --model outputs/dates [--host 127.0.0.1] [--port 8000] [--quantize int8] [--threads N]
    curl -s localhost:8000/translate -H 'content-type: application/json' -d '{"text": ["3 March 1987"]}'
    curl -s localhost:8000/translate -H 'content-type: application/json' -d '{"text": ["3 March 1987"],
         "alignment": "hard"}'                            # with word alignments, as `attn translate --align`

The endpoints, the batching of concurrent requests into token batches (`--max_batch_tokens`, `--max_wait_ms`), what
is refused and how, and the shutdown on SIGTERM (requests in flight are answered) are those of
`modeling_attn.api.server`; the OpenAPI page is at `/docs`. The server binds 127.0.0.1 unless `--host` says otherwise
(0.0.0.0: every interface; there is no authentication). Needs the `serve` extra: `pip install modeling-attn[serve]`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..api.quantize import QUANTIZE_CHOICES, quantize, quantize_device
from ..api.translation import TranslateError, load_model
from ..api.values import COUNT, NON_NEGATIVE, Range
from .parser import CommandParser

PORT = Range(low=0, high=65535, integer=True)


@dataclass
class ServeArguments:
    """`attn serve`'s flags."""

    model: str = field(
        metadata={"help": "Model folder or Hub repo (with its tokenizer).", "aliases": ["--model_name_or_path"]}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind (0.0.0.0: every interface)."})
    port: int = field(default=8000, metadata={"help": "TCP port (0: any free port).", "range": PORT})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1... (default: cuda if available)."})
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads for torch (torch.set_num_threads; default: torch's own choice).",
            "range": COUNT,
        },
    )
    quantize: str | None = field(
        default=None,
        metadata={"help": "int8: dynamic int8 Linear layers, on the CPU (modeling_attn.api.quantize).",
                  "choices": list(QUANTIZE_CHOICES)},
    )  # fmt: skip
    max_batch_tokens: int = field(
        default=8192,
        metadata={"help": "Rows decoded per generate() call: sentences x longest (tokens) x beams.", "range": COUNT},
    )
    max_wait_ms: float = field(
        default=10.0,
        metadata={"help": "Longest time a sentence waits for others to share its batch.", "range": NON_NEGATIVE},
    )
    max_queue: int = field(
        default=1024,
        metadata={"help": "Sentences that may wait; a request that does not fit answers 503.", "range": COUNT},
    )
    max_body_bytes: int = field(
        default=1 << 20, metadata={"help": "Largest request body; a larger one answers 413.", "range": COUNT}
    )
    log_level: str = field(
        default="info",
        metadata={"help": "uvicorn's log level.", "choices": ["critical", "error", "warning", "info", "debug"]},
    )

    def __post_init__(self) -> None:
        quantize_device(self.device, self.quantize)  # a GPU with --quantize: one line, before any loading


def serve_parser() -> CommandParser:
    return CommandParser(
        ServeArguments,
        prog="attn serve",
        description="Serve a translation model over HTTP: POST /translate, GET /health, GET /model, /docs.",
    )


def main(argv: list[str] | None = None) -> int:
    """`attn serve`: see the module docstring and `attn serve --help`."""
    (args,) = serve_parser().parse(argv)
    try:
        import uvicorn

        from ..api.server import ServeLimits, create_app, describe_model
    except ImportError as error:
        print(f"attn serve: error: {error.name} is not installed; pip install 'modeling-attn[serve]'", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_model(args.model, quantize_device(args.device, args.quantize))
        info = describe_model(model, args.model, args.quantize)  # before quantizing: the float model's size
        model = quantize(model, args.quantize)
    except (OSError, TranslateError) as error:
        print(f"attn serve: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    limits = ServeLimits(args.max_batch_tokens, args.max_wait_ms, args.max_queue, args.max_body_bytes)
    app = create_app(model, tokenizer, limits, info)
    # uvicorn stops accepting connections on SIGTERM / Ctrl-C and waits for the requests in flight; a second
    # signal ends at once.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


__all__ = ["ServeArguments", "main", "serve_parser"]
