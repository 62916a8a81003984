"""What the model benches share: batches, the reference model and its peers, training and generation tasks.

Token batches of realistic lengths, the reference model and the models built from its weights, training and
generation tasks and the FLOP count for MFU. Timing, the report's envelope and its writer are `bench.harness`'s.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import math
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from modeling_attn.training.throughput import peak_bf16_flops
from torch import nn
from transformers import CompileConfig, GenerationConfig

import modeling_attn  # noqa: F401  (registers attn_transformer with the Auto classes)
from modeling_attn import AttnTransformerForConditionalGeneration
from modeling_attn.api.presets import load_preset
from modeling_attn.flops import length_sums, transformer_forward_flops

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
SUBWORD_FACTOR = 1.3  # BPE tokens per whitespace word for a ~10k joint vocabulary on Multi30k / WMT EN-DE
PAD, BOS, EOS = 0, 1, 2


# ----------------------------------------------------------------------------------------------------------------
# Data: ragged batches of token ids with realistic lengths


def sentence_lengths(count: int, seed: int) -> list[tuple[int, int]]:
    """(source, target) lengths in tokens: Multi30k en-de training pairs when present, else a lognormal."""
    generator = torch.Generator().manual_seed(seed)
    if (MULTI30K / "train.en.gz").is_file():
        with gzip.open(MULTI30K / "train.en.gz", "rt") as en, gzip.open(MULTI30K / "train.de.gz", "rt") as de:
            pairs = [(len(s.split()), len(t.split())) for s, t in zip(en, de, strict=True)]
        picks = torch.randint(len(pairs), (count,), generator=generator).tolist()
        return [
            (max(1, round(pairs[i][0] * SUBWORD_FACTOR)), max(1, round(pairs[i][1] * SUBWORD_FACTOR))) for i in picks
        ]
    # WMT-like: median ~22 tokens, long tail.
    source = torch.empty(count).log_normal_(math.log(22), 0.5, generator=generator)
    ratio = torch.empty(count).log_normal_(0.0, 0.15, generator=generator)
    return [(max(1, round(s)), max(1, round(s * r))) for s, r in zip(source.tolist(), ratio.tolist(), strict=True)]


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, S), right-padded with PAD
    attention_mask: torch.Tensor  # (B, S), 1 = token
    labels: torch.Tensor  # (B, T), target ids then EOS, -100 on padding
    target_lengths: list[int]  # tokens per target including EOS

    @property
    def target_tokens(self) -> int:
        return sum(self.target_lengths)

    def to(self, device: str) -> Batch:
        return Batch(
            self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device), self.target_lengths
        )


def make_batch(lengths: list[tuple[int, int]], vocab_size: int, generator: torch.Generator) -> Batch:
    """Random ids (never the special tokens) with the given lengths; targets end with EOS."""
    source_max = max(s for s, _ in lengths)
    target_max = max(t for _, t in lengths) + 1
    input_ids = torch.full((len(lengths), source_max), PAD)
    labels = torch.full((len(lengths), target_max), -100)
    for row, (source, target) in enumerate(lengths):
        input_ids[row, :source] = torch.randint(3, vocab_size, (source,), generator=generator)
        labels[row, :target] = torch.randint(3, vocab_size, (target,), generator=generator)
        labels[row, target] = EOS
    return Batch(input_ids, (input_ids != PAD).long(), labels, [t + 1 for _, t in lengths])


def make_batches(
    count: int, batch_size: int, vocab_size: int, seed: int, max_length: int | None = None
) -> list[Batch]:
    lengths = sentence_lengths(count * batch_size, seed)
    if max_length is not None:
        lengths = [(min(s, max_length), min(t, max_length - 1)) for s, t in lengths]
    generator = torch.Generator().manual_seed(seed)
    return [make_batch(lengths[i : i + batch_size], vocab_size, generator) for i in range(0, len(lengths), batch_size)]


def fixed_length_batch(batch_size: int, length: int, vocab_size: int, seed: int) -> Batch:
    """All sources and targets exactly `length` tokens (the sequence-length sweep)."""
    return make_batch([(length, length - 1)] * batch_size, vocab_size, torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------------
# The models under test, each built with the weights of one reference `attn_transformer`


def reference_model(preset: str, max_positions: int, seed: int) -> AttnTransformerForConditionalGeneration:
    """Ours, with Marian's position layout ("halves", the same encoding permuted) so that logits can match."""
    torch.manual_seed(seed)
    config = load_preset(
        preset,
        positional_layout="halves",
        max_position_embeddings=max_positions,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )
    return AttnTransformerForConditionalGeneration(config)


def ours(reference: nn.Module, attn_implementation: str) -> nn.Module:
    model = copy.deepcopy(reference)
    model.set_attn_implementation(attn_implementation)
    return model


def marian(reference: nn.Module, attn_implementation: str) -> nn.Module:
    """MarianMTModel with the same weights, through the tested converter (`convert_marian.attn_to_marian`)."""
    from modeling_attn.api.convert_marian import attn_to_marian

    model = attn_to_marian(reference)
    model.set_attn_implementation(attn_implementation)
    return model


@dataclass
class Peer:
    """One implementation under test: how to build it from the reference, and whether it trains / decodes."""

    name: str
    build: Callable[[nn.Module], nn.Module]
    trains: bool = True
    beam_search: bool = True
    loss: Callable[[nn.Module, Batch], torch.Tensor] = field(default=lambda model, batch: hf_loss(model, batch))
    generate: Callable[[nn.Module, Batch, int, int], torch.Tensor] = field(
        default=lambda model, batch, beams, new_tokens: hf_generate(model, batch, beams, new_tokens)
    )


def hf_loss(model: nn.Module, batch: Batch, **kwargs) -> torch.Tensor:
    """The loss as a plain training loop computes it (`kwargs`: e.g. our models' `smoothing`)."""
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels, **kwargs).loss


def ours_loss(model: nn.Module, batch: Batch, **kwargs) -> torch.Tensor:
    """Our training step's loss as `attn train` computes it: output projection on labelled positions only
    (`kwargs`: e.g. `smoothing`, which `TranslationTrainer` passes)."""
    return hf_loss(model, batch, skip_logits=True, **kwargs)


def generation_settings(beams: int, new_tokens: int, **extra) -> GenerationConfig:
    """Greedy or beam search forced to exactly `new_tokens` tokens (`extra`: more GenerationConfig fields)."""
    return GenerationConfig(
        num_beams=beams,
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        **extra,
    )


def hf_generate(model: nn.Module, batch: Batch, beams: int, new_tokens: int) -> torch.Tensor:
    settings = generation_settings(beams, new_tokens)
    return model.generate(batch.input_ids, attention_mask=batch.attention_mask, generation_config=settings)


# ----------------------------------------------------------------------------------------------------------------
# Static cache and compiled generation (compile_static.py, export_speed.py, gpu.py)


def compile_config(backend: str = "inductor", mode: str | None = None) -> CompileConfig:
    """transformers' automatic compilation of the decoding steps, fullgraph (a graph break raises). `mode` None:
    transformers' default ("reduce-overhead", CUDA graphs) on CUDA, "default" elsewhere. transformers compiles by
    itself on GPUs only; `_compile_all_devices` is the switch its own tests use to compile on the CPU as well."""
    if mode is None:
        mode = "reduce-overhead" if torch.cuda.is_available() else "default"
    config = CompileConfig(fullgraph=True, backend=backend, mode=mode)
    config._compile_all_devices = True
    return config


def static_generate(model: nn.Module, batch: Batch, beams: int, new_tokens: int, **extra) -> torch.Tensor:
    """`hf_generate` with a static cache (`extra`: e.g. compile_config)."""
    settings = generation_settings(beams, new_tokens, cache_implementation="static", **extra)
    return model.generate(batch.input_ids, attention_mask=batch.attention_mask, generation_config=settings)


class CompiledStatic:
    """Compiled generation with a static cache, by transformers' documented routes, on two copies of a model:
    greedy search through generate's automatic compilation (`compile_config`, which transformers applies to greedy
    search and sampling only), beam search through `model.forward = torch.compile(model.forward, fullgraph=True)`
    (transformers' beam search calls the model uncompiled; so does ours, which hands static caches over to it)."""

    def __init__(self, reference: nn.Module, backend: str = "inductor", mode: str | None = None):
        self.config = compile_config(backend, mode)
        self.greedy = ours(reference, "sdpa").eval()
        self.beam = ours(reference, "sdpa").eval()
        forward_mode = None if self.config.mode == "default" else self.config.mode
        self.beam.forward = torch.compile(self.beam.forward, fullgraph=True, backend=backend, mode=forward_mode)

    def to(self, device: str) -> CompiledStatic:
        self.greedy.to(device)
        self.beam.to(device)
        return self

    def generate(self, batch: Batch, beams: int, new_tokens: int) -> torch.Tensor:
        if beams == 1:
            return static_generate(self.greedy, batch, beams, new_tokens, compile_config=self.config)
        return static_generate(self.beam, batch, beams, new_tokens)


# attn_transformer's eager decoding with transformers' dynamic cache (the default), with a static cache, and compiled
# with a static cache
GENERATION_VARIANTS: dict[str, Peer] = {
    "eager, dynamic cache": Peer("eager, dynamic cache", lambda ref: ours(ref, "sdpa"), trains=False),
    "eager, static cache": Peer(
        "eager, static cache", lambda ref: ours(ref, "sdpa"), trains=False, generate=static_generate
    ),
    "compiled, static cache": Peer(
        "compiled, static cache",
        CompiledStatic,
        trains=False,
        generate=lambda model, batch, beams, new_tokens: model.generate(batch, beams, new_tokens),
    ),
}


# The peers built through transformers' classes; bench/speed.py adds torch.nn.Transformer and CTranslate2.
PEERS: dict[str, Peer] = {
    "attn_transformer": Peer("attn_transformer", lambda ref: ours(ref, "sdpa"), loss=ours_loss),
    "attn_transformer (eager)": Peer("attn_transformer (eager)", lambda ref: ours(ref, "eager"), loss=ours_loss),
    # the same model with a loss from full (B, T, V) logits, as a plain training loop gets by default
    "attn_transformer (full logits)": Peer("attn_transformer (full logits)", lambda ref: ours(ref, "sdpa")),
    "MarianMTModel (sdpa)": Peer("MarianMTModel (sdpa)", lambda ref: marian(ref, "sdpa")),
    "MarianMTModel (eager)": Peer("MarianMTModel (eager)", lambda ref: marian(ref, "eager")),
}


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor once (Marian's frozen position table is not one)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


# ----------------------------------------------------------------------------------------------------------------
# Training and generation tasks


def autocast(device: str, bf16: bool | None = None):
    """bfloat16 autocast: on CUDA unless `bf16=False`, on the CPU only with `bf16=True` (bench/cpu_bf16.py)."""
    enabled = device == "cuda" if bf16 is None else bf16
    return torch.autocast(device, dtype=torch.bfloat16, enabled=enabled)


def training_task(
    model: nn.Module, peer: Peer, batches: list[Batch], device: str, bf16: bool | None = None
) -> Callable[[], None]:
    """One call = a training step (forward, backward, Adam) on each of `batches`, under `autocast(device, bf16)`."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    model.train()

    def task() -> None:
        for batch in batches:
            with autocast(device, bf16):
                loss = peer.loss(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return task


def generation_task(model, peer: Peer, batches: list[Batch], beams: int, device: str) -> Callable[[], None]:
    if isinstance(model, nn.Module):
        model.eval()

    def task() -> None:
        for batch in batches:
            with torch.inference_mode(), autocast(device):
                peer.generate(model, batch, beams, max(batch.target_lengths))

    return task


def median_rate(seconds: list[float], units: float) -> float:
    return units / statistics.median(seconds)


# ----------------------------------------------------------------------------------------------------------------
# FLOPs for MFU (GPU mode)


def training_flops(config, batch: Batch) -> float:
    """`modeling_attn.flops.FLOP_FORMULA` (attn_transformer) of one training step on the batch's real tokens: 3 x
    forward, sentence by sentence with its own source and target lengths (padding earns nothing)."""
    sums = length_sums(batch.attention_mask.sum(1), torch.tensor(batch.target_lengths))
    output = 2 * sums[1] * config.d_model * config.decoder_vocab_size
    return 3.0 * (transformer_forward_flops(config, sums) + output)


def peak_flops(device: str) -> float | None:
    """The dense bf16 peak of this CUDA GPU (`modeling_attn.training.throughput.PEAK_BF16_FLOPS`), else None."""
    return peak_bf16_flops(torch.cuda.get_device_name()) if device == "cuda" else None


def dates_sentences(count: int) -> list[str]:
    """The first `count` sources of the embedded dates task's test split (what `attn evaluate` scores)."""
    from modeling_attn.training.data import load_parallel_data

    return list(load_parallel_data(None).splits["test"]["source"][:count])


@contextlib.contextmanager
def attn_server(flags: Sequence[str], log: Path, prefix: Sequence[str] = ()) -> Iterator[str]:
    """`attn serve FLAGS` on a free loopback port (its command after `prefix`, e.g. a `taskset`), its output in `log`:
    the URL once GET /health answers (at most 300 s; its log in the error if it ends first), stopped after it."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [*prefix, sys.executable, "-m", "modeling_attn.cli.main", "serve", "--port", str(port), *flags]
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(log.read_text())
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("attn serve did not start in 300 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=120)
