"""export_ctranslate2: our models in CTranslate2 give our translations and our log-probabilities.

Reference checks: greedy translations of a trained model (batched, padded in transformers, unpadded in
CTranslate2) are identical; CTranslate2's teacher-forced log-probabilities equal our log-softmax for every
config variant (both positional layouts, pre-LN, activations, separate vocabularies, untied projection, final
logits bias); an int8 export is smaller and its weights agree with float32 on most sentences; a Marian folder with its
SentencePiece tokenizer exports through `attn export` and translates text as Marian does.
"""

from __future__ import annotations

import copy

import pytest
import torch
from marian_tiny import SENTENCES, saved_marian
from tasks import EOS, one_thread, reverse_task, train_transformer_reverser
from tiny import tiny_model

from modeling_attn import AttnTransformerForConditionalGeneration
from modeling_attn.api.export_ctranslate2 import CTranslate2Translator, export_ctranslate2
from modeling_attn.cli.main import main as cli

pytest.importorskip(
    "ctranslate2", reason="the CTranslate2 export needs ctranslate2 (pip install modeling-attn[interop])"
)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():  # tiny matrices: faster on one thread of the shared CPU
        yield


@pytest.fixture(scope="module")
def reverser() -> AttnTransformerForConditionalGeneration:
    """Our Transformer (the paper's settings: interleaved positions, post-LN, relu) trained briefly on
    `reverse_task` (6 s): input-dependent outputs with close decisions, where a wrong weight would show."""
    with one_thread():
        return train_transformer_reverser(steps=150)


def unpadded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True)]


def translations(generated: torch.Tensor, eos: int) -> list[list[int]]:
    """generate() rows without the start token, cut before the end token (CTranslate2's output format)."""
    rows = []
    for row in generated[:, 1:].tolist():
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


@pytest.fixture(scope="module")
def exported(reverser, tmp_path_factory):
    return export_ctranslate2(reverser, tmp_path_factory.mktemp("ct2") / "float32")


def test_greedy_translations_match(reverser, exported):
    input_ids, attention_mask, labels = reverse_task(200, torch.Generator().manual_seed(7))
    expected = translations(
        reverser.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=10), EOS
    )
    assert len({tuple(row) for row in expected}) > 150  # the outputs depend on the input
    got = CTranslate2Translator(exported).translate_ids(
        unpadded(input_ids, attention_mask), beam_size=1, max_decoding_length=10
    )
    assert got == expected


def test_beam_search_translations_nearly_match(reverser, exported):
    """Beam search (4 beams, the paper's length penalty 0.6): the same translations but for rare sentences where
    the searches stop differently: CTranslate2 stops once 4 hypotheses have ended (patience 1), generate() goes on
    while a longer one may still score better (measured: 100 of 100 identical here, 199 of 200 on a larger batch
    where both give the same scores to the same hypotheses and generate() found one more)."""
    input_ids, attention_mask, _ = reverse_task(100, torch.Generator().manual_seed(7))
    settings = dict(attention_mask=attention_mask, num_beams=4, length_penalty=0.6, max_new_tokens=10)
    expected = translations(reverser.generate(input_ids, **settings), EOS)
    got = CTranslate2Translator(exported).translate_ids(
        unpadded(input_ids, attention_mask), beam_size=4, length_penalty=0.6, max_decoding_length=10
    )
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= 0.97 * len(expected)


def test_int8_export_loads_and_runs(reverser, exported, tmp_path):
    """The int8 weights (what the export writes) agree with float32 on most sentences when CTranslate2 computes in
    float32 with them. Its int8 kernels depend on the CPU: on an AVX2 CPU without VNNI (7-bit products), this
    barely trained model's close decisions agreed on 19 of 200 sentences, against 187 of 200 for the same weights
    computed in float32; so the int8 kernels are only required to run and give valid tokens."""
    int8 = export_ctranslate2(reverser, tmp_path / "int8", quantization="int8")
    assert (int8 / "model.bin").stat().st_size < 0.6 * (exported / "model.bin").stat().st_size
    input_ids, attention_mask, _ = reverse_task(200, torch.Generator().manual_seed(8))
    sources = unpadded(input_ids, attention_mask)
    reference = CTranslate2Translator(exported).translate_ids(sources, beam_size=1, max_decoding_length=10)
    dequantized = CTranslate2Translator(int8, compute_type="float32").translate_ids(
        sources, beam_size=1, max_decoding_length=10
    )
    assert sum(a == b for a, b in zip(dequantized, reference, strict=True)) >= 0.8 * len(sources)
    quantized = CTranslate2Translator(int8).translate_ids(sources, beam_size=1, max_decoding_length=10)
    assert len(quantized) == len(sources) and all(0 <= token < 16 for row in quantized for token in row)


VARIANTS = {
    "paper": dict(),
    "pre-ln-gelu": dict(norm_first=True, activation_function="gelu"),
    "marian-like": dict(
        positional_layout="halves",
        activation_function="swish",
        final_logits_bias=True,
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=77,
        tie_word_embeddings=False,
    ),
    "unscaled-tanh-gelu": dict(scale_embedding=False, activation_function="gelu_new", layer_norm_eps=1e-6),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_log_probabilities_match(variant, tmp_path):
    model = tiny_model(**VARIANTS[variant])
    with torch.no_grad():
        if model.final_logits_bias is not None:
            model.final_logits_bias.normal_(std=0.5)
    translator = CTranslate2Translator(export_ctranslate2(model, tmp_path / "ct2"))
    generator = torch.Generator().manual_seed(0)
    sources = [torch.randint(3, 99, (length,), generator=generator).tolist() + [EOS] for length in (3, 8, 5)]
    targets = [torch.randint(3, 77, (length,), generator=generator).tolist() for length in (4, 2, 7)]
    scores = translator.score_ids(sources, targets)
    for source, target, score in zip(sources, targets, scores, strict=True):
        decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *target]])
        with torch.no_grad():
            logits = model(torch.tensor([source]), decoder_input_ids=decoder_input_ids).logits[0]
        expected = logits.log_softmax(-1).gather(-1, torch.tensor([*target, EOS])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(score), expected, rtol=0, atol=2e-5)


def test_unsupported_activation_raises(tmp_path):
    with pytest.raises(ValueError, match="activation_function='mish' has no CTranslate2 counterpart"):
        export_ctranslate2(tiny_model(activation_function="mish"), tmp_path / "ct2")


def test_cli_exports_a_marian_folder_with_its_tokenizer(tmp_path, capsys):
    """`attn export` on an OPUS-MT-style folder: texts in, texts out, as the Marian model translates them (its
    generation config forbids <pad>; CTranslate2 gets that as suppress_sequences)."""
    pytest.importorskip("sentencepiece", reason="MarianTokenizer needs sentencepiece (the interop extra)")
    marian, tokenizer = saved_marian(tmp_path / "marian", seed=3)
    assert cli(["export", str(tmp_path / "marian"), "--ctranslate2", str(tmp_path / "ct2")]) == 0
    assert "exported" in capsys.readouterr().out
    translator = CTranslate2Translator(tmp_path / "ct2")
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    generated = marian.generate(**inputs, num_beams=1, max_new_tokens=12)
    expected = translations(generated, marian.config.eos_token_id)
    assert translator.translate_ids(tokenizer(SENTENCES)["input_ids"], max_decoding_length=12) == expected
    assert translator.translate(SENTENCES, max_decoding_length=12) == tokenizer.batch_decode(
        generated, skip_special_tokens=True
    )


def test_cli_exports_our_folder_with_its_bpe_tokenizer(tmp_path, capsys):
    """`attn export` on a folder as `attn train` writes it (our joint BPE tokenizer, a model vocabulary larger
    than the tokenizer's): the vocabularies are the tokenizer's tokens, and texts translate as generate() does."""
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(SENTENCES * 3, vocab_size=60, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer) + 5, final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias.normal_(std=2.0)  # outputs beyond the first repeated token
    model.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    assert cli(["export", str(tmp_path / "ours"), "--ctranslate2", str(tmp_path / "ct2")]) == 0
    translator = CTranslate2Translator(tmp_path / "ct2")
    known = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert translator.source_tokens == known + [f"<unused_{i}>" for i in range(len(tokenizer), len(tokenizer) + 5)]
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    generated = model.generate(**inputs, num_beams=1, max_new_tokens=6)
    assert translator.translate(SENTENCES, beam_size=1, max_decoding_length=6) == tokenizer.batch_decode(
        generated, skip_special_tokens=True
    )
    again = ["export", str(tmp_path / "ours"), "--ctranslate2", str(tmp_path / "ct2")]
    assert cli(again) == 0  # its own earlier export is replaced
    (tmp_path / "ct2" / "notes.txt").write_text("the user's")  # a file the export did not write: kept, unless --force
    assert cli(again) == 2 and "did not write (notes.txt); choose" in capsys.readouterr().err
    assert cli([*again, "--force"]) == 0
    assert (tmp_path / "ct2" / "notes.txt").read_text() == "the user's"


@pytest.mark.parametrize(("layer", "heads"), [(0, 2), (-1, 1), (1, 0)])
def test_attention_of_the_alignment_heads_matches(reverser, tmp_path, layer, heads):
    """The export carries the config's alignment layer and heads: CTranslate2's `return_attention` equals the
    attention our word alignments read (`api.alignment.selected_attention`) for the same greedy translation, and
    differs from another layer's, so a setting that was not carried would show."""
    from modeling_attn.api.alignment import selected_attention
    from modeling_attn.api.heatmaps import attention_from_generate

    model = copy.deepcopy(reverser)
    model.config.alignment_layer, model.config.alignment_heads = layer, heads
    model.set_attn_implementation("eager")
    translator = CTranslate2Translator(export_ctranslate2(model, tmp_path / "ct2"))
    input_ids, attention_mask, _ = reverse_task(12, torch.Generator().manual_seed(9))
    sources = unpadded(input_ids, attention_mask)
    results = translator.translate_ids_with_attention(sources, beam_size=1, max_decoding_length=10)
    other = copy.deepcopy(model.config)
    other.alignment_layer, other.alignment_heads = (1 if layer == 0 else 0), 0
    for source, (target_ids, theirs) in zip(sources, results, strict=True):
        outputs = model.generate(
            torch.tensor([source]),
            num_beams=1,
            max_new_tokens=10,
            output_attentions=True,
            return_dict_in_generate=True,
        )
        attention = attention_from_generate(outputs, torch.tensor([source]), eos_token_id=EOS)
        assert [int(token) for token in attention.target_tokens[: len(target_ids)]] == target_ids
        ours = selected_attention(attention, model.config)[: theirs.shape[0]]
        assert theirs.shape == (len(target_ids), len(source))
        torch.testing.assert_close(theirs, ours, rtol=0, atol=2e-5)
        assert not torch.allclose(theirs, selected_attention(attention, other)[: theirs.shape[0]], atol=1e-3)


def test_converted_marian_aligns_with_its_last_layer_first_head(tmp_path):
    """A converted OPUS-MT model keeps Marian's alignment setting (last decoder layer, first head) into the export."""
    from modeling_attn.api.alignment import selected_attention
    from modeling_attn.api.convert_marian import marian_to_attn
    from modeling_attn.api.heatmaps import attention_from_generate

    pytest.importorskip("sentencepiece", reason="MarianTokenizer needs sentencepiece (the interop extra)")
    marian, tokenizer = saved_marian(tmp_path / "marian", seed=3)
    model = marian_to_attn(marian)
    assert (model.config.alignment_layer, model.config.alignment_heads) == (-1, 1)
    translator = CTranslate2Translator(export_ctranslate2(tmp_path / "marian", tmp_path / "ct2"))
    sources = tokenizer(SENTENCES[:3])["input_ids"]
    results = translator.translate_ids_with_attention(sources, max_decoding_length=8, beam_size=1)
    model.set_attn_implementation("eager")
    for source, (target_ids, theirs) in zip(sources, results, strict=True):
        outputs = model.generate(
            torch.tensor([source]), num_beams=1, max_new_tokens=8, output_attentions=True, return_dict_in_generate=True
        )
        attention = attention_from_generate(outputs, torch.tensor([source]), eos_token_id=marian.config.eos_token_id)
        assert [int(token) for token in attention.target_tokens[: len(target_ids)]] == target_ids
        ours = selected_attention(attention, model.config)[: theirs.shape[0]]
        torch.testing.assert_close(theirs, ours, rtol=0, atol=2e-5)
        torch.testing.assert_close(ours, attention.cross_attention[-1, 0, : theirs.shape[0]])


def test_force_replaces_the_export_s_files_and_keeps_the_others(reverser, exported, tmp_path):
    """Python `export_ctranslate2(..., force=True)` into a folder holding an export and a file of the user's: the
    export's files are new, the user's file stays (CTranslate2's own `force` deletes the whole folder); without
    `force` an existing folder is refused before anything is written."""
    folder = tmp_path / "ct2"
    export_ctranslate2(reverser, folder)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="already exists"):
        export_ctranslate2(reverser, folder, quantization="int8")
    export_ctranslate2(reverser, folder, quantization="int8", force=True)
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / "model.bin").stat().st_size < (exported / "model.bin").stat().st_size  # int8 now
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        [path.name for path in exported.iterdir()] + ["notes.txt"]
    )
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".ct2-export-")]  # no staging left
    assert CTranslate2Translator(folder).translate_ids([[3, 4, 5, EOS]])  # the replaced export loads and decodes
