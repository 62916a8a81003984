"""What a cached decoder step costs, and whether preallocated key/value buffers or `torch.compile` make it cheaper.

    python bench/decode_step.py --preset multi30k-transformer --rows 128 --threads 1

One beam search's worth of decoder steps (`--steps`, on `--rows` rows = sentences x beams, `--source_length`
source tokens, a third of the rows with 3 padded source positions), each step the decoder, the output projection,
log_softmax and the reordering of the self-attention cache by random beam indices, three ways:

- `dynamic cache`: the model's own decoder and `_reorder_cache` on transformers' `EncoderDecoderCache`, what
  `generate()` runs;
- `static buffers`: the same layers written as one function of the weights on key/value buffers of
  `--max_length` positions, allocated once (each step writes its keys and values at its position and attends to
  the positions written so far through a mask): no cache objects and every shape fixed, what `torch.compile` needs
  to compile the step once;
- `static buffers, compiled`: that function under `torch.compile` (inductor, static shapes), unless
  `--no_compile`.

All three must give the same log-probabilities (checked: the run fails otherwise). Weights are the preset's random
initialisation (`common.reference_model`): the cost of a step does not depend on their values. Timing is
`common.interleaved` with the CPU clock of this process; medians per step are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn.api.presets import load_preset  # noqa: E402

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


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k-transformer", help="an attn_transformer preset")
    parser.add_argument("--rows", type=int, default=128, help="decoder rows (sentences x beams; 128 = 32 x beam 4)")
    parser.add_argument("--source_length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="decoder steps per round")
    parser.add_argument("--max_length", type=int, default=32, help="positions of the static key/value buffers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no_compile", action="store_true", help="leave out the torch.compile variant")
    args = parser.parse_args(argv)
    if args.steps > args.max_length:
        raise ValueError(f"--steps {args.steps} exceeds --max_length {args.max_length}, the buffers' positions")
    torch.set_num_threads(args.threads)
    model_type = load_preset(args.preset).model_type
    if model_type != "attn_transformer":
        raise ValueError(f"--preset {args.preset} has model_type {model_type}; this probe needs attn_transformer")
    model = common.reference_model(args.preset, 256, seed=0).eval()
    config = model.config
    rows, length = args.rows, args.source_length
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, config.vocab_size, (rows, length), generator=generator)
    source_mask = torch.ones(rows, length, dtype=torch.long)
    source_mask[::3, -3:] = 0
    tokens = torch.randint(4, config.vocab_size, (args.steps, rows), generator=generator)
    beams = [torch.randint(0, rows, (rows,), generator=generator) for _ in range(args.steps)]
    layers, heads = config.decoder_layers, config.num_heads
    head_dim = config.d_model // heads

    with torch.inference_mode():
        encoded = model.model.encoder(input_ids=source, attention_mask=source_mask).last_hidden_state
        decoder = model.model.decoder

        def dynamic_cache() -> list[torch.Tensor]:
            cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
            out = []
            for t in range(args.steps):
                hidden = decoder(
                    input_ids=tokens[t][:, None],
                    encoder_hidden_states=encoded,
                    encoder_attention_mask=source_mask,
                    past_key_values=cache,
                    use_cache=True,
                ).last_hidden_state
                out.append(F.log_softmax(model.lm_head(hidden[:, -1]), -1, dtype=torch.float32))
                cache = model._reorder_cache(cache, beams[t])
            return out

        def cross(projection: str) -> torch.Tensor:  # (L, R, H, S, D), once per search as in generate()
            return torch.stack(
                [
                    getattr(layer.encoder_attn, projection)(encoded)
                    .view(rows, length, heads, head_dim)
                    .transpose(1, 2)
                    for layer in decoder.layers
                ]
            )

        cross_keys, cross_values = cross("k_proj"), cross("v_proj")
        cross_mask = source_mask.bool()[:, None, None, :]
        positions = torch.arange(args.max_length)

        def static_buffers(step: Callable) -> Callable[[], list[torch.Tensor]]:
            def run() -> list[torch.Tensor]:
                keys = torch.zeros(layers, rows, heads, args.max_length, head_dim)
                values = torch.zeros_like(keys)
                out = []
                for t in range(args.steps):
                    position = positions[t : t + 1]
                    self_mask = (positions <= t)[None, None, None, :]
                    out.append(
                        step(tokens[t], position, keys, values, cross_keys, cross_values, self_mask, cross_mask)
                    )
                    keys, values = keys.index_select(1, beams[t]), values.index_select(1, beams[t])
                return out

            return run

        step = static_step(model, rows)
        tasks = {"dynamic cache (generate's)": dynamic_cache, "static buffers": static_buffers(step)}
        if not args.no_compile:
            tasks["static buffers, compiled"] = static_buffers(torch.compile(step, dynamic=False))
        reference = dynamic_cache()
        for name, task in tasks.items():
            difference = max((a - b).abs().max().item() for a, b in zip(reference, task(), strict=True))
            if difference > TOLERANCE:
                raise RuntimeError(f"{name}: log-probabilities differ from the dynamic cache's by {difference:.2e}")
        seconds = common.interleaved(tasks, args.reps, common.CLOCKS["cpu"])

    medians = {name: statistics.median(times) / args.steps for name, times in seconds.items()}
    print(
        f"preset {args.preset}, {rows} rows, source {length}, {args.steps} steps, buffers of {args.max_length}; "
        f"{args.threads} thread(s), CPU clock, median of {args.reps}; {common.machine()}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )
    print("| variant | ms per step | vs dynamic cache |\n| --- | ---: | ---: |")
    base = medians["dynamic cache (generate's)"]
    for name, value in medians.items():
        print(f"| {name} | {value * 1e3:.2f} | {base / value:.2f}x |")
    return medians


if __name__ == "__main__":
    main()
