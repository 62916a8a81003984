"""Speed of `attn_transformer` against its peers, measured side by side in one run.

Peers, same weights copied from ours (their loss on one batch compared first): `MarianMTModel` (eager and sdpa),
`torch.nn.Transformer` inside our embeddings and tied output projection, and CTranslate2 (generation only). Measured
on identical batches with real sentence-pair lengths: training target tokens/s, generation tokens/s and ms/sentence
(greedy and beam 4, batch 32 and 1, forced to the batch's longest target), peak training memory in fresh
subprocesses, parameters, and training tokens/s against sequence length. Rounds interleaved (`harness.interleaved`),
medians; bench/README.md, "speed", has the method.

    python -m bench speed --preset small                 # CPU, writes bench/results/small-cpu.{json,md,png}
    python -m bench speed --quick                        # the tiny preset in ~30 s (CI)
    python -m bench speed --render bench/results/a.json bench/results/a-memory.json   # redraw, merging a second run
    python -m bench speed --preset base big --device cuda   # GPU: bf16 autocast, adds MFU
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from modeling_attn.modeling_transformer import sinusoid_table

from . import common, harness
from .common import (
    BOS,
    PAD,
    Batch,
    Peer,
    fixed_length_batch,
    generation_task,
    hf_loss,
    make_batches,
    median_rate,
    num_parameters,
    peak_flops,
    reference_model,
    training_flops,
    training_task,
)

PARTS = ["train", "generate", "memory", "sweep"]


# ----------------------------------------------------------------------------------------------------------------
# torch.nn.Transformer with the reference's weights (the peers built through transformers are in common.py)


class TorchTransformer(nn.Module):
    """`torch.nn.Transformer` with embeddings * sqrt(d_model) + sinusoids in front and the tied projection after."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_scale = config.d_model**0.5
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, PAD)
        self.register_buffer(
            "positions", sinusoid_table(config.max_position_embeddings, config.d_model, "halves"), persistent=False
        )
        self.transformer = nn.Transformer(
            config.d_model,
            config.num_heads,
            config.encoder_layers,
            config.decoder_layers,
            config.d_ff,
            config.dropout,
            activation=config.activation_function,
            layer_norm_eps=config.layer_norm_eps,
            batch_first=True,
        )
        self.transformer.encoder.norm = None  # the paper's post-LN stacks end without an extra LayerNorm
        self.transformer.decoder.norm = None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def embed(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        hidden = self.embed_tokens(ids) * self.embed_scale + self.positions[offset : offset + ids.shape[1]]
        return nn.functional.dropout(hidden, self.config.dropout, self.training)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)

    def decode(self, decoder_input_ids, memory, attention_mask) -> torch.Tensor:
        length = decoder_input_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=memory.device).triu(1)  # True = masked
        hidden = self.transformer.decoder(
            self.embed(decoder_input_ids),
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            memory_key_padding_mask=attention_mask == 0,
        )
        return self.lm_head(hidden)

    def forward(self, input_ids, attention_mask, labels) -> torch.Tensor:
        """The training loss (mean cross-entropy over target tokens), as the HF models compute it."""
        decoder_input_ids = labels.new_full(labels.shape, PAD)
        decoder_input_ids[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD)
        decoder_input_ids[:, 0] = BOS
        logits = self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """A plain greedy loop: encode once, re-decode the whole prefix at every step (no cache in nn.Transformer)."""
        memory = self.encode(input_ids, attention_mask)
        tokens = input_ids.new_full((input_ids.shape[0], 1), BOS)
        for _ in range(new_tokens):
            next_token = self.decode(tokens, memory, attention_mask)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens


def torch_transformer(reference: nn.Module) -> TorchTransformer:
    """Build `TorchTransformer` and copy the reference weights in (q, k, v stacked into in_proj)."""
    model = TorchTransformer(reference.config)
    weights = reference.state_dict()

    def attention(target: nn.MultiheadAttention, prefix: str) -> None:
        target.in_proj_weight.data.copy_(torch.cat([weights[f"{prefix}.{p}_proj.weight"] for p in "qkv"]))
        target.in_proj_bias.data.copy_(torch.cat([weights[f"{prefix}.{p}_proj.bias"] for p in "qkv"]))
        target.out_proj.load_state_dict({n: weights[f"{prefix}.out_proj.{n}"] for n in ("weight", "bias")})

    def linear_or_norm(target: nn.Module, prefix: str) -> None:
        target.load_state_dict({n: weights[f"{prefix}.{n}"] for n in ("weight", "bias")})

    model.embed_tokens.weight.data.copy_(weights["model.shared.weight"])
    for i, layer in enumerate(model.transformer.encoder.layers):
        prefix = f"model.encoder.layers.{i}"
        attention(layer.self_attn, f"{prefix}.self_attn")
        for ours_name, theirs in [("fc1", "linear1"), ("fc2", "linear2")]:
            linear_or_norm(getattr(layer, theirs), f"{prefix}.{ours_name}")
        linear_or_norm(layer.norm1, f"{prefix}.self_attn_layer_norm")
        linear_or_norm(layer.norm2, f"{prefix}.final_layer_norm")
    for i, layer in enumerate(model.transformer.decoder.layers):
        prefix = f"model.decoder.layers.{i}"
        attention(layer.self_attn, f"{prefix}.self_attn")
        attention(layer.multihead_attn, f"{prefix}.encoder_attn")
        for ours_name, theirs in [("fc1", "linear1"), ("fc2", "linear2")]:
            linear_or_norm(getattr(layer, theirs), f"{prefix}.{ours_name}")
        linear_or_norm(layer.norm1, f"{prefix}.self_attn_layer_norm")
        linear_or_norm(layer.norm2, f"{prefix}.encoder_attn_layer_norm")
        linear_or_norm(layer.norm3, f"{prefix}.final_layer_norm")
    return model


def torch_generate(model: nn.Module, batch: Batch, beams: int, new_tokens: int) -> torch.Tensor:
    if beams != 1:
        raise ValueError("nn.Transformer has no beam search")
    return model.greedy(batch.input_ids, batch.attention_mask, new_tokens)


PEERS: dict[str, Peer] = {
    **common.PEERS,
    "torch.nn.Transformer": Peer(
        "torch.nn.Transformer",
        torch_transformer,
        beam_search=False,
        loss=lambda model, batch: model(batch.input_ids, batch.attention_mask, batch.labels),
        generate=torch_generate,
    ),
}
DEFAULT_PEERS = ["attn_transformer", "MarianMTModel (sdpa)", "MarianMTModel (eager)", "torch.nn.Transformer"]


def register_ctranslate2(device: str) -> str | None:
    """Add CTranslate2 (generation only, same precision as the others) when it and the project's exporter exist;
    return why not otherwise."""
    try:
        import ctranslate2  # noqa: F401

        from modeling_attn.api.export_ctranslate2 import CTranslate2Translator, export_ctranslate2
    except ImportError as error:
        return f"not measured: {error}"

    def build(reference: nn.Module) -> CTranslate2Translator:
        folder = harness.scratch_folder("bench-ct2-") / "model"
        export_ctranslate2(reference, folder, quantization="float32")
        threads = dict(intra_threads=torch.get_num_threads()) if device == "cpu" else {}
        compute_type = "bfloat16" if device == "cuda" else "float32"  # as the others: bf16 autocast on GPU
        return CTranslate2Translator(folder, device=device, compute_type=compute_type, inter_threads=1, **threads)

    def generate(translator: CTranslate2Translator, batch: Batch, beams: int, new_tokens: int) -> list[list[int]]:
        sources = [row[mask.bool()].tolist() for row, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
        return translator.translate_ids(
            sources, beam_size=beams, min_decoding_length=new_tokens, max_decoding_length=new_tokens
        )

    PEERS["CTranslate2"] = Peer("CTranslate2", build, trains=False, generate=generate)
    return None


def parity(reference: nn.Module, model: nn.Module, peer: Peer, batch: Batch) -> float:
    """Max |difference| between the reference's and this model's loss on one batch (eval mode): same weights?"""
    reference.eval()
    model.eval()
    with torch.no_grad():
        return abs(hf_loss(reference, batch).item() - peer.loss(model, batch).item())


# ----------------------------------------------------------------------------------------------------------------
# Peak memory, one fresh process per model


def memory_worker(args: argparse.Namespace) -> None:
    """(In a subprocess) build one model, run two rounds of training steps (the second with Adam's state in
    memory), print the memory before them and their peak as JSON."""
    import psutil

    peer = PEERS[args.memory_worker]
    reference = reference_model(args.preset[0], args.max_positions, args.seed)
    model = peer.build(reference).to(args.device)
    del reference
    release_free_memory()
    vocab = model.config.vocab_size
    batches = [b.to(args.device) for b in make_batches(args.train_batches, args.batch_size, vocab, seed=1)]
    step = training_task(model, peer, batches, args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        step()
        result = {"before_mb": before / 2**20, "peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    else:
        before = psutil.Process().memory_info().rss
        reset_peak_rss()
        step()
        step()
        result = {"before_mb": before / 2**20, "peak_mb": peak_rss() / 2**20}
    print(json.dumps(result))


def reset_peak_rss() -> None:
    """Reset this process's RSS high-water mark (Linux >= 4.0), so that the peak covers the training steps only."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """Peak RSS in bytes of this process's own memory map (VmHWM). Not `getrusage().ru_maxrss`: on Linux that
    keeps the RSS of the parent at fork time, the whole benchmark with all its models."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory on CPU needs Linux")


def release_free_memory() -> None:
    """Hand freed heap memory back to the OS (glibc), so that the RSS before training counts live memory only:
    the peers build a copy of the reference model and drop it, and that slack would otherwise be reused by
    training unseen."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the baseline then includes the freed slack
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory(name: str, args: argparse.Namespace, preset: str) -> dict[str, float]:
    command = [
        sys.executable,
        "-m",
        "bench",
        "speed",
        "--memory_worker",
        name,
        "--preset",
        preset,
        "--device",
        args.device,
        "--batch_size",
        str(args.batch_size),
        "--train_batches",
        str(args.train_batches),
        "--max_positions",
        str(args.max_positions),
        "--threads",
        str(args.threads),
        "--sweep_lengths",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=harness.REPO)
    if done.returncode != 0:
        raise RuntimeError(f"memory measurement of {name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["training_mb"] = result["peak_mb"] - result["before_mb"]
    return result


# ----------------------------------------------------------------------------------------------------------------
# One preset


def bench_preset(
    preset: str, args: argparse.Namespace, peer_names: list[str], save: Callable[[dict], None] = lambda result: None
) -> dict:
    """Measure one preset; `save(result)` is called after each part (training, each generation setting, memory,
    sweep) with the result so far, so that a run cut short (a time limit on a lent GPU) keeps what it measured."""
    device = args.device
    reference = reference_model(preset, args.max_positions, args.seed)
    config = reference.config
    vocab = config.vocab_size
    train_batches = make_batches(args.train_batches, args.batch_size, vocab, seed=1)
    generation_batch = make_batches(1, args.batch_size, vocab, seed=2)[0]
    singles = make_batches(args.single_sentences, 1, vocab, seed=3)
    check_batch = make_batches(1, 4, vocab, seed=4)[0]

    peers = [PEERS[name] for name in peer_names]
    models = {peer.name: peer.build(reference) for peer in peers}
    result: dict = {"preset": preset, "config": config.to_diff_dict(), "models": {}}
    for peer in peers:
        entry = result["models"][peer.name] = {}
        model = models[peer.name]
        if isinstance(model, nn.Module):
            entry["parameters"] = num_parameters(model)
            entry["loss_difference"] = parity(reference, model, peer, check_batch) if peer.trains else None
            model.to(device)
    to_device = [b.to(device) for b in train_batches]

    harness.log(f"[{preset}] training: {args.train_batches} batches x {args.batch_size} sentences, {args.reps} rounds")
    trainers = {p.name: training_task(models[p.name], p, to_device, device) for p in peers if p.trains}
    trainers = trainers if "train" in args.parts else {}
    target_tokens = sum(b.target_tokens for b in train_batches)
    for name, seconds in harness.interleaved(trainers, args.reps, args.clock).items():
        result["models"][name]["train_tokens_per_s"] = median_rate(seconds, target_tokens)
        result["models"][name]["train_seconds"] = seconds
        if device == "cuda" and peak_flops(device):
            flops = sum(training_flops(config, b) for b in train_batches)
            result["models"][name]["mfu"] = flops / statistics.median(seconds) / peak_flops(device)
        harness.log(f"[{preset}] {name}: train {summary(result['models'][name], 'train_tokens_per_s', 'mfu')}")
    save(result)
    # Generation runs on the weights after these few steps (dropout made them drift apart a little); that does not
    # change its cost, since every model produces the same forced number of tokens.

    for beams in (1, 4) if "generate" in args.parts else ():
        for label, batches in (("batch", [generation_batch]), ("single", singles)):
            if beams == 4 and label == "single" and args.quick:
                continue
            batches = [b.to(device) for b in batches]
            tasks = {
                p.name: generation_task(models[p.name], p, batches, beams, device)
                for p in peers
                if beams == 1 or p.beam_search
            }
            harness.log(
                f"[{preset}] generation: beam {beams}, {label} ({len(batches)} x {batches[0].input_ids.shape[0]})"
            )
            sentences = sum(b.input_ids.shape[0] for b in batches)
            tokens = sum(max(b.target_lengths) * b.input_ids.shape[0] for b in batches)
            key = f"{'greedy' if beams == 1 else 'beam4'}_{label}"
            for name, seconds in harness.interleaved(tasks, args.reps, args.clock).items():
                result["models"][name][f"{key}_tokens_per_s"] = median_rate(seconds, tokens)
                result["models"][name][f"{key}_ms_per_sentence"] = 1000 * statistics.median(seconds) / sentences
                harness.log(f"[{preset}] {name}: {key} {summary(result['models'][name], f'{key}_tokens_per_s')}")
            save(result)

    if "memory" in args.parts and not args.no_memory:
        for peer in peers:
            if peer.trains:
                harness.log(f"[{preset}] peak memory: {peer.name}")
                result["models"][peer.name]["memory"] = peak_memory(peer.name, args, preset)
                save(result)

    if "sweep" in args.parts and args.sweep_lengths:
        result["length_sweep"] = length_sweep(reference, peers, args)
        save(result)
    return result


def summary(entry: dict, *keys: str) -> str:
    """'train_tokens_per_s=1,234 mfu=0.42' for the log."""
    return " ".join(
        f"{key}={entry[key]:,.3g}" if entry[key] < 10 else f"{key}={entry[key]:,.0f}"
        for key in keys
        if entry.get(key) is not None
    )


def length_sweep(reference: nn.Module, peers: list[Peer], args: argparse.Namespace) -> dict:
    """Training tokens/s with sources and targets of one length, at a fixed token budget per batch."""
    sweep: dict = {"lengths": args.sweep_lengths, "tokens_per_batch": args.sweep_tokens, "train_tokens_per_s": {}}
    models = {p.name: p.build(reference).to(args.device) for p in peers if p.trains}
    for length in args.sweep_lengths:
        batch = fixed_length_batch(max(1, args.sweep_tokens // length), length, reference.config.vocab_size, 5)
        batch = batch.to(args.device)
        harness.log(f"  length {length}: batch {batch.input_ids.shape[0]}")
        tasks = {p.name: training_task(models[p.name], p, [batch], args.device) for p in peers if p.trains}
        for name, seconds in harness.interleaved(tasks, args.sweep_reps, args.clock).items():
            sweep["train_tokens_per_s"].setdefault(name, []).append(median_rate(seconds, batch.target_tokens))
    return sweep


# ----------------------------------------------------------------------------------------------------------------
# Reports

COLUMNS = [
    ("parameters", "params", "{:,}"),
    ("train_tokens_per_s", "train tok/s", "{:,.0f}"),
    ("greedy_batch_tokens_per_s", "greedy b32 tok/s", "{:,.0f}"),
    ("beam4_batch_tokens_per_s", "beam4 b32 tok/s", "{:,.0f}"),
    ("greedy_single_ms_per_sentence", "greedy b1 ms/sent", "{:,.1f}"),
    ("beam4_single_ms_per_sentence", "beam4 b1 ms/sent", "{:,.1f}"),
    ("memory.training_mb", "train peak MB", "{:,.0f}"),
]


def lookup(entry: dict, key: str):
    for part in key.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None
    return entry


def markdown(report: dict) -> str:
    lines = [f"{report['threads']} threads; device {report['device']}; {report['clock']} clock.", ""]
    for result in report["results"]:
        columns = [(key, title, fmt) for key, title, fmt in COLUMNS]
        if report["device"] == "cuda":
            columns.insert(2, ("mfu", "MFU", "{:.1%}"))
        first = result["models"].get("attn_transformer", {})
        lines.append(f"### preset `{result['preset']}`")
        lines.append("")
        lines.append("| model | " + " | ".join(title for _, title, _ in columns) + " |")
        lines.append("| --- |" + " ---: |" * len(columns))
        for name, entry in result["models"].items():
            cells = []
            for key, _, fmt in columns:
                value = lookup(entry, key)
                cells.append("n/a" if value is None else fmt.format(value))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        ratios = ratio_lines(result["models"], first)
        lines.extend(ratios + ([""] if ratios else []))
        sweep = result.get("length_sweep")
        if sweep:
            lines.append(f"Training tokens/s against sequence length ({sweep['tokens_per_batch']} tokens per batch):")
            lines.append("")
            lines.append("| model | " + " | ".join(str(n) for n in sweep["lengths"]) + " |")
            lines.append("| --- |" + " ---: |" * len(sweep["lengths"]))
            for name, rates in sweep["train_tokens_per_s"].items():
                lines.append(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")
            lines.append("")
    return "\n".join(lines)


def ratio_lines(models: dict, ours_entry: dict) -> list[str]:
    """The issue's targets as ratios of ours to the peers (reported, not asserted)."""
    lines = []

    def best(prefix: str, key: str):
        values = [lookup(e, key) for n, e in models.items() if n.startswith(prefix) and lookup(e, key)]
        return max(values) if values else None

    def smallest(prefix: str, key: str):
        values = [lookup(e, key) for n, e in models.items() if n.startswith(prefix) and lookup(e, key)]
        return min(values) if values else None

    checks = [
        ("training vs MarianMTModel (faster of eager/sdpa)", "train_tokens_per_s", "MarianMTModel", 1.3, best),
        ("training vs torch.nn.Transformer", "train_tokens_per_s", "torch.nn.Transformer", 1.0, best),
        ("beam 4 batch 32 vs MarianMTModel.generate", "beam4_batch_tokens_per_s", "MarianMTModel", 2.0, best),
    ]
    for label, key, prefix, target, pick in checks:
        theirs, mine = pick(prefix, key), ours_entry.get(key)
        if theirs and mine:
            lines.append(f"- {label}: {mine / theirs:.2f}x (target >= {target}x)")
    theirs, mine = smallest("MarianMTModel", "memory.training_mb"), lookup(ours_entry, "memory.training_mb")
    if theirs and mine:
        lines.append(f"- training peak memory vs MarianMTModel: {mine / theirs:.2f}x (target <= 1.0x)")
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    has_sweep = any("length_sweep" in r for r in results)
    figure, axes = plt.subplots(1, 3 if has_sweep else 2, figsize=(16 if has_sweep else 11, 4.5))
    for axis, key, title in [
        (axes[0], "train_tokens_per_s", "training (target tokens/s)"),
        (axes[1], "beam4_batch_tokens_per_s", "beam 4, batch 32 (target tokens/s)"),
    ]:
        names = list(dict.fromkeys(n for r in results for n in r["models"]))
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            values = [lookup(r["models"].get(name, {}), key) or 0 for r in results]
            axis.bar([x + i * width for x in range(len(results))], values, width, label=name)
        axis.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(results))])
        axis.set_xticklabels([r["preset"] for r in results])
        axis.set_ylim(bottom=0)  # bars from zero: differences of a few percent look like what they are
        axis.set_title(title)
    axes[0].legend(fontsize=8)
    if has_sweep:
        sweep = next(r["length_sweep"] for r in results if "length_sweep" in r)
        for name, rates in sweep["train_tokens_per_s"].items():
            axes[2].plot(sweep["lengths"], rates, marker="o", label=name)
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("sequence length (source = target)")
        axes[2].set_title(f"training tokens/s vs length ({sweep['tokens_per_batch']} tokens/batch)")
        axes[2].legend(fontsize=8)
    figure.suptitle(f"{report['machine']}, {report['threads']} threads", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def render(paths: list[Path]) -> dict:
    """Rewrite the .md and .png of the report `paths[0]`, with what the other reports add to its models."""
    report = json.loads(paths[0].read_text())
    for path in paths[1:]:
        extra = json.loads(path.read_text())
        report["command"] += f"; {extra['command']}"
        for result in report["results"]:
            for other in extra["results"]:
                if other["preset"] != result["preset"]:
                    continue
                for name, entry in other["models"].items():
                    if name in result["models"]:
                        for key, value in entry.items():
                            result["models"][name].setdefault(key, value)
    stem = paths[0].with_suffix("")
    stem.with_suffix(".md").write_text(harness.header(report) + markdown(report).rstrip("\n") + "\n")
    plot(report, stem.with_suffix(".png"))
    print(markdown(report))
    return report


# ----------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["small"], help="presets to measure (tiny, small, base, big)")
    parser.add_argument("--peers", nargs="+", default=None, help=f"models to measure, from {list(PEERS)}")
    parser.add_argument("--quick", action="store_true", help="tiny preset, few repetitions: a CI check of the script")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads (CPU)")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=list(harness.CLOCKS),
        help="wall-clock, or CPU time of the process (shared machines)",
    )
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per measurement (median reported)")
    parser.add_argument("--batch_size", type=int, default=32, help="sentences per batch (training and generation)")
    parser.add_argument("--train_batches", type=int, default=2, help="training batches per timed round")
    parser.add_argument("--single_sentences", type=int, default=4, help="sentences translated one at a time")
    parser.add_argument("--sweep_lengths", type=int, nargs="*", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--sweep_tokens", type=int, default=4096, help="tokens per batch in the length sweep")
    parser.add_argument("--sweep_reps", type=int, default=3)
    parser.add_argument("--max_positions", type=int, default=1024)
    parser.add_argument("--no_memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--parts", nargs="+", default=PARTS, choices=PARTS, help="what to measure (default: all of it)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", type=Path, default=harness.RESULTS)
    parser.add_argument(
        "--render",
        nargs="+",
        type=Path,
        help="only rewrite the .md and .png of a report JSON, adding the measurements of further JSONs "
        "(e.g. a --parts memory run) for models and presets that it lacks",
    )
    parser.add_argument("--memory_worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.reps, args.batch_size, args.train_batches = ["tiny"], 1, 8, 1
        args.single_sentences, args.sweep_lengths, args.sweep_tokens, args.sweep_reps = 2, [32, 64], 256, 1
        args.max_positions = 128
    args.max_positions = max(args.max_positions, *(n + 1 for n in args.sweep_lengths or [0]))
    return args


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        memory_worker(args)
        return {}
    if args.render:
        return render(args.render)
    unavailable = register_ctranslate2(args.device)
    peer_names = args.peers or DEFAULT_PEERS + (["CTranslate2"] if "CTranslate2" in PEERS else [])
    unknown = [name for name in peer_names if name not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; choose from {list(PEERS)}")
    settings = {"device": args.device, "threads": args.threads, "clock": args.clock}
    report = harness.envelope(
        __name__, argv, ("ctranslate2",), **settings, ctranslate2=unavailable or "measured", results=[]
    )
    parts = "" if args.parts == PARTS else "-" + "-".join(args.parts)
    stem = args.output_dir / f"{'-'.join(args.preset)}-{args.device}{parts}"
    harness.run_presets(
        report, stem, args.preset, lambda preset, save: bench_preset(preset, args, peer_names, save), markdown
    )
    plot(report, stem.with_suffix(".png"))
    harness.log(f"wrote {stem}.json, .md, .png")
    return report
