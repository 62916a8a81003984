"""Documents (issue 58): running text split into sentences, translated, re-joined with its layout kept byte for byte.

References: hand-split texts, the engine's own translation of the same sentences one per line, and the text itself
(everything outside the translated sentences is compared byte for byte).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tasks import one_thread
from test_engines import SENTENCES

from modeling_attn.api.documents import (
    Document,
    document_events,
    fit_sentences,
    split_document,
    translate_document,
)
from modeling_attn.api.engines import load_translator
from modeling_attn.api.translation import SentenceTooLong, TranslateError
from modeling_attn.cli.main import main as cli


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_a_text_splits_into_its_sentences_and_the_text_between_them():
    text = "Dr. Smith went home. He slept!\r\n\r\n  Then, he left...\nDid he?  Yes.  \n\n"
    document = split_document(text, "en")
    assert document.sentences == ["Dr. Smith went home.", "He slept!", "Then, he left...", "Did he?", "Yes."]
    assert document.gaps == ["", " ", "\r\n\r\n  ", "\n", "  ", "  \n\n"]
    assert document.lines == [1, 1, 3, 4, 4]
    assert document.join(document.sentences) == text
    assert document.join(["1", "2", "3", "4", "5"]) == "1 2\r\n\r\n  3\n4  5  \n\n"


def test_german_abbreviations_do_not_end_a_sentence():
    document = split_document("Das ist z.B. ein Test. Herr Dr. Müller kam am 3. Mai. Er ging.", "de")
    assert document.sentences == ["Das ist z.B. ein Test.", "Herr Dr. Müller kam am 3. Mai.", "Er ging."]


def test_a_text_without_sentences_is_all_gap():
    assert split_document("", "en") == Document([], [""], [])
    assert split_document(" \n\n\t", "en") == Document([], [" \n\n\t"], [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*"ab .!?\n\r\t,;:-é。", "Mr.", "\u2028"]), max_size=40).map("".join))
def test_every_text_is_its_sentences_and_gaps_again(text):
    document = split_document(text, "en")
    assert document.join(document.sentences) == text
    assert all(sentence == sentence.strip() and sentence for sentence in document.sentences)
    assert all("\n" not in sentence and "\r" not in sentence for sentence in document.sentences)
    assert len(document.gaps) == len(document.sentences) + 1


def words(sentences: list[str]) -> list[int]:
    """A token count for the tests: words plus the end token."""
    return [len(sentence.split()) + 1 for sentence in sentences]


def test_a_long_sentence_is_split_at_the_clause_boundary_nearest_its_middle():
    text = "one two three, four five; six seven eight nine.\nten eleven"
    document = fit_sentences(split_document(text, "en"), words, limit=5)
    assert document.sentences == ["one two three,", "four five;", "six seven eight nine.", "ten eleven"]
    assert document.gaps == ["", " ", " ", "\n", ""]
    assert document.lines == [1, 1, 1, 2]
    assert document.join(document.sentences) == text
    unlimited = fit_sentences(split_document(text, "en"), words, limit=None)
    assert unlimited.sentences == [text.split("\n")[0], "ten eleven"]


def test_a_long_sentence_without_a_clause_boundary_is_refused_by_its_line():
    with pytest.raises(SentenceTooLong, match=r"line 2: the sentence 'a b c d e f g' has 8 tokens.* limit of 5"):
        fit_sentences(split_document("a b.\na b c d e f g", "en"), words, limit=5)


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_a_document_of_one_sentence_per_paragraph_gives_the_per_line_translations(reverser_dir, engine):
    translator = load_translator(str(reverser_dir), engine=engine, device="cpu")
    per_line = translator.translate_batch(SENTENCES[:7])
    text = "\n\n".join(SENTENCES[:7]) + "\n"
    assert translate_document(translator, text, batch_size=3, source_lang="en") == "\n\n".join(per_line) + "\n"


def test_sentences_of_a_paragraph_are_translated_apart_and_the_layout_kept(torch_engine):
    text = "  a b c? d e f g h?\n\nh i j k!\n l m.  \n"
    pieces = ["a b c?", "d e f g h?", "h i j k!", "l m."]
    assert split_document(text, "en").sentences == pieces
    a, b, c, d = torch_engine.translate_batch(pieces)
    assert translate_document(torch_engine, text, source_lang="en") == f"  {a} {b}\n\n{c}\n {d}  \n"


def test_streamed_events_concatenate_to_the_answer(torch_engine):
    text = "\n".join(f"{sentence}." for sentence in SENTENCES[:9]) + "\n\n"
    answer = translate_document(torch_engine, text, source_lang="en", num_beams=1)
    events = list(document_events(torch_engine, text, batch_size=4, source_lang="en", ramp=True, num_beams=1))
    assert [event.index for event in events] == list(range(9))
    assert "".join(event.text for event in events) == answer
    assert [event.source for event in events] == [f"{sentence}." for sentence in SENTENCES[:9]]


def test_per_sentence_settings_are_refused_for_a_document(torch_engine):
    with pytest.raises(TranslateError, match="target_prefix: per-sentence settings do not apply to a document"):
        translate_document(torch_engine, "a b.", source_lang="en", target_prefix=["a"])


def test_attn_translate_document_writes_the_translated_document(reverser_dir, torch_engine, tmp_path, capsys):
    source = tmp_path / "doc.txt"
    text = "a b c! d e f g h?\r\n\r\nh i j k!\n"
    source.write_bytes(text.encode())
    common = ["translate", "--model", str(reverser_dir), "--engine", "torch", "--no_progress", "--document"]
    assert cli([*common, "--input", str(source), "--source_lang", "en"]) == 0
    a, b, c = torch_engine.translate_batch(["a b c!", "d e f g h?", "h i j k!"])
    assert capsys.readouterr().out == f"{a} {b}\r\n\r\n{c}\n"
    output = tmp_path / "out.txt"
    with pytest.warns(UserWarning, match="names no source language"):  # the saved model has no config.source_lang
        assert cli([*common, "--input", str(source), "--output", str(output)]) == 0
    assert output.read_bytes() == f"{a} {b}\r\n\r\n{c}\n".encode()


def test_attn_translate_document_refuses_per_line_flags_and_bad_input(reverser_dir, tmp_path, capsys):
    source = tmp_path / "doc.txt"
    source.write_bytes(b"a b.\n\xff c\n")
    common = ["translate", "--model", str(reverser_dir), "--engine", "torch", "--no_progress"]
    assert cli([*common, "--document", "--input", str(source)]) == 2
    assert f"{source}:2: not valid UTF-8 (byte 0xff at column 1)" in capsys.readouterr().err
    assert cli([*common, "--document", "--align", "a b"]) == 2
    assert "--align applies to one sentence per line, not to a --document" in capsys.readouterr().err
    assert cli([*common, "--source_lang", "en", "a b"]) == 2
    assert "--source_lang names a document's language; add --document" in capsys.readouterr().err
    long_line = " ".join(["a"] * 40)
    assert cli([*common, "--document", "--source_lang", "en", "b c.", long_line]) == 2
    assert "argument: line 2: the sentence" in capsys.readouterr().err


def test_each_sentence_is_counted_once_and_each_piece_of_a_split_once():
    asked = []

    def counted(sentences: list[str]) -> list[int]:
        asked.extend(sentences)
        return words(sentences)

    text = " ".join(f"Word{i} went home." for i in range(100)) + "\none two three, four five; six seven eight nine."
    document = fit_sentences(split_document(text, "en"), counted, limit=5)
    assert len(document.sentences) == 103 and len(asked) == 101 + 4  # 101 sentences, then two cuts of two pieces
