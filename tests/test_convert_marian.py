"""convert_marian: Marian (OPUS-MT) checkpoints to attn_transformer and back, and the final_logits_bias flag.

Reference checks: a random MarianMTModel (transformers' implementation) and its conversion give the same logits
and the same greedy and beam outputs; converting back gives bitwise-equal weights; the 'interleaved' to 'halves'
permutation is checked against the two sinusoid tables; the CLI converts a saved folder with a real SentencePiece
Marian tokenizer.
"""

from __future__ import annotations

import json

import pytest
import torch
from marian_tiny import SENTENCES, bart_sizes, random_marian, saved_marian
from safetensors.torch import load_file
from tasks import EOS, PAD, fit_reverse_task, one_thread, reverse_task
from tiny import padded_batch, tiny_model
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    MarianModel,
    MarianMTModel,
    MarianTokenizer,
    T5Config,
    T5ForConditionalGeneration,
)

from modeling_attn import AttnTransformerForConditionalGeneration
from modeling_attn.api.convert_marian import (
    MarianConversionError,
    attn_to_marian,
    convert_marian_folder,
    interleaved_to_halves,
    marian_to_attn,
)
from modeling_attn.api.hub import model_origin
from modeling_attn.cli.main import main as cli
from modeling_attn.modeling_transformer import sinusoid_table

SEPARATE = dict(
    share_encoder_decoder_embeddings=False, decoder_vocab_size=50, pad_token_id=49, decoder_start_token_id=49
)
VARIANTS = {
    "shared-swish-scaled": dict(),  # OPUS-MT's settings
    "shared-relu-unscaled": dict(activation_function="relu", scale_embedding=False),
    "separate-swish-scaled": dict(SEPARATE),
    "separate-relu-unscaled-untied": dict(
        SEPARATE, activation_function="relu", scale_embedding=False, tie_word_embeddings=False
    ),
    "shared-gelu-untied-equal-embeddings": dict(activation_function="gelu", tie_word_embeddings=False),
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():  # tiny matrices: faster on one thread of the shared CPU
        yield


def marian_variant(name: str) -> MarianMTModel:
    model = random_marian(**VARIANTS[name])
    if name.endswith("equal-embeddings"):  # one matrix in all three places, as a checkpoint tied before saving has
        with torch.no_grad():
            model.model.decoder.embed_tokens.weight.copy_(model.model.encoder.embed_tokens.weight)
            model.model.shared.weight.copy_(model.model.encoder.embed_tokens.weight)
    return model


def batch(model: MarianMTModel, seed: int = 0):
    source_vocab = model.config.vocab_size
    target_vocab = model.config.decoder_vocab_size
    input_ids, attention_mask, _ = padded_batch(seed, batch=4, source_length=9, vocab=source_vocab - 1)
    input_ids = input_ids.masked_fill(attention_mask == 0, model.config.pad_token_id)
    decoder_input_ids = torch.randint(1, target_vocab - 1, (4, 6), generator=torch.Generator().manual_seed(seed))
    return input_ids, attention_mask, decoder_input_ids


def assert_same_function(marian: MarianMTModel, ours, seed: int = 0) -> None:
    """Same logits to 1e-5; same greedy and beam-search outputs (and beam scores) from generate()."""
    input_ids, attention_mask, decoder_input_ids = batch(marian, seed)
    with torch.no_grad():
        expected = marian(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        logits = ours(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    for num_beams in (1, 3):
        settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=8, do_sample=False)
        settings.update(return_dict_in_generate=True, output_scores=True)
        want, got = marian.generate(input_ids, **settings), ours.generate(input_ids, **settings)
        assert torch.equal(got.sequences, want.sequences), num_beams
        if num_beams > 1:
            torch.testing.assert_close(got.sequences_scores, want.sequences_scores, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_marian_to_attn_computes_the_same(variant):
    marian = marian_variant(variant)
    ours = marian_to_attn(marian)
    assert isinstance(ours, AttnTransformerForConditionalGeneration)
    config = ours.config
    assert (config.positional_layout, config.final_logits_bias, config.norm_first) == ("halves", True, False)
    assert config.decoder_start_token_id == config.pad_token_id == marian.config.pad_token_id
    assert config.activation_function == marian.config.activation_function
    assert ours.generation_config.bad_words_ids == [[marian.config.pad_token_id]]
    assert torch.equal(ours.final_logits_bias, marian.final_logits_bias) and ours.final_logits_bias.abs().sum() > 0
    assert_same_function(marian, ours)


def train_marian_reverser(steps: int = 150) -> MarianMTModel:
    """A MarianMTModel with OPUS-MT's settings trained briefly on `reverse_task` (6 s): random Marian models
    repeat one token whatever the input, a trained one gives input-dependent outputs with close decisions."""
    torch.manual_seed(0)
    model = random_marian(
        vocab_size=16,
        d_model=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        weight_std=0.02,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    return fit_reverse_task(model, optimizer, steps)


def test_trained_marian_translates_the_same_after_conversion():
    marian = train_marian_reverser()
    ours = marian_to_attn(marian)
    input_ids, attention_mask, labels = reverse_task(100, torch.Generator().manual_seed(7))
    for num_beams in (1, 4):
        settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10)
        expected = marian.generate(input_ids, **settings)
        assert torch.equal(ours.generate(input_ids, **settings), expected), num_beams
        assert len({tuple(row) for row in expected.tolist()}) > 80  # outputs depend on the input
    lengths = (labels != -100).sum(-1)  # the end token closes each translation after as many tokens as the source
    assert (expected[torch.arange(100), lengths] == EOS).float().mean() > 0.9


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_is_bitwise(variant):
    marian = marian_variant(variant)
    back = attn_to_marian(marian_to_attn(marian))
    assert type(back) is MarianMTModel
    expected, state = marian.state_dict(), back.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], expected[name]) for name in expected), [
        name for name in expected if not torch.equal(state[name], expected[name])
    ]
    for field in ("share_encoder_decoder_embeddings", "tie_word_embeddings", "decoder_vocab_size", "scale_embedding"):
        assert getattr(back.config, field) == getattr(marian.config, field), field
    assert back.generation_config.to_dict() == marian.generation_config.to_dict()


def test_shared_untied_marian_with_different_embeddings_becomes_separate_vocabularies():
    """transformers' Marian with share_encoder_decoder_embeddings=True, tie_word_embeddings=False computes with
    separate encoder and decoder matrices (its `shared` is unused): that is our separate-vocabulary model."""
    marian = random_marian(tie_word_embeddings=False)
    encoder, decoder = marian.model.encoder.embed_tokens.weight, marian.model.decoder.embed_tokens.weight
    assert not torch.equal(encoder, decoder)
    ours = marian_to_attn(marian)
    assert not ours.config.share_encoder_decoder_embeddings and ours.config.decoder_vocab_size == 60
    assert_same_function(marian, ours)
    back = attn_to_marian(ours).state_dict()
    assert all(torch.equal(back[name], tensor) for name, tensor in marian.state_dict().items() if "shared" not in name)


def test_interleaved_to_halves_maps_one_table_onto_the_other():
    """The permutation turns the paper's interleaved sinusoids into Marian's [sin | cos] layout exactly."""
    interleaved, halves = sinusoid_table(50, 16, "interleaved"), sinusoid_table(50, 16, "halves")
    assert not torch.equal(interleaved, halves)
    permuted = interleaved_to_halves({"model.shared.weight": interleaved}, 16)["model.shared.weight"]
    assert torch.equal(permuted, halves)


@pytest.mark.parametrize(
    "variant",
    [
        dict(),  # the paper: interleaved positions, relu, tied
        dict(activation_function="swish", final_logits_bias=True),
        dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=70, tie_word_embeddings=False),
    ],
)
def test_attn_to_marian_computes_the_same(variant):
    ours = tiny_model(**variant)
    with torch.no_grad():  # weights large enough for outputs to depend on the input
        for name, parameter in ours.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(std=0.3)
        if ours.final_logits_bias is not None:
            ours.final_logits_bias.normal_(std=0.5)
    marian = attn_to_marian(ours)
    assert_same_function(marian, ours)
    again = marian_to_attn(marian)  # back as 'halves', the same function
    assert again.config.positional_layout == "halves"
    assert_same_function(marian, again, seed=1)


def tiny_bart() -> BartForConditionalGeneration:
    """Another architecture of the same shape family (BART), which the conversion must refuse."""
    config = BartConfig(vocab_size=40, **bart_sizes(1, 2))
    return BartForConditionalGeneration(config)


def test_unsupported_architectures_raise():
    bart = tiny_bart()
    with pytest.raises(MarianConversionError, match="BartForConditionalGeneration.*'bart'"):
        marian_to_attn(bart)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    with pytest.raises(MarianConversionError, match="T5ForConditionalGeneration.*'t5'"):
        marian_to_attn(t5)
    with pytest.raises(MarianConversionError, match="MarianModel"):  # Marian without its output projection
        marian_to_attn(MarianModel(random_marian().config))
    with pytest.raises(MarianConversionError, match="MarianMTModel"):
        attn_to_marian(random_marian())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(decoder_attention_heads=2), "encoder_attention_heads=4 differs from decoder_attention_heads=2"),
        (dict(decoder_ffn_dim=48), "encoder_ffn_dim=32 differs from decoder_ffn_dim=48"),
        (dict(encoder_layerdrop=0.1), "encoder_layerdrop=0.1"),
    ],
)
def test_unmappable_marian_configs_raise(overrides, message):
    with pytest.raises(MarianConversionError, match=message):
        marian_to_attn(random_marian(**overrides))


def test_changed_marian_position_table_raises():
    marian = random_marian()
    with torch.no_grad():
        marian.model.decoder.embed_positions.weight[3] += 0.1
    with pytest.raises(MarianConversionError, match="model.decoder.embed_positions.weight"):
        marian_to_attn(marian)


@pytest.mark.parametrize(
    "overrides, message", [(dict(norm_first=True), "norm_first=True"), (dict(layer_norm_eps=1e-6), "layer_norm_eps")]
)
def test_unmappable_attn_configs_raise(overrides, message):
    with pytest.raises(MarianConversionError, match=message):
        attn_to_marian(tiny_model(**overrides))


def test_final_logits_bias_flag(tmp_path):
    """Off by default (no tensor, checkpoints unchanged); on, a zero-initialised (1, V) buffer added to the logits,
    saved in safetensors and loaded back."""
    plain = tiny_model()
    assert plain.final_logits_bias is None and "final_logits_bias" not in plain.state_dict()
    biased = tiny_model(final_logits_bias=True, decoder_vocab_size=70, share_encoder_decoder_embeddings=False)
    assert biased.final_logits_bias.shape == (1, 70) and not biased.final_logits_bias.any()
    assert "final_logits_bias" not in dict(biased.named_parameters())  # fixed, as Marian's
    with torch.no_grad():
        biased.final_logits_bias.normal_()
    input_ids, attention_mask, decoder_input_ids = padded_batch(vocab=70)
    without = tiny_model(decoder_vocab_size=70, share_encoder_decoder_embeddings=False)  # same seed, same weights
    with torch.no_grad():
        logits = biased(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        reference = without(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(logits, reference + biased.final_logits_bias, rtol=0, atol=1e-6)
    biased.save_pretrained(tmp_path)
    assert torch.equal(load_file(tmp_path / "model.safetensors")["final_logits_bias"], biased.final_logits_bias)
    loaded = AttnTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.final_logits_bias, biased.final_logits_bias)


def test_cli_converts_a_marian_folder_with_its_tokenizer(tmp_path, capsys):
    """`attn convert --from-marian` and `--to-marian` on a saved OPUS-MT-style folder with a SentencePiece
    MarianTokenizer: the converted folder loads through the Auto classes and translates as Marian does."""
    pytest.importorskip("sentencepiece", reason="MarianTokenizer needs sentencepiece (the interop extra)")
    marian, tokenizer = saved_marian(tmp_path / "marian")
    assert cli(["convert", "--from-marian", str(tmp_path / "marian"), "--to", str(tmp_path / "ours")]) == 0
    origin = json.loads((tmp_path / "ours" / "origin.json").read_text())  # for the card's base_model (attn push)
    assert (origin["source"], origin["hub_id"]) == (str((tmp_path / "marian").resolve()), None)  # a local folder
    assert model_origin(tmp_path / "ours") == (None, "converted from the Marian model marian (a local folder)")
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "ours")
    ours_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert isinstance(ours, AttnTransformerForConditionalGeneration)
    assert isinstance(ours_tokenizer, MarianTokenizer)
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    assert torch.equal(ours_tokenizer(SENTENCES, return_tensors="pt", padding=True)["input_ids"], inputs["input_ids"])
    expected = marian.generate(**inputs, max_new_tokens=12)
    translated = ours.generate(**inputs, max_new_tokens=12)
    assert torch.equal(translated, expected)
    assert ours_tokenizer.batch_decode(translated) == tokenizer.batch_decode(expected)

    assert cli(["convert", "--to-marian", str(tmp_path / "ours"), "--to", str(tmp_path / "back")]) == 0
    back = MarianMTModel.from_pretrained(tmp_path / "back")
    assert all(torch.equal(back.state_dict()[name], tensor) for name, tensor in marian.state_dict().items())
    assert isinstance(AutoTokenizer.from_pretrained(tmp_path / "back"), MarianTokenizer)
    assert "converted" in capsys.readouterr().out


def test_cli_rejects_another_architecture(tmp_path, capsys):
    tiny_bart().save_pretrained(tmp_path / "bart")
    assert cli(["convert", "--from-marian", str(tmp_path / "bart"), "--to", str(tmp_path / "out")]) == 2
    assert "holds a 'bart' model, not a Marian one" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(MarianConversionError, match="'bart' model"):
        convert_marian_folder(tmp_path / "bart", tmp_path / "out")
