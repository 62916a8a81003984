"""`attn serve`: a translation server over HTTP (FastAPI on uvicorn), for a model folder or Hub repo.

    attn serve --model outputs/dates [--host 127.0.0.1] [--port 8000] [--quantize int8] [--threads N]
    curl -s localhost:8000/translate -H 'content-type: application/json' -d '{"text": ["3 March 1987"]}'
    curl -s localhost:8000/translate -H 'content-type: application/json' -d '{"text": ["3 March 1987"],
         "alignment": "hard"}'                            # with word alignments, as `attn translate --align`
    curl -sN localhost:8000/translate -H 'content-type: application/json' -d '{"text": ["3 March 1987. 4 May 1976."],
         "format": "text", "stream": true}'             # a document, streamed a sentence at a time (SSE)

The endpoints, the batching of concurrent requests into token batches (`--max_batch_tokens`, `--max_wait_ms`), what
is refused and how, and the shutdown on SIGTERM (requests in flight are answered) are those of
`modeling_attn.api.server` (the app) and `modeling_attn.api.batching` (the queue); the OpenAPI page is at `/docs`.
The server binds 127.0.0.1 unless `--host` says otherwise (0.0.0.0: every interface; there is no authentication).
Needs the `serve` extra: `pip install modeling-attn[serve]`.
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..api.errors import UserError
from ..api.values import COUNT, NON_NEGATIVE, Range
from .options import EnsembleArguments, RuntimeArguments, engine_for, load_models, parse_flags
from .parser import CommandParser
from .report import run_command

if TYPE_CHECKING:  # the `serve` extra, imported when the command runs
    import uvicorn

PORT = Range(low=0, high=65535, integer=True)


@dataclass
class ServeArguments:
    """`attn serve`'s flags."""

    model: str = field(
        metadata={
            "help": "Model folder or Hub repo (with its tokenizer); repeat it (--model A --model B) for an ensemble.",
            "aliases": ["--model_name_or_path"],
            "action": "append",
        }
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind (0.0.0.0: every interface)."})
    port: int = field(default=8000, metadata={"help": "TCP port (0: any free port).", "range": PORT})
    max_batch_tokens: int = field(
        default=8192,
        metadata={"help": "Rows decoded per generate() call: sentences x longest (tokens) x beams.", "range": COUNT},
    )
    max_wait_ms: float = field(
        default=0.0,
        metadata={
            "help": "Longest time a sentence waits for others to share its batch (0: none; sentences that arrive "
            "while a batch decodes form the next one).",
            "range": NON_NEGATIVE,
        },
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


def serve_parser() -> CommandParser:
    return CommandParser(
        (ServeArguments, RuntimeArguments, EnsembleArguments),
        prog="attn serve",
        description="Serve a translation model over HTTP: POST /translate, GET /health, GET /model, /docs.",
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for uvicorn to serve on, made before the slow model load so that an address
    this machine cannot listen on is named at once; OSError naming the flags otherwise."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise UserError(f"--host {host}: not an address this machine can resolve ({error.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own binding does
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    return sock


def _uvicorn_server(config: uvicorn.Config) -> uvicorn.Server:
    """uvicorn's Server, saying where it listens once started (uvicorn says so only for the sockets it binds)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and sockets:
                host, port = sockets[0].getsockname()[:2]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                logging.getLogger("uvicorn.error").info("Uvicorn running on %s (Press CTRL+C to quit)", url)

    return Server(config)


def main(argv: list[str] | None = None) -> int:
    """`attn serve`: see the module docstring and `attn serve --help`."""
    return run_command("attn serve", lambda: serve(argv))


def serve(argv: list[str] | None) -> int:
    args = parse_flags(serve_parser(), argv)
    try:
        import uvicorn

        from ..api.server import create_app
    except ImportError as error:
        raise UserError(f"{error.name} is not installed; pip install 'modeling-attn[serve]'") from error
    from ..api.batching import ServeLimits
    from ..api.model_info import describe_model
    from ..api.quantize import describe_quantization

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    with listening_socket(args.host, args.port) as listening:
        model, tokenizer = load_models(args, quantized=False)
        info = describe_model(model, args.model[0])  # before quantizing: the float model's size
        # the export being made and auto's choice, in the server's log (stderr)
        engine = engine_for(args, model, tokenizer, say=lambda line: print(f"attn serve: {line}", file=sys.stderr))
        quantization = describe_quantization(args.quantize, args.int8_engine)
        if quantization and engine.describe().get("compute_type") == "int8":  # and torch's for what runs on torch
            quantization = f"int8 (CTranslate2's own; {quantization} for what runs on torch)"
        info.update(quantization=quantization, engine=engine.describe())
        limits = ServeLimits(args.max_batch_tokens, args.max_wait_ms, args.max_queue, args.max_body_bytes)
        app = create_app(engine, None, limits, info)
        # uvicorn stops accepting connections on SIGTERM / Ctrl-C and waits for the requests in flight; a second
        # signal ends at once.
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
        server = _uvicorn_server(config)
        server.run(sockets=[listening])
    return 0 if server.started else 1


__all__ = ["ServeArguments", "main", "serve_parser"]
