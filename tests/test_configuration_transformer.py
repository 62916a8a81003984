"""The config: the paper's defaults, named presets, and invalid values rejected at construction."""

from __future__ import annotations

import pytest
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig

from modeling_attn import AttnTransformerConfig
from modeling_attn.api.presets import available_presets, load_preset
from modeling_attn.cli.main import main as cli_main


def test_defaults_are_the_paper_base_model():
    config = AttnTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.num_heads, config.d_ff, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu" and not config.norm_first
    assert config.scale_embedding and config.positional_layout == "interleaved"
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert config.decoder_vocab_size == config.vocab_size and config.is_encoder_decoder


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("base", dict(d_model=512, num_heads=8, d_ff=2048, dropout=0.1, encoder_layers=6)),
        ("big", dict(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3, encoder_layers=6)),
        ("small", dict(d_model=128, num_heads=4)),
        ("tiny", dict(d_model=16, num_heads=4, encoder_layers=2, vocab_size=99)),
    ],
)
def test_presets(name, expected):
    config = load_preset(name)
    assert isinstance(config, AttnTransformerConfig)
    assert {key: getattr(config, key) for key in expected} == expected
    assert name in available_presets()


def test_preset_overrides_and_cli(capsys):
    assert load_preset("base", vocab_size=8000).vocab_size == 8000
    cli_main(["preset", "big"])
    assert '"d_model": 1024' in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown preset 'huge'.*base"):
        load_preset("huge")


def test_round_trip_through_auto_config(tmp_path):
    config = AttnTransformerConfig(d_model=32, num_heads=2, norm_first=True, positional_layout="halves")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, AttnTransformerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(d_model=30, num_heads=4), r"d_model \(30\) must be divisible by num_heads \(4\)"),
        (dict(d_model=0), "d_model must be a positive integer, got 0"),
        (dict(encoder_layers=-1), "encoder_layers must be a positive integer, got -1"),
        (dict(decoder_layers=0), "decoder_layers=0: zero decoder layers; a model needs at least one decoder layer"),
        (dict(encoder_layers=0), r"encoder_layers=0: zero encoder layers; .* \(give 1 or more\)"),  # not alignment
        (dict(num_heads=0), "num_heads must be a positive integer"),
        (dict(d_ff=0), "d_ff must be a positive integer"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
        (dict(max_position_embeddings=0), "max_position_embeddings must be a positive integer"),
        (dict(dropout=1.0), r"dropout must be a probability in \[0, 1\), got 1.0"),
        (dict(attention_dropout=-0.1), "attention_dropout must be a probability"),
        (dict(activation_function="relu6x"), "activation_function must be one of"),
        (dict(positional_layout="rotary"), r"positional_layout must be one of \['halves', 'interleaved'\]"),
        (dict(d_model=18, num_heads=2 * 9, d_ff=4), None),  # valid: 18 / 18 heads, even width
        (dict(d_model=9, num_heads=3), "d_model must be even"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be positive"),
        (dict(decoder_vocab_size=50), r"decoder_vocab_size \(50\) must equal vocab_size"),
        (dict(pad_token_id=37000), r"pad_token_id must be a token id in \[0, vocab_size=37000\)"),
        (dict(eos_token_id=-1), "eos_token_id must be a token id"),
    ],
)
def test_invalid_values_raise_naming_the_field(overrides, message):
    if message is None:
        AttnTransformerConfig(**overrides)
        return
    with pytest.raises(StrictDataclassError, match=f"AttnTransformerConfig.{message}"):
        AttnTransformerConfig(**overrides)


def test_wrong_types_raise():
    with pytest.raises(StrictDataclassError, match="d_model"):
        AttnTransformerConfig(d_model="512")
