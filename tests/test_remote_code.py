"""`save_pretrained` is all or nothing (remote_code.py `save_all_or_nothing`, encoder_decoder.py `save_pretrained`):
an invalid config or mismatched vocabulary sizes are refused before any file is written, and a failure while writing
(here: the weights file) leaves the target folder as it was, absent or with only its earlier files, and no staging
folder behind. Saving over an earlier checkpoint replaces its files and keeps the others."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import transformers.modeling_utils
from huggingface_hub.errors import StrictDataclassClassValidationError
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import AutoModelForSeq2SeqLM

MODELS = {"transformer": tiny_model, "rnn": spread_tiny_rnn}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256); {} when it does not exist."""
    if not folder.exists():
        return {}
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def earlier_checkpoint(folder: Path) -> dict[str, str]:
    """A checkpoint of another model saved into `folder`, plus a file of the user's; returns its snapshot."""
    tiny_model(seed=7).save_pretrained(folder)
    (folder / "notes.txt").write_text("mine")
    return snapshot(folder)


def fail_writing_weights(monkeypatch) -> None:
    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", disk_full)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "over-a-checkpoint"])
def test_an_invalid_config_is_refused_before_any_file_is_written(tmp_path, kind, earlier):
    target = tmp_path / "models" / "checkpoint"
    before = earlier_checkpoint(target) if earlier else {}
    model = MODELS[kind]()
    model.config.pad_token_id = 500  # outside the vocabulary: a class validator refuses it
    with pytest.raises(StrictDataclassClassValidationError, match="pad_token_id must be a token id in"):
        model.save_pretrained(target)
    assert snapshot(target) == before
    assert [path.name for path in tmp_path.rglob("*") if path.name.startswith(".")] == []  # no staging folder
    assert (tmp_path / "models").exists() == earlier


@pytest.mark.parametrize("kind", MODELS)
def test_a_vocabulary_size_the_weights_do_not_have_is_refused_before_any_file_is_written(tmp_path, kind):
    model = MODELS[kind](share_encoder_decoder_embeddings=False, tie_word_embeddings=False)
    model.config.decoder_vocab_size = 98  # a valid config, but the decoder embeddings and lm_head have 99 rows
    with pytest.raises(
        ValueError, match=r"decoder.embed_tokens has 99 vocabulary entries but config.decoder_vocab_size is 98"
    ):
        model.save_pretrained(tmp_path / "checkpoint")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "over-a-checkpoint"])
def test_a_failure_while_writing_leaves_the_folder_as_it_was(tmp_path, monkeypatch, kind, earlier):
    target = tmp_path / "new" / "parents" / "checkpoint"
    before = earlier_checkpoint(target) if earlier else {}
    fail_writing_weights(monkeypatch)
    with pytest.raises(OSError, match="No space left on device"):
        MODELS[kind]().save_pretrained(target)
    assert snapshot(target) == before
    if earlier:
        assert sorted(path.name for path in target.parent.iterdir()) == ["checkpoint"]
    else:
        assert list(tmp_path.iterdir()) == []  # the parent folders made for the save are gone too


@pytest.mark.parametrize("kind", MODELS)
def test_saving_over_a_checkpoint_replaces_its_files_and_keeps_the_others(tmp_path, kind):
    target = tmp_path / "checkpoint"
    tiny_model(seed=7).save_pretrained(target, max_shard_size="20KB")  # a sharded earlier checkpoint
    assert len(list(target.glob("model-0000*-of-0000*.safetensors"))) > 1
    (target / "notes.txt").write_text("mine")
    model = MODELS[kind]()
    model.save_pretrained(target)
    names = {path.name for path in target.iterdir()}
    assert "model.safetensors" in names and "notes.txt" in names
    assert not any(name.startswith("model-0000") for name in names)  # the earlier shards, as transformers removes
    assert not any(name.startswith(".") for name in names)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(target, attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(
            loaded(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits,
            model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits,
        )


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "checkpoint").write_text("a file")
    with pytest.raises(NotADirectoryError, match="checkpoint is a file; it saves into a folder"):
        tiny_model().save_pretrained(tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint").read_text() == "a file"
