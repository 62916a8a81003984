"""Static caches and compiled generation for attn_transformer; attn_rnn refuses them.

Reference checks: `generate(cache_implementation="static")` gives the dynamic cache's token ids for greedy search,
beam search (with transformers' beam search, which takes static caches: ours refuses them and hands over) and
sampling, on padded batches of several sizes; a decoding loop over a hand-made static cache gives the dynamic
cache's logits at every step; the encoder keys/values are computed once per sentence with either cache. Slow:
transformers' compiled generation (`compile_config`, fullgraph) and `model.forward = torch.compile(...)` give the
eager token ids.
"""

from __future__ import annotations

import pytest
import torch
from tasks import EOS, one_thread, reverse_task, train_transformer_reverser
from tiny import padded_batch, spread_tiny_rnn
from transformers import CompileConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache, StaticLayer

from modeling_attn import AttnRNNForConditionalGeneration, AttnTransformerForConditionalGeneration
from modeling_attn import beam_search as compact_beam_search

SEARCHES = {
    "greedy": dict(num_beams=1),
    "beam4": dict(num_beams=4, length_penalty=0.6),
    "beam4-two-returned": dict(num_beams=4, length_penalty=0.6, num_return_sequences=2),
    "sampling": dict(do_sample=True, top_k=4),
}
BATCH_SIZES = [1, 3, 8]  # reverse_task pads the shorter sources of a batch


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reverser() -> AttnTransformerForConditionalGeneration:
    model = train_transformer_reverser()
    model.set_attn_implementation("sdpa")
    return model


def batch(size: int, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids, attention_mask, _ = reverse_task(size, torch.Generator().manual_seed(seed + size))
    return input_ids, attention_mask


def generate(model, input_ids, attention_mask, seed: int = 0, **settings) -> torch.Tensor:
    torch.manual_seed(seed)  # sampling: both caches draw the same random numbers
    return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, **settings)


@pytest.mark.parametrize("size", BATCH_SIZES)
@pytest.mark.parametrize("search", list(SEARCHES))
def test_static_cache_gives_the_dynamic_caches_tokens(reverser, search, size):
    input_ids, attention_mask = batch(size)
    dynamic = generate(reverser, input_ids, attention_mask, **SEARCHES[search])
    static = generate(reverser, input_ids, attention_mask, cache_implementation="static", **SEARCHES[search])
    assert torch.equal(static, dynamic)
    if size == 8:  # the outputs depend on the input and end at different lengths: what follows an end is compared
        rows = dynamic.tolist()
        assert len({tuple(row) for row in rows}) >= 6
        assert len({row.index(EOS) if EOS in row else None for row in rows}) >= 3


def test_beam_search_with_a_static_cache_goes_to_transformers_search(reverser, monkeypatch):
    """Our beam search drops finished sentences from the batch, which a static cache cannot do: it hands the call
    over to transformers' beam search, and both give the same tokens (the test above)."""
    refusals = []
    refusal = compact_beam_search.CompactBeamSearchMixin._compact_beam_search_refusal

    def recording(self, *args):
        refusals.append(refusal(self, *args))
        return refusals[-1]

    monkeypatch.setattr(compact_beam_search.CompactBeamSearchMixin, "_compact_beam_search_refusal", recording)
    generate(reverser, *batch(3), cache_implementation="static", num_beams=4)
    generate(reverser, *batch(3), num_beams=4)
    assert refusals == ["a cache that cannot drop rows (static or quantized layers)", None]


def decoder_step_logits(model, input_ids, attention_mask, cache: EncoderDecoderCache, steps: int) -> torch.Tensor:
    """Teacher-forced decoding one position at a time through `cache`: the logits of every step, (B, steps, V)."""
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    decoder_input_ids = torch.randint(3, 16, (input_ids.shape[0], steps), generator=torch.Generator().manual_seed(1))
    logits = []
    with torch.no_grad():
        for step in range(steps):
            outputs = model(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids[:, step : step + 1],
                cache=cache,
                use_cache=True,
            )
            logits.append(outputs.logits)
    return torch.cat(logits, dim=1)


def test_decoding_through_a_static_cache_gives_the_dynamic_caches_logits(reverser):
    input_ids, attention_mask = batch(4)
    config = reverser.config
    dynamic = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    static = EncoderDecoderCache(
        StaticCache(config=config, max_cache_len=12), StaticCache(config=config, max_cache_len=input_ids.shape[1])
    )
    expected = decoder_step_logits(reverser, input_ids, attention_mask, dynamic, steps=9)
    got = decoder_step_logits(reverser, input_ids, attention_mask, static, steps=9)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(isinstance(layer, StaticLayer) for layer in static.self_attention_cache.layers)
    assert int(static.get_seq_length()) == 9


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_encoder_keys_and_values_are_computed_once_per_sentence(reverser, cache_implementation, num_beams):
    """fairseq's static encoder K/V: each decoder layer projects the encoder output once per generate() call (for
    all beams at once), while its self-attention projects one new position per step."""
    calls = {"cross": 0, "self": 0}
    hooks = []
    for layer in reverser.model.decoder.layers:
        hooks.append(
            layer.encoder_attn.k_proj.register_forward_hook(lambda *_: calls.update(cross=calls["cross"] + 1))
        )
        hooks.append(layer.self_attn.k_proj.register_forward_hook(lambda *_: calls.update(self=calls["self"] + 1)))
    try:
        output = generate(reverser, *batch(3), cache_implementation=cache_implementation, num_beams=num_beams)
    finally:
        for hook in hooks:
            hook.remove()
    layers = reverser.config.decoder_layers
    assert calls["cross"] == layers
    assert calls["self"] >= layers * (output.shape[1] - 1)  # one per step and layer (beam search may run on)


def test_a_static_cache_longer_than_the_position_table_is_refused(reverser):
    """The table has 32 positions: a static cache for 40 tokens is refused before the first step (a dynamic one
    fails at the step that passes the table)."""
    input_ids, attention_mask = batch(2)
    with pytest.raises(ValueError, match=r"static cache of 40 positions exceeds max_position_embeddings=32"):
        reverser.generate(input_ids, attention_mask=attention_mask, max_length=41, cache_implementation="static")
    too_long = EncoderDecoderCache(
        StaticCache(config=reverser.config, max_cache_len=8), StaticCache(config=reverser.config, max_cache_len=20)
    )
    with pytest.raises(ValueError, match=r"cross-attention cache holds 20 positions, the source has \d+"):
        decoder_step_logits(reverser, input_ids, attention_mask, too_long, steps=1)


def test_the_transformer_declares_fullgraph_compilation_and_the_rnn_does_not():
    assert AttnTransformerForConditionalGeneration._can_compile_fullgraph is True
    assert AttnRNNForConditionalGeneration._can_compile_fullgraph is False


@pytest.mark.parametrize("where", ["argument", "generation_config"])
def test_attn_rnn_refuses_a_static_cache_in_one_line(where):
    model = spread_tiny_rnn(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    input_ids, attention_mask, _ = padded_batch()
    settings = dict(attention_mask=attention_mask, max_new_tokens=4)
    if where == "argument":
        settings["cache_implementation"] = "static"
    else:
        model.generation_config.cache_implementation = "static"
    with pytest.raises(ValueError, match=r"^attn_rnn takes no cache_implementation='static': .* recurrent state") as e:
        model.generate(input_ids, **settings)
    assert "\n" not in str(e.value)
    model.generation_config.cache_implementation = None
    settings.pop("cache_implementation", None)
    assert model.generate(input_ids, **settings).shape[0] == 3  # the dynamic route still works


# ----------------------------------------------------------------------------------------------------------------
# Compiled generation (slow: torch.compile takes ~30 s per graph on a shared CPU)


def cpu_compile_config() -> CompileConfig:
    """transformers' documented automatic compilation, with fullgraph=True (a graph break raises) and dynamic
    shapes (one graph for all batch sizes above 1). transformers compiles automatically on GPUs only;
    `_compile_all_devices` is the switch its own tests use to do so on the CPU."""
    config = CompileConfig(fullgraph=True, dynamic=True, mode="default")
    config._compile_all_devices = True
    return config


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "sampling"])
def test_transformers_compiled_generation_gives_the_eager_tokens(search):
    model = train_transformer_reverser()
    model.set_attn_implementation("sdpa")
    for size in (3, 8, 5):
        input_ids, attention_mask = batch(size, seed=11)
        eager = generate(model, input_ids, attention_mask, **SEARCHES[search])
        compiled = generate(
            model,
            input_ids,
            attention_mask,
            cache_implementation="static",
            compile_config=cpu_compile_config(),
            **SEARCHES[search],
        )
        assert torch.equal(compiled, eager), size
    assert hasattr(model, "_compiled_call")  # generate() decoded through torch.compile


@pytest.mark.slow
def test_a_compiled_forward_gives_the_eager_beam_search():
    """transformers' beam search calls the model itself (no automatic compilation): the other documented route,
    `model.forward = torch.compile(model.forward)`, with the static cache reordered in place."""
    model = train_transformer_reverser()
    model.set_attn_implementation("sdpa")
    input_ids, attention_mask = batch(8, seed=11)
    eager = generate(model, input_ids, attention_mask, **SEARCHES["beam4"])
    model.forward = torch.compile(model.forward, fullgraph=True)
    compiled = generate(model, input_ids, attention_mask, cache_implementation="static", **SEARCHES["beam4"])
    assert torch.equal(compiled, eager)
