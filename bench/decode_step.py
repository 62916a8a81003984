"""Where decoding time goes: what a cached decoder step costs, and what `generate()` spends around the model.

    python -m bench decode_step --part step --preset multi30k-transformer --rows 128 --threads 1
    python -m bench decode_step --part breakdown --preset base --threads 1

`--part step`: one beam search's worth of decoder steps (`--steps` on `--rows` rows, a third with 3 padded source
positions; decoder, output projection, log_softmax, cache reordering by random beam indices) three ways: the model's
own decoder on transformers' `EncoderDecoderCache` (what `generate()` runs); `static buffers`, the same layers as one
function of the weights on key/value buffers of `--max_length` positions allocated once (every shape fixed); and that
function under `torch.compile` (unless `--no_compile`). All must give the same log-probabilities (the run fails
otherwise); `harness.interleaved`, CPU clock, medians per step. `--part breakdown`: one `generate()` with beam 4
(batch `--batch_size`, forced to the longest reference) against the encoder, as many cached greedy decoder steps on
4 x batch rows, and the output projection alone: the rest is the beam search around the model. Random weights
(`common.reference_model`); writes bench/results/decode-step-PART-PRESET.{json,md} (or `--output`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from modeling_attn.api.presets import load_preset

from . import common, harness

BEAMS = 4  # the breakdown's beam search
TOLERANCE = 1e-4  # log-probabilities of the three ways may differ by float32 rounding only


def static_step(model, rows: int) -> Callable:
    """The decoder step of `model` as a function of (tokens (R,), position (1,), key/value buffers (L, R, H, P, D),
    cross keys/values (L, R, H, S, D), self- and cross-attention masks) returning log-probabilities (R, V)."""
    config, decoder = model.config, model.model.decoder
    width, heads = config.d_model, config.num_heads
    head_dim = width // heads
    activation = ACT2FN[config.activation_function]
    final_bias = model.final_logits_bias

    def norm(module, states):
        return F.layer_norm(states, (width,), module.weight, module.bias, module.eps)

    def sublayer(module, states, compute):  # pre-LN: x + f(LN(x)); post-LN (the paper): LN(x + f(x))
        return states + compute(norm(module, states)) if config.norm_first else norm(module, states + compute(states))

    def step(tokens, position, keys, values, cross_keys, cross_values, self_mask, cross_mask):
        states = decoder.embed_tokens(tokens) * decoder.embed_scale + decoder.embed_positions.table[position]
        states = states[:, None]  # (R, 1, E)
        for i, layer in enumerate(decoder.layers):

            def self_attention(x, i=i, layer=layer):
                attn = layer.self_attn
                q, k, v = (
                    proj(x).view(rows, 1, heads, head_dim).transpose(1, 2)
                    for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
                )
                keys[i].index_copy_(2, position, k)
                values[i].index_copy_(2, position, v)
                out = F.scaled_dot_product_attention(q, keys[i], values[i], attn_mask=self_mask)
                return attn.out_proj(out.transpose(1, 2).reshape(rows, 1, width))

            def cross_attention(x, i=i, layer=layer):
                attn = layer.encoder_attn
                q = attn.q_proj(x).view(rows, 1, heads, head_dim).transpose(1, 2)
                out = F.scaled_dot_product_attention(q, cross_keys[i], cross_values[i], attn_mask=cross_mask)
                return attn.out_proj(out.transpose(1, 2).reshape(rows, 1, width))

            def feed_forward(x, layer=layer):
                return layer.fc2(activation(layer.fc1(x)))

            states = sublayer(layer.self_attn_layer_norm, states, self_attention)
            states = sublayer(layer.encoder_attn_layer_norm, states, cross_attention)
            states = sublayer(layer.final_layer_norm, states, feed_forward)
        if decoder.layer_norm is not None:
            states = norm(decoder.layer_norm, states)
        logits = model.lm_head(states[:, 0])
        if final_bias is not None:
            logits = logits + final_bias
        return F.log_softmax(logits, -1, dtype=torch.float32)

    return step


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench decode_step", description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["step", "breakdown"], default="step")
    parser.add_argument("--preset", help="an attn_transformer preset (default multi30k-transformer; breakdown: base)")
    parser.add_argument("--rows", type=int, default=128, help="decoder rows (sentences x beams; 128 = 32 x beam 4)")
    parser.add_argument("--source_length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="decoder steps per round")
    parser.add_argument("--max_length", type=int, default=32, help="positions of the static key/value buffers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no_compile", action="store_true", help="leave out the torch.compile variant")
    parser.add_argument("--batch_size", type=int, default=32, help="breakdown: sentences of the generate() batch")
    parser.add_argument("--output", type=Path, help="stem of the report (default bench/results/decode-step-...)")
    args = parser.parse_args(argv)
    args.preset = args.preset or ("base" if args.part == "breakdown" else "multi30k-transformer")
    if args.part == "step" and args.steps > args.max_length:
        raise ValueError(f"--steps {args.steps} exceeds --max_length {args.max_length}, the buffers' positions")
    model_type = load_preset(args.preset).model_type
    if model_type != "attn_transformer":
        raise ValueError(f"--preset {args.preset} has model_type {model_type}; this probe needs attn_transformer")
    args.output = args.output or harness.RESULTS / f"decode-step-{args.part}-{args.preset}"
    return args


@dataclass
class StepInputs:
    """One search's worth of decoder inputs: the encoded source, its mask, each step's tokens and beam indices."""

    encoded: torch.Tensor  # (R, S, E)
    source_mask: torch.Tensor  # (R, S), 1 = token
    tokens: torch.Tensor  # (steps, R)
    beams: list[torch.Tensor]  # per step, (R,) rows to keep


def step_inputs(model, args: argparse.Namespace) -> StepInputs:
    config, rows, length = model.config, args.rows, args.source_length
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, config.vocab_size, (rows, length), generator=generator)
    source_mask = torch.ones(rows, length, dtype=torch.long)
    source_mask[::3, -3:] = 0
    tokens = torch.randint(4, config.vocab_size, (args.steps, rows), generator=generator)
    beams = [torch.randint(0, rows, (rows,), generator=generator) for _ in range(args.steps)]
    encoded = model.model.encoder(input_ids=source, attention_mask=source_mask).last_hidden_state
    return StepInputs(encoded, source_mask, tokens, beams)


def dynamic_cache(model, inputs: StepInputs) -> Callable[[], list[torch.Tensor]]:
    """The model's own decoder steps on transformers' cache, reordered by `_reorder_cache` (generate()'s work)."""
    config, decoder = model.config, model.model.decoder

    def run() -> list[torch.Tensor]:
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        out = []
        for t, tokens in enumerate(inputs.tokens):
            hidden = decoder(
                input_ids=tokens[:, None],
                encoder_hidden_states=inputs.encoded,
                encoder_attention_mask=inputs.source_mask,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
            out.append(F.log_softmax(model.lm_head(hidden[:, -1]), -1, dtype=torch.float32))
            cache = model._reorder_cache(cache, inputs.beams[t])
        return out

    return run


def static_buffers(model, inputs: StepInputs, step: Callable, max_length: int) -> Callable[[], list[torch.Tensor]]:
    """`step` (`static_step`, compiled or not) on key/value buffers of `max_length` positions allocated once."""
    config, decoder = model.config, model.model.decoder
    rows, length = inputs.source_mask.shape
    heads = config.num_heads
    head_dim = config.d_model // heads

    def cross(projection: str) -> torch.Tensor:  # (L, R, H, S, D), once per search as in generate()
        return torch.stack(
            [
                getattr(layer.encoder_attn, projection)(inputs.encoded)
                .view(rows, length, heads, head_dim)
                .transpose(1, 2)
                for layer in decoder.layers
            ]
        )

    cross_keys, cross_values = cross("k_proj"), cross("v_proj")
    cross_mask = inputs.source_mask.bool()[:, None, None, :]
    positions = torch.arange(max_length)

    def run() -> list[torch.Tensor]:
        keys = torch.zeros(config.decoder_layers, rows, heads, max_length, head_dim)
        values = torch.zeros_like(keys)
        out = []
        for t, tokens in enumerate(inputs.tokens):
            self_mask = (positions <= t)[None, None, None, :]
            out.append(
                step(tokens, positions[t : t + 1], keys, values, cross_keys, cross_values, self_mask, cross_mask)
            )
            keys, values = keys.index_select(1, inputs.beams[t]), values.index_select(1, inputs.beams[t])
        return out

    return run


def step_part(model, args: argparse.Namespace) -> dict:
    """The three ways of a decoder step, checked against each other, then timed: medians in seconds per step."""
    with torch.inference_mode():
        inputs = step_inputs(model, args)
        step = static_step(model, args.rows)
        tasks = {
            "dynamic cache (generate's)": dynamic_cache(model, inputs),
            "static buffers": static_buffers(model, inputs, step, args.max_length),
        }
        if not args.no_compile:
            compiled = torch.compile(step, dynamic=False)
            tasks["static buffers, compiled"] = static_buffers(model, inputs, compiled, args.max_length)
        reference = tasks["dynamic cache (generate's)"]()
        for name, task in tasks.items():
            difference = max((a - b).abs().max().item() for a, b in zip(reference, task(), strict=True))
            if difference > TOLERANCE:
                raise RuntimeError(f"{name}: log-probabilities differ from the dynamic cache's by {difference:.2e}")
        seconds = harness.interleaved(tasks, args.reps, "cpu")
    return {name: {"seconds": [s / args.steps for s in values]} for name, values in seconds.items()}


def breakdown_part(model, args: argparse.Namespace) -> dict:
    """CPU seconds of one beam-4 `generate()` and of the model's own work in it (the module docstring)."""
    batch = common.make_batches(1, args.batch_size, model.config.vocab_size, seed=2)[0]
    steps, rows, clock = max(batch.target_lengths), BEAMS * args.batch_size, time.process_time
    seconds = {}
    with torch.no_grad():
        common.hf_generate(model, batch, BEAMS, 5)  # warm-up
        start = clock()
        common.hf_generate(model, batch, BEAMS, steps)
        seconds["generate (beam 4)"] = clock() - start
        start = clock()
        encoded = model.get_encoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        seconds["encoder"] = clock() - start
        encoded = BaseModelOutput(last_hidden_state=encoded.last_hidden_state.repeat_interleave(BEAMS, 0))
        mask = batch.attention_mask.repeat_interleave(BEAMS, 0)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        tokens = torch.full((rows, 1), common.BOS)
        start = clock()
        for _ in range(steps):
            out = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=tokens, past_key_values=cache)
            cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        seconds["decoder steps (incl. output projection)"] = clock() - start
        hidden = torch.randn(rows, model.config.d_model)
        start = clock()
        for _ in range(steps):
            model.lm_head(hidden)
        seconds["output projection alone"] = clock() - start
    return {name: {"seconds": [value], "steps": steps} for name, value in seconds.items()}


def markdown(report: dict) -> str:
    if report["part"] == "breakdown":
        total = report["variants"]["generate (beam 4)"]["seconds"][0]
        lines = [f"preset {report['preset']}, batch {report['batch_size']}, beam {BEAMS}, CPU seconds, one run.", ""]
        lines += ["| what | CPU s | share of generate() |", "| --- | ---: | ---: |"]
        for name, entry in report["variants"].items():
            lines.append(f"| {name} | {entry['seconds'][0]:.2f} | {entry['seconds'][0] / total:.1%} |")
        return "\n".join(lines) + "\n"
    base = statistics.median(report["variants"]["dynamic cache (generate's)"]["seconds"])
    lines = [
        f"preset {report['preset']}, {report['rows']} rows, source {report['source_length']}, "
        f"{report['steps']} steps, buffers of {report['max_length']}; {report['threads']} thread(s), CPU clock, "
        f"median of {report['reps']}.",
        "",
        "| variant | ms per step | vs dynamic cache |",
        "| --- | ---: | ---: |",
    ]
    for name, entry in report["variants"].items():
        value = statistics.median(entry["seconds"])
        lines.append(f"| {name} | {value * 1e3:.2f} | {base / value:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict:
    """Measure the part, write the report and return it (`variants`: seconds per step, or per stage)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = common.reference_model(args.preset, 256, seed=0).eval()
    variants = step_part(model, args) if args.part == "step" else breakdown_part(model, args)
    settings = ("rows", "source_length", "steps", "max_length", "reps") if args.part == "step" else ("batch_size",)
    settings = {name: getattr(args, name) for name in ("part", "preset", "threads", *settings)}
    report = harness.envelope(__name__, argv, **settings, variants=variants)
    harness.write_results(args.output, report, markdown(report))
    return report
