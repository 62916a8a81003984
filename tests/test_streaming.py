"""Streaming (issue 58, modeling_attn/api/streaming.py): a translation as it is made, token by token or sentence by
sentence, through the Python API.

References: the non-streamed translation of the same sentence on the same engine (the streamed pieces concatenate to
it, for torch and CTranslate2, greedy and seeded sampling), generate()'s own streamer (the fast loop feeds the same
tokens), the tokenizer's decoding of the whole sequence (the pieces of `TextDeltas` are prefixes of it, a partial
character held back), and `translate_document` (a streamed document's events concatenate to it, the first batch one
sentence).
"""

from __future__ import annotations

import threading

import pytest
import torch
from tasks import one_thread
from test_engines import SENTENCES
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast, set_seed

from modeling_attn.api.documents import DocumentEvent, translate_document
from modeling_attn.api.engines import load_translator
from modeling_attn.api.streaming import (
    StreamClosed,
    TextDeltas,
    TokenCallback,
    TokenEvent,
    stream_sentence,
    translate_stream,
)
from modeling_attn.fast_generation import fast_generate

DOCUMENT = "a b c\nd e f g\n\nh i\nj k l m\n  b a  "  # five sentences: a line break ends one


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=["torch", "ctranslate2"])
def engine(request, reverser_dir):
    return load_translator(str(reverser_dir), engine=request.param, device="cpu", threads=1)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's scheme): a character outside ASCII is several tokens, each a partial character."""
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(["café crème", "日本語の文", "naïve façade"], vocab_size=260, min_frequency=1)
    return PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer)


def test_text_deltas_concatenate_to_the_decoding_and_hold_partial_characters_and_spaces():
    tokenizer = byte_level_tokenizer()
    text = "日本語 café, naïve"
    ids = tokenizer(text)["input_ids"]
    deltas = TextDeltas(tokenizer)
    pieces = [deltas.push(token_id) for token_id in ids]
    assert "".join(pieces) + deltas.finish(tokenizer.decode(ids)) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # a token that ends inside a character (or in a space) waits for the next
    streamed = ""
    for count, piece in enumerate(pieces, 1):
        streamed += piece
        assert tokenizer.decode(ids[:count]).startswith(streamed)
    with pytest.raises(RuntimeError, match="do not concatenate"):
        rewritten = TextDeltas(tokenizer)
        assert "".join(rewritten.push(token_id) for token_id in ids) == "日本語 café, naïve"
        rewritten.finish("日本語 cafe")


def test_the_fast_loop_feeds_a_streamer_the_tokens_generate_gives_it(reverser_dir, torch_model):
    model, tokenizer = torch_model
    for sentence in SENTENCES[:6]:
        encoded = tokenizer([sentence], return_tensors="pt", return_token_type_ids=False)
        fast, slow = [], []
        sequences = fast_generate(model, **encoded, num_beams=1, streamer=TokenCallback(fast.append))
        assert sequences is not None
        reference = model.generate(**encoded, num_beams=1, streamer=TokenCallback(slow.append))
        assert fast == slow == sequences[0, 1:].tolist() == reference[0, 1:].tolist()


@pytest.fixture(scope="module")
def torch_model(reverser_dir):
    from modeling_attn.api.translation import load_model

    return load_model(str(reverser_dir), "cpu")


def test_a_greedy_stream_is_a_token_at_a_time_and_concatenates_to_the_translation(engine):
    for sentence in SENTENCES:
        events = list(translate_stream(engine, sentence, num_beams=1))
        expected = engine.translate_nbest([sentence], 1, num_beams=1)[0][0].text
        assert all(isinstance(event, TokenEvent) and event.index == 0 for event in events)
        assert "".join(event.text for event in events) == expected
        assert len(events) == len(expected.split())  # one letter a token (the first without its space)


def test_a_seeded_sample_streams_the_non_streamed_sample(engine):
    options = {"do_sample": True, "num_beams": 1, "top_k": 4, "temperature": 2.0}
    for sentence in SENTENCES[:8]:
        engine.seed(7)
        expected = engine.translate_nbest([sentence], 1, **options)[0][0]
        engine.seed(7)
        pieces = []
        found = stream_sentence(engine, sentence, pieces.append, **options)
        assert "".join(pieces) == found.text == expected.text
        assert found.score == pytest.approx(expected.score, abs=1e-5)


def test_beam_search_streams_the_sentence_whole(engine):
    events = list(translate_stream(engine, SENTENCES[3]))  # the model's 2 beams
    expected = engine.translate_batch([SENTENCES[3]])[0]
    assert events == [DocumentEvent(0, SENTENCES[3], expected, expected, 1)]


def test_an_empty_sentence_streams_nothing(engine):
    assert [event.text for event in translate_stream(engine, "  ", num_beams=1)] in ([], [""])


def test_a_streamed_document_concatenates_to_the_translated_document_its_first_batch_one_sentence(engine):
    sizes = []
    translate_batch = engine.translate_batch

    def counted(sentences, **options):
        sizes.append(len(sentences))
        return translate_batch(sentences, **options)

    engine.translate_batch = counted
    try:
        events = list(translate_stream(engine, DOCUMENT, document=True, batch_size=4, source_lang="en"))
    finally:
        del engine.translate_batch
    assert sizes == [1, 2, 2]
    assert "".join(event.text for event in events) == translate_document(engine, DOCUMENT, source_lang="en")
    assert [event.index for event in events] == [0, 1, 2, 3, 4]


class CountingEngine:
    """An engine that streams the tokens 0, 1, 2... (each decoded as its number and a space), waiting after the first
    until `resume` is set; `made` counts the tokens it made, `stopped` says how it ended."""

    class tokenizer:  # noqa: N801 (stands in for a tokenizer)
        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return "".join(f"{token_id} " for token_id in ids)

    def __init__(self):
        self.resume, self.made, self.stopped = threading.Event(), 0, threading.Event()

    def can_stream(self, options):
        return True

    def translate_streamed(self, sentence, on_token, **options):
        try:
            for token_id in range(100):
                self.made += 1
                on_token(token_id)
                self.resume.wait(10)
        except StreamClosed:
            self.stopped.set()
            raise


def test_closing_a_token_stream_stops_the_decoding_at_the_next_token():
    counting = CountingEngine()
    stream = translate_stream(counting, "anything")
    assert next(stream) == TokenEvent(0, "0")  # "0 ", its space held until the next token
    stream.close()
    counting.resume.set()
    assert counting.stopped.wait(10)
    assert counting.made == 2  # the first token, read, and the second, refused


def test_torch_streams_through_generate_when_the_fast_loop_declines(reverser_dir):
    translator = load_translator(str(reverser_dir), engine="torch", device="cpu", threads=1)
    set_seed(3)
    sampled = [event.text for event in translate_stream(translator, SENTENCES[5], do_sample=True, num_beams=1)]
    set_seed(3)
    expected = translator.translate_batch([SENTENCES[5]], do_sample=True, num_beams=1)[0]
    assert "".join(sampled) == expected
    assert torch.get_num_threads() == 1
