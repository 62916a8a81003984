"""The Python API of our models refuses bad decoding settings with a ValueError naming the argument, before any
decoding step (issue 34; modeling_attn/generation.py `check_generate_arguments`, modeling_attn/api/translation.py):
`num_beams` / `num_return_sequences` not positive (transformers: ZeroDivisionError, a negative tensor size), a
`length_penalty` that is not finite (transformers: NaN scores), a sampling temperature of 0, below or NaN
(transformers' own check), an empty batch (transformers' own models fail in a reshape); `translate` of no sentences
is no translations, and a `batch_size` of 0 (which would drop every sentence) is refused."""

from __future__ import annotations

import math

import pytest
import torch
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import GenerationMixin

from modeling_attn.api.translation import translate, translate_batch, translate_nbest

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
MODELS = {"attn_transformer": lambda: tiny_model("sdpa", **SPECIAL), "attn_rnn": lambda: spread_tiny_rnn(**SPECIAL)}


@pytest.fixture(params=list(MODELS))
def model(request):
    return MODELS[request.param]()


BAD_SETTINGS = [
    ({"num_beams": 0}, r"^generate\(\): num_beams must be a positive integer, got 0$"),
    ({"num_beams": -2}, r"^generate\(\): num_beams must be a positive integer, got -2$"),
    ({"num_beams": 2.0}, r"^generate\(\): num_beams must be a positive integer, got 2\.0$"),
    ({"num_beams": 2, "num_return_sequences": 0}, r"^generate\(\): num_return_sequences must be a positive integer"),
    ({"num_beams": 2, "length_penalty": math.nan}, r"^generate\(\): length_penalty must be a finite number, got nan$"),
    ({"num_beams": 2, "length_penalty": math.inf}, r"^generate\(\): length_penalty must be a finite number, got inf$"),
    ({"do_sample": True, "temperature": math.nan}, r"`temperature` \(=nan\) has to be a strictly positive float"),
    ({"do_sample": True, "temperature": 0.0}, r"`temperature` \(=0\.0\) has to be a strictly positive float"),
    ({"do_sample": True, "temperature": -1.0}, r"`temperature` \(=-1\.0\) has to be a strictly positive float"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_argument_before_any_step(model, settings, message):
    input_ids, attention_mask, _ = padded_batch()
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4, **settings)
    assert calls == []  # refused before the encoder ran


def test_a_bad_setting_in_the_generation_config_is_refused_alike(model):
    input_ids, attention_mask, _ = padded_batch()
    model.generation_config.num_beams = 0
    with pytest.raises(ValueError, match=r"num_beams must be a positive integer, got 0"):
        model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4)
    model.generation_config.num_beams = 2  # an explicit argument overrides the config's, as in generate()
    model.generation_config.length_penalty = math.nan
    assert model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4, length_penalty=1.0).shape[0] == 3


def test_a_negative_length_penalty_is_taken_as_transformers_documents_it(model, monkeypatch):
    """Negative: shorter translations favoured; the same tokens as transformers' own beam search."""
    input_ids, attention_mask, _ = padded_batch(batch=4)
    settings = dict(attention_mask=attention_mask, num_beams=3, length_penalty=-1.0, max_new_tokens=6)
    with torch.no_grad():
        ours = model.generate(input_ids, **settings)
        with monkeypatch.context() as patch:
            patch.setattr(type(model), "_beam_search", GenerationMixin._beam_search)
            theirs = model.generate(input_ids, **settings)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_an_empty_batch_is_refused_naming_what_holds_it(model, num_beams):
    input_ids, attention_mask, _ = padded_batch()
    with pytest.raises(ValueError, match=r"^generate\(\): the batch is empty \(input_ids has shape \(0, 7\)\)"):
        model.generate(input_ids[:0], attention_mask=attention_mask[:0], num_beams=num_beams, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"the batch is empty \(input_ids has shape \(0, 7\)\)"):
        model.generate(input_ids=input_ids[:0], num_beams=num_beams, max_new_tokens=4)
    encoder_outputs = model.get_encoder()(input_ids[:1], attention_mask=attention_mask[:1])
    encoder_outputs.last_hidden_state = encoder_outputs.last_hidden_state[:0]
    with pytest.raises(ValueError, match=r"the batch is empty \(encoder_outputs has shape \(0, 7, \d+\)\)"):
        model.generate(encoder_outputs=encoder_outputs, attention_mask=attention_mask[:0], max_new_tokens=4)


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(["the cat sat on the mat", "a dog ran in the park"] * 5, vocab_size=60, min_frequency=1)


def test_translate_of_no_sentences_is_no_translations_and_a_bad_batch_size_is_refused_at_the_call(tokenizer):
    model = tiny_model("sdpa", vocab_size=len(tokenizer), **SPECIAL)
    assert list(translate(model, tokenizer, [])) == []
    assert translate_batch(model, tokenizer, []) == ([], None)
    assert translate_nbest(model, tokenizer, [], num_return_sequences=2, num_beams=2) == []
    for batch_size in (0, -1, 2.5):
        with pytest.raises(ValueError, match=rf"^batch_size must be a positive integer, got {batch_size}$"):
            translate(model, tokenizer, ["the cat"], batch_size=batch_size)  # at the call, not at the first next()
    with pytest.raises(ValueError, match=r"generate\(\): num_beams must be a positive integer, got 0"):
        list(translate(model, tokenizer, ["the cat", "a dog"], num_beams=0, max_new_tokens=3))
    translations = list(translate(model, tokenizer, ["the cat", "", "a dog"], batch_size=2, max_new_tokens=3))
    assert len(translations) == 3 and translations[1] == ""


def test_translate_refuses_one_string_and_an_item_that_is_not_a_string(tokenizer):
    """One string would be translated character by character; None would fail inside `str.strip`."""
    model = tiny_model("sdpa", vocab_size=len(tokenizer), **SPECIAL)
    with pytest.raises(TypeError, match=r"^sentences: give a list of sentences, not one str: 'May 2, 2030'$"):
        translate(model, tokenizer, "May 2, 2030")  # at the call
    with pytest.raises(TypeError, match=r"^sentence 2 is a NoneType, not a str: None$"):
        list(translate(model, tokenizer, ["the cat", "a dog", None], max_new_tokens=3))
