"""Vocabulary changes keep the model whole (encoder_decoder.py `resize_token_embeddings`,
`resize_decoder_token_embeddings`): for both model types and every embedding-sharing variant the configs allow, the
config's vocabulary fields, the embedding matrices, the output layer and the logits bias keep one size and their
ties; the kept rows are unchanged (logits over the kept vocabulary are bit-identical), the new rows are read, and
the resized model saves and loads to the same weights and logits (up to rounding:
`assert_saved_and_loaded`). Trainer runs after a resize: tests/test_clients.py."""

from __future__ import annotations

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from test_translate import save_tiny_model
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from modeling_attn import AttnRNNConfig, AttnRNNModel, AttnTransformerConfig, AttnTransformerModel

TINY_TARGET = 91

# (model type, flags): every combination of shared/separate embeddings and tied/untied output layer, and Marian's
# logits bias; separate vocabularies get a target vocabulary of another size than the source one.
SEPARATE = dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=TINY_TARGET)
VARIANTS = {
    "transformer-shared-tied": ("transformer", {}),
    "transformer-shared-untied": ("transformer", dict(tie_word_embeddings=False)),
    "transformer-separate-tied": ("transformer", SEPARATE),
    "transformer-separate-untied": ("transformer", dict(SEPARATE, tie_word_embeddings=False)),
    "transformer-shared-tied-bias": ("transformer", dict(final_logits_bias=True)),
    "transformer-separate-untied-bias": (
        "transformer",
        dict(SEPARATE, tie_word_embeddings=False, final_logits_bias=True),
    ),
    "rnn-joint-untied": ("rnn", {}),  # as `attn train` makes it: one tokenizer, separate embedding matrices
    "transformer-joint-untied": (
        "transformer",
        dict(share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
    ),
    "rnn-separate-untied": ("rnn", dict(decoder_vocab_size=TINY_TARGET)),
    "rnn-separate-tied": ("rnn", dict(decoder_vocab_size=TINY_TARGET, tie_word_embeddings=True)),
    "rnn-shared-untied": ("rnn", dict(share_encoder_decoder_embeddings=True)),
    "rnn-shared-tied": ("rnn", dict(share_encoder_decoder_embeddings=True, tie_word_embeddings=True)),
}
KEPT_IDS = 85  # the test batches use ids below this, inside every vocabulary before and after resizing


def build(variant: str):
    kind, flags = VARIANTS[variant]
    model = tiny_model(**flags) if kind == "transformer" else spread_tiny_rnn(**flags)
    if model.final_logits_bias is not None:  # zeros at init: give it values, so that resizing it is seen
        model.final_logits_bias.copy_(torch.linspace(-1, 1, model.final_logits_bias.shape[-1])[None])
    return model


def assert_saved_and_loaded(loaded, model, output) -> None:
    """`loaded` (saved `model`, loaded) holds the same weights bit for bit, and `output(loaded)` equals
    `output(model)` up to rounding: the same weights sit in other memory (the resized matrices are fresh copies), and a
    CPU's vector kernels may add in another order for another alignment (avx2 without AMX, as on an AMD EPYC or
    under ATEN_CPU_CAPABILITY=avx2: the RNN's logits differ by up to 4e-6, its recurrence carrying the rounding)."""
    weights = model.state_dict()
    assert weights.keys() == loaded.state_dict().keys()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in loaded.state_dict().items())
    torch.testing.assert_close(output(loaded), output(model), rtol=1e-4, atol=1e-5)


def batch(source_high: int = KEPT_IDS, target_high: int = KEPT_IDS, seed: int = 0) -> dict:
    """A padded batch whose source ids reach source_high - 1 and target ids target_high - 1."""
    input_ids, attention_mask, decoder_input_ids = padded_batch(seed=seed, vocab=min(source_high, target_high))
    input_ids[0, 0], decoder_input_ids[0, 0] = source_high - 1, target_high - 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


def check_whole(model) -> None:
    """Every vocabulary matrix has its config field's size, and the ties the config asks for hold."""
    config, base = model.config, model.model
    source, target = base.encoder.embed_tokens, base.decoder.embed_tokens
    assert source.weight.shape[0] == source.num_embeddings == config.vocab_size
    assert target.weight.shape[0] == target.num_embeddings == config.decoder_vocab_size
    assert model.lm_head.weight.shape[0] == model.lm_head.out_features == config.decoder_vocab_size
    if config.share_encoder_decoder_embeddings:
        assert source.weight is base.shared.weight and target.weight is base.shared.weight
    else:
        assert source.weight is not target.weight
    assert (model.lm_head.weight is target.weight) == config.tie_word_embeddings
    if model.final_logits_bias is not None:
        assert model.final_logits_bias.shape == (1, config.decoder_vocab_size)


@torch.no_grad()
def logits(model, inputs: dict) -> torch.Tensor:
    return model(**inputs, use_cache=False).logits


# growing and shrinking for every variant; padding to a multiple (with and without a new size) for one per model type
RESIZES = [(variant, *size) for variant in VARIANTS for size in ((107, None, 107), (90, None, 90))] + [
    (variant, *size)
    for variant in ("transformer-separate-untied-bias", "rnn-shared-tied")
    for size in ((101, 8, 104), (None, 64, 128))
]


@pytest.mark.parametrize("variant, new_num_tokens, pad_to_multiple_of, expected", RESIZES)
def test_resize_token_embeddings_keeps_every_vocabulary_matrix_in_step(
    tmp_path, variant, new_num_tokens, pad_to_multiple_of, expected
):
    model = build(variant)
    joint = model.config.joint_vocabulary
    old_target = model.config.decoder_vocab_size
    before = logits(model, batch())

    assert model.resize_token_embeddings(new_num_tokens, pad_to_multiple_of) is model.get_input_embeddings()

    target = expected if joint else old_target
    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (expected, target)
    check_whole(model)
    kept = min(old_target, target)
    after = logits(model, batch())
    assert after.shape[-1] == target
    assert torch.equal(after[..., :kept], before[..., :kept])  # the kept rows are the old ones
    if model.final_logits_bias is not None and target > old_target:
        assert not model.final_logits_bias[0, old_target:].any()  # an added token's bias is 0, as Marian's

    # the whole new vocabulary is read (the highest new id runs), and the model saves and loads to the same logits
    reaching = batch(source_high=expected, target_high=target, seed=1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    check_whole(loaded)
    assert_saved_and_loaded(loaded, model, lambda m: logits(m, reaching))


@pytest.mark.parametrize("variant", [name for name, (_, flags) in VARIANTS.items() if "decoder_vocab_size" in flags])
@pytest.mark.parametrize("new_num_tokens, pad_to_multiple_of, expected", [(95, 16, 96), (88, None, 88)])
def test_resize_decoder_token_embeddings_resizes_the_separate_target_vocabulary(
    tmp_path, variant, new_num_tokens, pad_to_multiple_of, expected
):
    model = build(variant)
    before = logits(model, batch())

    model.resize_decoder_token_embeddings(new_num_tokens, pad_to_multiple_of)

    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (99, expected)
    check_whole(model)
    kept = min(TINY_TARGET, expected)
    assert torch.equal(logits(model, batch())[..., :kept], before[..., :kept])
    reaching = batch(source_high=99, target_high=expected, seed=1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    check_whole(loaded)
    assert_saved_and_loaded(loaded, model, lambda m: logits(m, reaching))


@pytest.mark.parametrize(
    "config_class, model_class", [(AttnTransformerConfig, AttnTransformerModel), (AttnRNNConfig, AttnRNNModel)]
)
@pytest.mark.parametrize("shared, joint", [(True, True), (False, True), (False, False)])
def test_the_base_model_resizes_and_reloads_too(tmp_path, config_class, model_class, shared, joint):
    small = (
        dict(d_model=16, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=16)
        if config_class is AttnTransformerConfig
        else dict(embedding_size=8, encoder_hidden_size=8, decoder_hidden_size=8, attention_size=8, readout_size=8)
    )
    config = config_class(vocab_size=40, share_encoder_decoder_embeddings=shared, joint_vocabulary=joint, **small)
    model = model_class(config).eval()
    model.resize_token_embeddings(50)
    assert model.config.vocab_size == model.encoder.embed_tokens.weight.shape[0] == 50
    assert model.config.decoder_vocab_size == model.decoder.embed_tokens.weight.shape[0] == (50 if joint else 40)
    assert (model.encoder.embed_tokens.weight is model.decoder.embed_tokens.weight) == shared
    inputs = dict(input_ids=torch.tensor([[49, 3, 4]]), decoder_input_ids=torch.tensor([[1, 5]]))
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert_saved_and_loaded(loaded, model, lambda m: m(**inputs).last_hidden_state)


@pytest.mark.parametrize(
    "variant, method",
    [
        ("transformer-shared-tied", "resize_token_embeddings"),
        ("rnn-separate-untied", "resize_decoder_token_embeddings"),
    ],
)
def test_a_size_that_drops_a_special_token_is_refused_and_nothing_changes(variant, method):
    model = build(variant)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = model.config.to_dict()
    with pytest.raises(
        ValueError,
        match=rf"(?s){method}: .*decoder_vocab_size=2 would make the config invalid; nothing was changed"
        r".*eos_token_id must be a token id in \[0, decoder_vocab_size=2\), got 2",
    ):
        getattr(model, method)(2)
    with pytest.raises(ValueError, match=f"{method}: new_num_tokens must be a positive integer or None, got 0"):
        getattr(model, method)(0)
    with pytest.raises(ValueError, match="pad the embedding matrix to a multiple of `2.5`, which is not and integer"):
        getattr(model, method)(100, pad_to_multiple_of=2.5)
    with pytest.raises(ValueError, match=f"{method}: pad_to_multiple_of must be a positive integer or None, got -8"):
        getattr(model, method)(100, pad_to_multiple_of=-8)
    assert model.config.to_dict() == config
    assert all(torch.equal(tensor, state[name]) for name, tensor in model.state_dict().items())
    check_whole(model)


def test_resize_decoder_token_embeddings_is_refused_with_one_shared_matrix():
    model = build("transformer-shared-tied")
    with pytest.raises(ValueError, match="share one embedding matrix .* resize both with resize_token_embeddings"):
        model.resize_decoder_token_embeddings(120)
    assert model.config.decoder_vocab_size == 99


def test_a_stack_alone_is_not_resized():
    model = build("transformer-shared-tied")
    with pytest.raises(NotImplementedError, match="resize the whole model's vocabulary instead"):
        model.model.decoder.resize_token_embeddings(120)


def test_a_target_id_beyond_a_separate_vocabulary_names_the_resize_to_call():
    model = build("rnn-separate-untied")
    model.resize_token_embeddings(105)  # the source side only
    inputs = batch()
    inputs["decoder_input_ids"][0, 1] = 100
    with pytest.raises(
        IndexError, match=r"decoder_input_ids holds token id 100 .* \[0, 91\) .*resize_decoder_token_embeddings"
    ):
        model(**inputs)


def test_resized_model_keeps_accelerate_hooks_and_frozen_embeddings():
    """What a client that froze the embeddings or dispatched the model finds after a resize: the same modules."""
    model = build("transformer-separate-untied")
    model.model.encoder.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    encoder_embeddings = model.model.encoder.embed_tokens
    model.resize_token_embeddings(110)
    model.resize_decoder_token_embeddings(100)
    assert model.model.encoder.embed_tokens is encoder_embeddings  # resized in place
    assert not model.model.encoder.embed_tokens.weight.requires_grad
    assert not model.lm_head.weight.requires_grad
    check_whole(model)


def test_a_model_of_one_tokenizer_takes_new_tokens_with_one_call(tmp_path):
    """An attn_rnn as `attn train` makes it (one joint BPE tokenizer, separate source and target embeddings): after
    one resize_token_embeddings(len(tokenizer)) the new tokens are read on both sides and can be produced; saved and
    reloaded, the model translates them alike."""
    folder = save_tiny_model(tmp_path / "trained", "attn_rnn")
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    assert model.config.joint_vocabulary and not model.config.share_encoder_decoder_embeddings
    old_size = len(tokenizer)
    tokenizer.add_tokens(["<term_a>", "<term_b>"])
    model.resize_token_embeddings(len(tokenizer))
    check_whole(model)
    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (old_size + 2,) * 2
    new_id = tokenizer.convert_tokens_to_ids("<term_b>")

    def translate(model, tokenizer) -> list[str]:
        encoded = tokenizer(["the <term_a> sat", "<term_b> park"], return_tensors="pt", padding=True)
        assert (encoded["input_ids"] >= old_size).any()  # the source side reads the new ids
        with torch.no_grad():  # the first target token is a new one: the decoder reads it at the next step
            ids = model.generate(**encoded, forced_bos_token_id=new_id, num_beams=1, max_new_tokens=4)
        assert (ids[:, 1] == new_id).all()
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    translations = translate(model, tokenizer)
    assert all(text.startswith("<term_b>") for text in translations)
    model.save_pretrained(tmp_path / "resized")
    tokenizer.save_pretrained(tmp_path / "resized")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "resized").eval()
    assert translate(reloaded, AutoTokenizer.from_pretrained(tmp_path / "resized")) == translations
    with pytest.raises(ValueError, match="one vocabulary .*joint_vocabulary=True.*resize both with resize_token_emb"):
        model.resize_decoder_token_embeddings(len(tokenizer) + 8)


@pytest.mark.parametrize("config_class", [AttnTransformerConfig, AttnRNNConfig])
def test_one_vocabulary_or_two_in_the_config(config_class):
    """joint_vocabulary defaults to whether the sizes are equal, also for a config.json written before the field; a
    contradiction is refused naming both fields."""
    separate = dict(share_encoder_decoder_embeddings=False)
    assert config_class(vocab_size=40, **separate).joint_vocabulary
    assert not config_class(vocab_size=40, decoder_vocab_size=30, **separate).joint_vocabulary
    older = config_class(vocab_size=40, **separate).to_dict()
    del older["joint_vocabulary"]
    assert config_class.from_dict(older).joint_vocabulary
    assert not config_class.from_dict({**older, "decoder_vocab_size": 30}).joint_vocabulary
    assert not config_class(vocab_size=40, joint_vocabulary=False, **separate).joint_vocabulary  # two of one size
    with pytest.raises(StrictDataclassError, match=r"joint_vocabulary=True .* decoder_vocab_size \(30\) to equal"):
        config_class(vocab_size=40, decoder_vocab_size=30, joint_vocabulary=True, **separate)
    with pytest.raises(StrictDataclassError, match="embeddings=True .*joint_vocabulary=False contradicts"):
        config_class(vocab_size=40, share_encoder_decoder_embeddings=True, joint_vocabulary=False)
