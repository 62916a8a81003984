"""Tiny Marian (OPUS-MT style) models and a real SentencePiece MarianTokenizer, built offline for the interop tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer


def bart_sizes(layers: int, heads: int) -> dict:
    """A tiny model of the BART family (Marian, BART, M2M100): on each side `layers` layers of `heads` heads,
    width 16, feed-forward 32."""
    return dict(
        d_model=16,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
    )


MARIAN_TINY = dict(
    vocab_size=60,
    **bart_sizes(2, 4),
    max_position_embeddings=64,
    dropout=0.0,
    eos_token_id=0,
    pad_token_id=59,
    decoder_start_token_id=59,
    activation_function="swish",
    scale_embedding=True,
)

SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the sun is warm today",
    "we like to read books",
    "birds sing in the morning",
    "she walks to school",
    "he plays the guitar",
    "the river flows to the sea",
]


def random_marian(seed: int = 0, weight_std: float = 0.3, **overrides) -> MarianMTModel:
    """A MarianMTModel with random weights (std `weight_std`, larger than transformers' 0.02 so that greedy and beam
    outputs depend on the input), a nonzero final_logits_bias, and OPUS-MT's generation config (no <pad> output)."""
    torch.manual_seed(seed)
    config = MarianConfig(**{**MARIAN_TINY, **overrides})
    config._attn_implementation = "eager"
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:  # the sinusoids are frozen parameters
                parameter.normal_(std=weight_std)
        model.final_logits_bias.normal_(std=0.5)
    model.generation_config.bad_words_ids = [[config.pad_token_id]]
    return model


def marian_tokenizer(folder: Path) -> MarianTokenizer:
    """A MarianTokenizer over a SentencePiece model trained on SENTENCES, with Marian's vocabulary layout:
    </s> = 0, <unk> = 1, the pieces, <pad> last (the Marian model's vocab_size is len(tokenizer))."""
    sentencepiece = pytest.importorskip(
        "sentencepiece", reason="MarianTokenizer needs sentencepiece (the interop extra)"
    )
    folder.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES),
        model_prefix=str(folder / "spm"),
        vocab_size=40,
        model_type="unigram",
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(1, processor.get_piece_size())]  # id 0 is <unk>
    tokens = ["</s>", "<unk>", *pieces, "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}), encoding="utf-8")
    spm = str(folder / "spm.model")
    return MarianTokenizer(spm, spm, str(folder / "vocab.json"), source_lang="en", target_lang="xx")


def saved_marian(folder: Path, seed: int = 0) -> tuple[MarianMTModel, MarianTokenizer]:
    """A random Marian model with a real tokenizer, saved in `folder` as an OPUS-MT checkpoint is."""
    tokenizer = marian_tokenizer(folder.with_name(folder.name + "-spm"))
    size = len(tokenizer)
    model = random_marian(
        seed, vocab_size=size, pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer
