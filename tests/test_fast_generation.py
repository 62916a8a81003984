"""modeling_attn.fast_generation: the lean decoding loop gives generate()'s token ids, or None where it does not.

Reference checks: for each config variant the loop covers, batches of one sentence and of padded sentences, greedy and
beam search over the settings it accepts, lexically constrained beam search too, `fast_generate(...)` equals
`model.generate(...)` token for token (shape included); each refused setting returns None.
"""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import LogitsProcessorList

from modeling_attn import fast_generation
from modeling_attn.api.quantize import quantize_int8_rowwise
from modeling_attn.compat import CACHE_FIELD
from modeling_attn.fast_generation import ACCEPTED, fast_generate

SPECIALS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, decoder_start_token_id=1)
VARIANTS = {
    # the paper: post-LN, one embedding matrix for source, target and output, embeddings scaled
    "paper": dict(),
    # everything the config lets differ: pre-LN (final LayerNorms), separate source/target/output matrices and a
    # smaller target vocabulary, a logits bias, unscaled embeddings, GELU, [sin | cos] positions
    "pre-LN, separate": dict(
        norm_first=True,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
        decoder_vocab_size=50,
        final_logits_bias=True,
        scale_embedding=False,
        activation_function="gelu",
        positional_layout="halves",
    ),
    # a position table shorter than source + 50: the per-sentence limit is capped by it
    "short positions": dict(max_position_embeddings=9),
}


def variant_model(name: str, seed: int = 0):
    """A tiny Transformer whose translations end at different lengths: weights scaled up, the end token favoured
    (as tests/test_beam_search.py's), so that beams finish, close sentences and hit the limits."""
    model = tiny_model("sdpa", seed=seed, **SPECIALS, **VARIANTS[name])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4)
        model.lm_head.weight[2] += 0.5
        if model.final_logits_bias is not None:
            model.final_logits_bias.normal_(0.0, 1.0)
            model.final_logits_bias[0, 2] += 9.0  # translations that end before their limit
    model.generation_config.max_length_over_source = 4  # short: limits reached within a few steps
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request):
    return variant_model(request.param)


BATCHES = {"one sentence": dict(batch=1), "padded": dict(batch=4)}


def batch(name: str, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids, attention_mask, _ = padded_batch(seed=3, vocab=vocab, **BATCHES[name])
    return input_ids, attention_mask


def assert_same(model, input_ids, attention_mask, **settings) -> torch.Tensor:
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    got = fast_generate(model, input_ids, attention_mask, **settings)
    assert got is not None, f"refused {settings}"
    assert got.shape == expected.shape and torch.equal(got, expected), (settings, expected, got)
    assert not got.is_inference()  # a tensor the caller may change in place, as generate()'s
    return got


LENGTHS = {
    "per-sentence limit": {},  # generation_config.max_length_over_source = 4
    "limit as argument": {"max_length_over_source": 2},
    "max_new_tokens cuts": {"max_new_tokens": 3},
    "max_length": {"max_length": 5},
    "no limit field": {"max_length_over_source": None},
}


@pytest.mark.parametrize("batch_name", list(BATCHES))
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_greedy_gives_generates_ids(model, batch_name, lengths):
    input_ids, attention_mask = batch(batch_name, model.config.vocab_size)
    assert_same(model, input_ids, attention_mask, num_beams=1, **LENGTHS[lengths])


# num_beams x length_penalty x early_stopping as a Latin square: each pair of values meets once (9 searches, not 27)
SEARCH = [
    (beams, penalty, stopping)
    for (i, beams), (j, penalty) in itertools.product(enumerate((2, 4, 5)), enumerate((0.6, 1.0, 2.0)))
    for stopping in [(True, False, "never")[(i + j) % 3]]
]


@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_beam_search_gives_generates_ids(model, batch_name):
    input_ids, attention_mask = batch(batch_name, model.config.vocab_size)
    for num_beams, length_penalty, early_stopping in SEARCH:
        settings = dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
        assert_same(model, input_ids, attention_mask, **settings)


@pytest.mark.parametrize("batch_name", list(BATCHES))
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_beam_search_lengths_and_nbest(model, batch_name, lengths):
    input_ids, attention_mask = batch(batch_name, model.config.vocab_size)
    assert_same(model, input_ids, attention_mask, num_beams=4, num_return_sequences=3, **LENGTHS[lengths])


def phrases(seed: int, sentences: int, vocab: int) -> list[list[list[int]]]:
    """Per sentence, 0 to 2 phrases of 1 to 3 tokens (ids past the special ones): lexical constraints."""
    generator = random.Random(seed)
    return [
        [
            [generator.randrange(3, vocab) for _ in range(generator.randint(1, 3))]
            for _ in range(generator.randint(0, 2))
        ]
        for _ in range(sentences)
    ]


@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_constrained_beam_search_gives_generates_ids(model, lengths):
    """With constraints (modeling_attn/constraints.py) the loop runs `ConstrainedListBeamSearch`, which picks what
    generate()'s `ConstrainedSentences` picks: at the limits (per-sentence or max_length) too, n-best lists too."""
    input_ids, attention_mask = batch("padded", model.config.vocab_size)
    vocab = model.config.decoder_vocab_size or model.config.vocab_size
    for seed, (num_beams, returned, penalty, stopping) in enumerate([(4, 1, 1.0, False), (3, 3, 0.6, True)]):
        settings = dict(num_beams=num_beams, num_return_sequences=returned, length_penalty=penalty)
        constraints = phrases(seed, input_ids.shape[0], vocab)
        settings.update(early_stopping=stopping, force_words_ids_per_sentence=constraints, **LENGTHS[lengths])
        assert_same(model, input_ids, attention_mask, **settings)
    assert_same(model, input_ids, attention_mask, num_beams=2, force_words_ids=[[3, 4], [5]], **LENGTHS[lengths])


@pytest.mark.parametrize("rows", [1, 4])
def test_a_step_gives_the_models_cached_logits_bit_for_bit(model, rows):
    """`DecoderStep` against the model's own cached decoder (what generate() runs at each step), position after
    position of a target read teacher-forced, padded sources included: the same logits bit for bit, the reason the
    loop's ids are generate()'s."""
    input_ids, attention_mask, _ = padded_batch(seed=5, vocab=model.config.vocab_size, batch=rows)
    vocab = model.config.decoder_vocab_size or model.config.vocab_size
    targets = torch.randint(3, vocab, (rows, 6), generator=torch.Generator().manual_seed(0))
    step = fast_generation.DecoderStep(model)
    with torch.inference_mode():
        encoder_outputs = model.model.encoder(input_ids=input_ids, attention_mask=attention_mask)
        encoded = encoder_outputs.last_hidden_state
        cross_kv, cross_mask = step.cross_keys_values(encoded), fast_generation._cross_mask(attention_mask)
        self_kv = step.new_cache(rows, targets.shape[1], encoded)
        past = None
        for position in range(targets.shape[1]):
            tokens = targets[:, position]
            outputs = model(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                decoder_input_ids=tokens[:, None],
                use_cache=True,
                **{CACHE_FIELD: past},  # the installed transformers' name for the cache argument
            )
            past = getattr(outputs, CACHE_FIELD)
            logits = step(tokens, position, self_kv, cross_kv, cross_mask)
            assert torch.equal(logits, outputs.logits[:, -1]), (position, (logits - outputs.logits[:, -1]).abs().max())


@pytest.mark.parametrize("rows", [1, 4])
def test_the_encoder_pass_gives_the_encoders_output_bit_for_bit(model, rows):
    """`EncoderPass` against the model's encoder, one sentence and a padded batch (its feed-forward network on the
    real tokens only): the same output bit for bit; bad ids and a fully masked row raise the encoder's own errors."""
    input_ids, attention_mask, _ = padded_batch(seed=7, vocab=model.config.vocab_size, batch=rows)
    encode = fast_generation.EncoderPass(model)
    with torch.inference_mode():
        expected = model.model.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert torch.equal(encode(input_ids, attention_mask), expected)
        bad_ids = input_ids.clone()
        bad_ids[0, 0] = model.config.vocab_size
        empty_row = attention_mask.clone()
        empty_row[-1] = 0
        for ids, mask in ((bad_ids, attention_mask), (input_ids, empty_row)):
            with pytest.raises((IndexError, ValueError)) as expected_error:
                model.model.encoder(input_ids=ids, attention_mask=mask)
            with pytest.raises(expected_error.type, match=re.escape(str(expected_error.value))):
                encode(ids, mask)


def test_the_same_ids_with_three_projections(monkeypatch):
    """Where one q/k/v matmul would round differently (`fusion_is_exact` False), the step keeps three: same ids."""
    model = variant_model("paper", seed=1)
    input_ids, attention_mask = batch("padded", model.config.vocab_size)
    monkeypatch.setattr(fast_generation, "fusion_is_exact", lambda attention, rows: False)
    for num_beams in (1, 4):
        assert_same(model, input_ids, attention_mask, num_beams=num_beams)


def test_weights_changed_in_place_are_used():
    """The remembered decoder step follows the model: weights changed in place give the new model's ids."""
    model = variant_model("paper", seed=2)
    input_ids, attention_mask = batch("padded", model.config.vocab_size)
    before = assert_same(model, input_ids, attention_mask, num_beams=4)
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            layer.self_attn.q_proj.weight.mul_(-3)
            layer.fc2.bias.normal_(0.0, 8.0, generator=torch.Generator().manual_seed(0))
    after = assert_same(model, input_ids, attention_mask, num_beams=4)
    assert not torch.equal(before, after)


def hooked(model):
    model.model.decoder.layers[0].register_forward_hook(lambda module, args, output: output)
    return model


REFUSED_SETTINGS = {
    "sampling": {"do_sample": True},
    "greedy n-best": {"num_return_sequences": 2},
    "n-best beyond the beams": {"num_beams": 2, "num_return_sequences": 3},
    "attentions": {"output_attentions": True, "return_dict_in_generate": True},
    "dict output": {"return_dict_in_generate": True},
    "scores": {"output_scores": True, "return_dict_in_generate": True},
    "a processor it does not replicate": {"no_repeat_ngram_size": 2},
    "min_new_tokens": {"min_new_tokens": 2},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "logits_processor": {"logits_processor": LogitsProcessorList()},
    "no cache": {"use_cache": False},
    "static cache": {"cache_implementation": "static"},
    "bad limit": {"max_length_over_source": 0},
    "no end token": {"eos_token_id": None, "max_length_over_source": None, "max_new_tokens": 3},
    "encoder_outputs": {"encoder_outputs": None},
    "constraints on greedy search": {"force_words_ids": [[3]]},  # generate() raises
}


@pytest.mark.parametrize("name", list(REFUSED_SETTINGS))
def test_refused_settings_return_none(name):
    model = variant_model("paper")
    input_ids, attention_mask = batch("padded", model.config.vocab_size)
    assert fast_generate(model, input_ids, attention_mask, **REFUSED_SETTINGS[name]) is None


REFUSED_MODELS = {
    "the RNN": lambda: spread_tiny_rnn(**SPECIALS),
    "training mode": lambda: variant_model("paper").train(),
    "eager attention": lambda: tiny_model("eager", **SPECIALS),
    "a forward hook": lambda: hooked(variant_model("paper")),
    "a quantized layer": lambda: torch.ao.quantization.quantize_dynamic(variant_model("paper"), {torch.nn.Linear}),
    "row-wise int8 layers": lambda: quantize_int8_rowwise(variant_model("paper")),  # `--quantize int8_rowwise`
}


@pytest.mark.parametrize("name", list(REFUSED_MODELS))
def test_refused_models_return_none(name):
    model = REFUSED_MODELS[name]()
    input_ids, attention_mask = batch("padded", 50)
    assert fast_generate(model, input_ids, attention_mask) is None


def test_refused_inputs_return_none():
    model = variant_model("paper")
    input_ids, attention_mask = batch("padded", model.config.vocab_size)
    assert fast_generate(model, input_ids, None) is None  # generate() infers a mask from the pad token
    assert fast_generate(model, input_ids[:0], attention_mask[:0]) is None  # generate() raises


def test_accepted_settings_are_named_once():
    """The accepted set is the module's one table; everything else must keep transformers' default."""
    assert {"num_beams", "length_penalty", "early_stopping", "max_new_tokens", "max_length_over_source"} <= set(
        ACCEPTED
    )
    assert "do_sample" not in ACCEPTED and "no_repeat_ngram_size" not in ACCEPTED
