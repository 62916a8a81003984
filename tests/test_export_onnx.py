"""The ONNX export (modeling_attn/api/export_onnx.py) and decoding with it in onnxruntime (api/onnx_generation.py).

Reference checks, on a Transformer trained for a few seconds on the embedded dates task (training/synthetic.py)
until it translates most held-out dates exactly: onnxruntime's greedy and beam-search translations are generate()'s,
token for token, with the model's own generation config (beam 4, length penalty 0.6, the paper's per-sentence
length limit) and with fixed limits, over padded batches of several sizes; the texts are the model's; the export's
own check fails on a model that is not the exported one. Quick: the refusals (attn_rnn, a folder in the way, settings
the onnxruntime search does not reproduce), which need no export. The exports are slow (tens of seconds each).
"""

from __future__ import annotations

import pytest
import torch
from tasks import one_thread
from tiny import spread_tiny_rnn, two_layers

from modeling_attn import AttnTransformerConfig, AttnTransformerForConditionalGeneration
from modeling_attn.api.export_onnx import (
    DECODER_FILE,
    ENCODER_FILE,
    MANIFEST_FILE,
    export_onnx,
    export_onnx_model,
    graph_names,
    verify_export,
)
from modeling_attn.api.hub import paper_generation_config
from modeling_attn.api.outputs import foreign_files
from modeling_attn.cli.main import main as attn

TEST_DATES = 200


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def train_dates_model(steps: int = 400):
    """A 0.2M-parameter Transformer and its BPE tokenizer, trained on 4,000 pairs of the embedded dates task (~16 s
    of CPU on one thread; 86% of 200 held-out dates exact), with the generation config `attn train` writes."""
    from modeling_attn.training.synthetic import build_dataset
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    data = build_dataset({"train": 4000, "validation": 1, "test": TEST_DATES})
    train = data["train"]
    tokenizer = train_bpe_tokenizer([*train["source"], *train["target"]], vocab_size=200)
    torch.manual_seed(0)
    config = AttnTransformerConfig(
        vocab_size=len(tokenizer),
        **two_layers(64),
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    model = AttnTransformerForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    sources, targets = tokenizer(list(train["source"]))["input_ids"], tokenizer(list(train["target"]))["input_ids"]
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(sources), (64,), generator=generator).tolist()
        source_length, target_length = max(len(sources[i]) for i in rows), max(len(targets[i]) for i in rows)
        input_ids = torch.tensor(
            [sources[i] + [config.pad_token_id] * (source_length - len(sources[i])) for i in rows]
        )
        labels = torch.tensor([targets[i] + [-100] * (target_length - len(targets[i])) for i in rows])
        loss = model(input_ids=input_ids, attention_mask=(input_ids != config.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.generation_config = paper_generation_config(model)  # beam 4, length penalty 0.6, source length + 50
    return model, tokenizer, data["test"]


@pytest.fixture(scope="module")
def dates(tmp_path_factory):
    """The trained model saved as `attn train` saves one (weights, config, generation config, tokenizer), its
    export by `export_onnx(folder, ...)`, and the held-out dates."""
    for package in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(package, reason='the ONNX export needs pip install "modeling-attn[onnx]"')
    from modeling_attn.api.onnx_generation import OnnxTranslator

    with one_thread():
        model, tokenizer, test = train_dates_model()
    folder = tmp_path_factory.mktemp("dates") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    exported = export_onnx(folder, tmp_path_factory.mktemp("dates-onnx") / "onnx")
    return model, tokenizer, test, OnnxTranslator(exported, threads=1)


def encode(tokenizer, sentences):
    encoded = tokenizer(list(sentences), padding=True, return_tensors="pt", return_token_type_ids=False)
    return encoded["input_ids"], encoded["attention_mask"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        {},  # the model's generation config: beam 4, length penalty 0.6, max_length_over_source 50
        {"num_beams": 1},
        {"num_beams": 4, "length_penalty": 1.0, "max_new_tokens": 8},  # a fixed limit that cuts translations
        {"num_beams": 4, "early_stopping": True, "num_return_sequences": 2},
        {"num_beams": 1, "max_length_over_source": 1},  # the paper's limit, forcing the end token on short sources
        {"num_beams": 4, "min_new_tokens": 14, "max_new_tokens": 14},  # longer than any date: the end token banned
    ],
    ids=[
        "generation-config",
        "greedy",
        "beam4-cut",
        "beam4-early-two-returned",
        "greedy-source-limit",
        "beam4-forced",
    ],
)
def test_onnxruntime_gives_generates_tokens(dates, settings):
    model, tokenizer, test, translator = dates
    for batch in (test["source"][:1], test["source"][1:8], test["source"][8:]):  # 1, 7 and 192 padded sentences
        input_ids, attention_mask = encode(tokenizer, batch)
        with torch.no_grad():
            expected = model.generate(input_ids, attention_mask=attention_mask, **settings)
        got = translator.generate(input_ids, attention_mask, **settings)
        assert torch.equal(got, expected), (settings, len(batch))


@pytest.mark.slow
def test_the_exported_model_translates_dates_as_the_model_does(dates):
    model, tokenizer, test, translator = dates
    got = translator.translate(test["source"])
    input_ids, attention_mask = encode(tokenizer, test["source"])
    with torch.no_grad():
        expected = tokenizer.batch_decode(
            model.generate(input_ids, attention_mask=attention_mask), skip_special_tokens=True
        )
    assert got == expected
    exact = sum(a == b for a, b in zip(got, test["target"], strict=True)) / len(got)
    assert exact >= 0.7, exact  # a model that translates: 86% measured with greedy search (beam 4 here)
    assert len(set(got)) > 0.9 * len(got)


@pytest.mark.slow
def test_the_export_check_fails_on_another_model(dates):
    """verify_export compares onnxruntime with the model on a batch: the exported folder passes against the model,
    and fails against the same model with one weight changed."""
    model, _, _, translator = dates
    assert verify_export(model, translator.model_dir) < 1e-4
    other = AttnTransformerForConditionalGeneration(model.config)
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.model.decoder.layers[1].fc2.bias[0] += 0.5
    with pytest.raises(RuntimeError, match="computes other values than the model"):
        verify_export(other.eval(), translator.model_dir)


@pytest.mark.slow
def test_the_folder_holds_both_graphs_and_what_decoding_needs(dates):
    import onnx

    translator = dates[3]
    names = {path.name for path in translator.model_dir.iterdir()}
    assert {ENCODER_FILE, DECODER_FILE, MANIFEST_FILE, "config.json", "generation_config.json"} <= names
    assert "tokenizer.json" in names
    expected = graph_names(2)
    for graph, side in ((ENCODER_FILE, "encoder"), (DECODER_FILE, "decoder")):
        proto = onnx.load(str(translator.model_dir / graph))
        onnx.checker.check_model(proto)
        assert [i.name for i in proto.graph.input] == expected[f"{side}_inputs"]
        assert [o.name for o in proto.graph.output] == expected[f"{side}_outputs"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"do_sample": True}, r"do_sample=True is not supported"),
        ({"repetition_penalty": 1.2}, r"repetition_penalty=1.2 is not supported"),
        ({"num_beams": 2, "num_return_sequences": 3}, r"`num_return_sequences` \(3\) has to be smaller or equal"),
        ({"beams": 4}, r"unknown settings \['beams'\]"),
    ],
)
def test_settings_the_onnxruntime_search_does_not_reproduce_are_refused(dates, settings, message):
    model, tokenizer, test, translator = dates
    input_ids, attention_mask = encode(tokenizer, test["source"][:2])
    with pytest.raises((ValueError, TypeError), match=message):
        translator.generate(input_ids, attention_mask, **settings)


def small_model() -> AttnTransformerForConditionalGeneration:
    """A random 1+1-layer attn_transformer, d_model 16, 30 tokens (seed 0): quick to export."""
    torch.manual_seed(0)
    config = AttnTransformerConfig(
        vocab_size=30, d_model=16, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=32, max_position_embeddings=16
    )
    return AttnTransformerForConditionalGeneration(config)


@pytest.mark.slow
def test_overwrite_writes_over_a_folder_and_keeps_other_files(tmp_path):
    pytest.importorskip("onnxscript", reason='the ONNX export needs pip install "modeling-attn[onnx]"')
    model = small_model()
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        export_onnx_model(model, tmp_path / "onnx")
    export_onnx_model(model, tmp_path / "onnx", overwrite=True)
    assert (tmp_path / "onnx" / "notes.txt").read_text() == "mine" and (tmp_path / "onnx" / ENCODER_FILE).is_file()


@pytest.mark.slow
def test_a_python_export_leaves_a_folder_that_attn_export_writes_over(tmp_path, capsys):
    """`export_onnx(..., overwrite=True)` over a folder of `attn export --onnx` records what it wrote as the command
    records its own files: the command then exports into the folder again without --force (it refused: "holds files
    that attn export did not write"), and every file there counts as attn's."""
    pytest.importorskip("onnxscript", reason='the ONNX export needs pip install "modeling-attn[onnx]"')
    model = small_model()
    model.save_pretrained(tmp_path / "model")
    command = ["export", str(tmp_path / "model"), "--onnx", str(tmp_path / "onnx")]
    assert attn(command) == 0
    export_onnx(tmp_path / "model", tmp_path / "onnx", overwrite=True)
    assert foreign_files(tmp_path / "onnx") == []
    capsys.readouterr()
    assert attn(command) == 0, capsys.readouterr().err
    assert foreign_files(tmp_path / "onnx") == []


# ----------------------------------------------------------------------------------------------------------------
# Refusals before any export (quick)


def test_attn_rnn_is_refused_in_one_line(tmp_path):
    spread_tiny_rnn().save_pretrained(tmp_path / "rnn")
    with pytest.raises(ValueError, match=r"^\S+: attn_rnn models are not exported to ONNX yet: .*data-dependent") as e:
        export_onnx(tmp_path / "rnn", tmp_path / "onnx")
    assert "\n" not in str(e.value) and not (tmp_path / "onnx").exists()


def test_a_non_empty_output_folder_is_refused_and_left_alone(tmp_path):
    model = AttnTransformerForConditionalGeneration(
        AttnTransformerConfig(vocab_size=30, d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1)
    )
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "encoder_model.onnx").write_text("someone else's")
    with pytest.raises(FileExistsError, match=r"onnx is not empty; pass overwrite=True"):
        export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert [path.name for path in (tmp_path / "onnx").iterdir()] == ["encoder_model.onnx"]
    assert (tmp_path / "onnx" / "encoder_model.onnx").read_text() == "someone else's"


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json, not a saved model folder"):
        export_onnx(tmp_path, tmp_path / "onnx")


def test_graph_names_follow_optimums_seq2seq_exports():
    names = graph_names(2)
    assert names["encoder_outputs"] == [f"present.{i}.encoder.{part}" for i in (0, 1) for part in ("key", "value")]
    assert names["decoder_inputs"][:4] == [
        "input_ids",
        "encoder_attention_mask",
        "past_key_values.0.decoder.key",
        "past_key_values.0.decoder.value",
    ]
    assert names["decoder_outputs"] == [
        "logits",
        *[f"present.{i}.decoder.{p}" for i in (0, 1) for p in ("key", "value")],
    ]


@pytest.mark.slow
def test_attn_export_onnx_command_writes_a_folder_that_translates_as_the_model(dates, tmp_path):
    """`attn export MODEL --onnx DIR` (through modeling_attn.api.outputs: staged, then moved into place)."""
    from modeling_attn.api.onnx_generation import OnnxTranslator
    from modeling_attn.cli.main import main as attn

    model, tokenizer, test, _ = dates
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert attn(["export", str(folder), "--onnx", str(tmp_path / "onnx")]) == 0
    got = OnnxTranslator(tmp_path / "onnx", threads=1).translate(test["source"][:20])
    assert got == dates[3].translate(test["source"][:20])
    # one of the two formats, not both
    assert attn(["export", str(folder), "--onnx", str(tmp_path / "a"), "--ctranslate2", str(tmp_path / "b")]) == 2
