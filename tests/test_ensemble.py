"""Ensembles (modeling_attn/api/ensemble.py) and the paths that take several models: `attn translate`, `attn evaluate`,
`attn serve` and the Python API.

Reference checks: a one-member ensemble, and a two-member ensemble of one model's weights, give the model's own tokens
and scores for greedy search, beam search with length penalty and n-best, and seeded sampling; one beam step of a
mixed Transformer + RNN ensemble equals the weighted combination of the members' log-probabilities computed here by
hand, in both combinations; the commands' output equals the ensemble run in Python. Word alignments: an ensemble of
one model (or of two copies) aligns as the model does from generate()'s own attention, and an ensemble's forced
alignment is the weighted average of its members' alignments.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_translate import CORPUS, SENTENCES, error_line, run_translate, save_tiny_model
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import set_seed

from modeling_attn.api.alignment import align_pairs, aligned_line, translate_aligned, translate_aligned_nbest
from modeling_attn.api.ensemble import AttnEnsemble, EnsembleError, find_checkpoints, load_ensemble
from modeling_attn.api.translation import eager_attention, load_model, translate, translate_nbest
from modeling_attn.cli.evaluate import main as evaluate_main
from modeling_attn.cli.translate import main as translate_main

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
SEARCHES = {
    "greedy": dict(num_beams=1),
    "beam": dict(num_beams=3, length_penalty=0.6, num_return_sequences=2),
    "sampling": dict(do_sample=True, num_beams=1, top_k=20, temperature=1.5, num_return_sequences=2),
}


def transformer(seed: int = 0):
    model = tiny_model(seed=seed, **SPECIAL)
    model.generation_config.update(**SPECIAL)
    return model


def rnn(seed: int = 0):
    model = spread_tiny_rnn(seed=seed, **SPECIAL)
    model.generation_config.update(**SPECIAL)
    return model


def generated(model, search: str, **extra):
    """Tokens and, for beam search, generate()'s own sequence scores of a padded batch."""
    input_ids, attention_mask, _ = padded_batch()
    set_seed(3)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, **SEARCHES[search], **extra)
    tokens = model.generate(**kwargs)
    set_seed(3)
    scored = model.generate(**kwargs, return_dict_in_generate=True, output_scores=True)
    return tokens, scored


@pytest.mark.parametrize("search", list(SEARCHES))
@pytest.mark.parametrize("make", [transformer, rnn])
@pytest.mark.parametrize("copies", [1, 2])
def test_an_ensemble_of_one_model_is_the_model(make, search, copies):
    model = make()
    tokens, scored = generated(model, search)
    for combine in ("log_linear", "linear"):
        ensemble = AttnEnsemble([model] * copies, combine=combine)
        ensemble_tokens, ensemble_scored = generated(ensemble, search)
        assert torch.equal(ensemble_tokens, tokens)  # this package's beam search (sentences leave the batch)
        assert torch.equal(ensemble_scored.sequences, scored.sequences)  # transformers' own search
        if search == "beam":
            torch.testing.assert_close(ensemble_scored.sequences_scores, scored.sequences_scores)
        for step, expected in zip(ensemble_scored.scores, scored.scores, strict=True):
            finite = expected.isfinite()
            torch.testing.assert_close(step.log_softmax(-1)[finite], expected.log_softmax(-1)[finite])


@pytest.mark.parametrize("combine", ["log_linear", "linear"])
def test_one_beam_step_is_the_weighted_combination_by_hand(combine):
    members, weights = [transformer(seed=1), rnn(seed=2)], torch.tensor([0.7, 0.3])
    input_ids, attention_mask, _ = padded_batch()
    start = torch.ones(len(input_ids), 1, dtype=torch.long)
    with torch.no_grad():
        log_probs = torch.stack(
            [
                m(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start)
                .logits[:, -1]
                .log_softmax(-1)
                for m in members
            ]
        )
    if combine == "linear":  # log sum_i w_i p_i
        expected = (log_probs.exp() * weights[:, None, None]).sum(0).log()
    else:  # sum_i w_i log p_i, renormalised
        expected = (log_probs * weights[:, None, None]).sum(0).log_softmax(-1)
    ensemble = AttnEnsemble(members, weights=[7, 3], combine=combine)
    beams = 4
    outputs = ensemble.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=1,
        num_beams=beams,
        num_return_sequences=beams,
        return_dict_in_generate=True,
        output_scores=True,
    )
    best = expected.topk(beams, dim=-1)
    assert outputs.sequences[:, 1].view(-1, beams).tolist() == best.indices.tolist()
    torch.testing.assert_close(outputs.sequences_scores.view(-1, beams), best.values)


def test_a_mixed_transformer_and_rnn_ensemble_generates():
    ensemble = AttnEnsemble([transformer(), rnn()], weights=[2, 1])
    assert ensemble.weights == pytest.approx([2 / 3, 1 / 3])
    for search in SEARCHES:
        tokens, _ = generated(ensemble, search)
        assert tokens.shape[0] == 3 * SEARCHES[search].get("num_return_sequences", 1)
        assert (tokens[:, 0] == SPECIAL["decoder_start_token_id"]).all()


def test_members_with_different_vocabularies_are_refused_naming_both(tmp_path):
    small = tiny_model(vocab_size=50, **SPECIAL)
    small.name_or_path = "small-model"
    large = transformer()
    large.name_or_path = "large-model"
    with pytest.raises(EnsembleError, match="large-model and small-model have different vocabularies"):
        AttnEnsemble([large, small])
    # one size, other tokenizers: the folders are named
    first = save_tiny_model(tmp_path / "first", "attn_transformer")
    second = save_tiny_model(tmp_path / "second", "attn_rnn")
    from modeling_attn.training.tokenizer import train_bpe_tokenizer

    train_bpe_tokenizer([line.upper() for line in CORPUS], vocab_size=100, min_frequency=1).save_pretrained(second)
    with pytest.raises(EnsembleError, match=f"{first} and {second} have different vocabularies"):
        load_ensemble([str(first), str(second)], "cpu")
    with pytest.raises(EnsembleError, match="2 weights for 1 models"):
        AttnEnsemble([large], weights=[1, 2])


# -- the paths a user translates through ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A Transformer and an RNN saved with one tokenizer."""
    return {
        kind: str(save_tiny_model(tmp_path_factory.mktemp(kind), kind)) for kind in ("attn_transformer", "attn_rnn")
    }


def test_the_api_translates_with_an_ensemble(folders):
    model, tokenizer = load_model(folders["attn_transformer"], "cpu")
    twice = AttnEnsemble([model, model])
    assert list(translate(twice, tokenizer, SENTENCES)) == list(translate(model, tokenizer, SENTENCES))
    alone = translate_nbest(model, tokenizer, SENTENCES, num_return_sequences=2)
    together = translate_nbest(twice, tokenizer, SENTENCES, num_return_sequences=2)
    assert [[h.text for h in block] for block in together] == [[h.text for h in block] for block in alone]
    assert [h.score for block in together for h in block] == pytest.approx([h.score for b in alone for h in b])


def test_translate_and_evaluate_take_several_models(folders, tmp_path, capsys, monkeypatch):
    transformer_dir, rnn_dir = folders["attn_transformer"], folders["attn_rnn"]
    flags = ["--no_progress", "--device", "cpu"]
    alone = run_translate(["--model", transformer_dir, *flags, *SENTENCES], capsys, monkeypatch)
    assert (
        run_translate(
            ["--model", transformer_dir, "--model", transformer_dir, *flags, *SENTENCES], capsys, monkeypatch
        )
        == alone
    )
    int8 = ["--quantize", "int8", "--engine", "torch", *flags, *SENTENCES]  # torch's int8: an ensemble's engine
    assert run_translate(["--model", transformer_dir, "--model", transformer_dir, *int8], capsys, monkeypatch) == (
        run_translate(["--model", transformer_dir, *int8], capsys, monkeypatch)
    )
    mixed = ["--model", transformer_dir, "--model", rnn_dir, "--ensemble_weights", "2,1", *flags]
    ensemble, tokenizer = load_ensemble([transformer_dir, rnn_dir], "cpu", weights=[2, 1])
    assert run_translate([*mixed, *SENTENCES], capsys, monkeypatch) == list(translate(ensemble, tokenizer, SENTENCES))

    (tmp_path / "src").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    capsys.readouterr()
    files = ["--sources_file", str(tmp_path / "src"), "--references_file", str(tmp_path / "ref")]
    assert evaluate_main([*mixed, *files]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == {
        "members": [transformer_dir, rnn_dir],
        "weights": [0.666667, 0.333333],
        "combine": "log_linear",
    }
    assert result["sentences"] == len(SENTENCES)


def test_the_last_checkpoints_of_a_run_decode_together(folders, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    for step, kind in ((10, "attn_rnn"), (20, "attn_transformer"), (30, "attn_rnn")):
        shutil.copytree(folders[kind], run / f"checkpoint-{step}")
    assert [path.name for path in find_checkpoints(run)] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    flags = ["--no_progress", "--device", "cpu", *SENTENCES]
    expected = run_translate(
        ["--model", folders["attn_transformer"], "--model", folders["attn_rnn"], *flags], capsys, monkeypatch
    )
    assert run_translate(["--model", str(run), "--last_checkpoints", "2", *flags], capsys, monkeypatch) == expected
    assert error_line(translate_main, ["--model", str(run), "--last_checkpoints", "4", "x"], capsys) == (
        f"attn translate: error: --last_checkpoints 4: {run} has 3 checkpoint-<step> folders; give at most 3"
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--ensemble_weights", "1"], "--ensemble_weights 1: 1 weights for 2 models; give one each"),
        (["--ensemble_weights", "1,x"], "--ensemble_weights 1,x: give numbers separated by commas (2,1)"),
        (["--ensemble_weights", "1,-1"], "--ensemble_weights 1.0 -1.0: each weight must be a positive number"),
        (
            ["--attention-png", "x.png"],
            "--attention_png: pictures show one model's attention, and an ensemble decodes with several; give one "
            "--model (an ensemble's --align averages its members' alignment attention)",
        ),
        (["--last_checkpoints", "2"], "--last_checkpoints 2: give one --model, the training run's output folder"),
    ],
)
def test_ensemble_flag_errors_are_one_line(folders, capsys, extra, expected):
    argv = ["--model", folders["attn_transformer"], "--model", folders["attn_rnn"], *extra, "x"]
    assert error_line(translate_main, argv, capsys) == f"attn translate: error: {expected}"


def test_the_server_takes_several_models(folders):
    from fastapi.testclient import TestClient

    from modeling_attn.api.model_info import describe_model
    from modeling_attn.api.server import create_app
    from modeling_attn.cli.options import load_models, parse_flags
    from modeling_attn.cli.serve import serve_parser

    paths = [folders["attn_transformer"], folders["attn_rnn"]]
    args = parse_flags(serve_parser(), ["--model", paths[0], "--model", paths[1], "--device", "cpu"])
    assert args.model == paths
    ensemble, tokenizer = load_models(args, quantized=False)
    with TestClient(create_app(ensemble, tokenizer, info=describe_model(ensemble, paths[0]))) as client:
        answer = client.post("/translate", json={"text": SENTENCES}).json()
        assert [item["text"] for item in answer["translations"]] == list(translate(ensemble, tokenizer, SENTENCES))
        info = client.get("/model").json()
        assert info["ensemble"] == {"members": paths, "weights": [0.5, 0.5], "combine": "log_linear"}
        assert (
            info["alignment"]["attention"] == "the members' alignment attention averaged with the ensemble's weights"
        )
        assert [member["weight"] for member in info["alignment"]["members"]] == [0.5, 0.5]
        aligned = client.post("/translate", json={"text": SENTENCES, "alignment": "hard"}).json()["translations"]
        with eager_attention(ensemble):
            expected = translate_aligned(ensemble, tokenizer, SENTENCES)
        assert [item["text"] for item in aligned] == [item.text for item in expected]
        assert [[tuple(pair) for pair in item["alignment"]] for item in aligned] == [
            item.alignment.pairs for item in expected
        ]


# -- word alignments ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["attn_transformer", "attn_rnn"])
@pytest.mark.parametrize("copies", [1, 2])
def test_an_ensemble_of_one_model_aligns_as_the_model(folders, kind, copies):
    """The ensemble reads its translation teacher-forced; the model alone aligns from generate()'s attention."""
    model, tokenizer = load_model(folders[kind], "cpu", eager=True)
    ensemble = AttnEnsemble([model] * copies)
    for search in ({"num_beams": 1}, {"num_beams": 2}):
        alone = translate_aligned(model, tokenizer, ["", *SENTENCES], **search)
        together = translate_aligned(ensemble, tokenizer, ["", *SENTENCES], **search)
        assert [item.text for item in together] == [item.text for item in alone]
        for mine, theirs in zip(together, alone, strict=True):
            assert mine.alignment.pairs == theirs.alignment.pairs
            torch.testing.assert_close(mine.alignment.weights, theirs.alignment.weights)
    alone = translate_aligned_nbest(model, tokenizer, SENTENCES, num_return_sequences=2, num_beams=2)
    together = translate_aligned_nbest(ensemble, tokenizer, SENTENCES, num_return_sequences=2, num_beams=2)
    for mine, theirs in zip(sum(together, []), sum(alone, []), strict=True):
        assert (mine.text, mine.alignment.pairs) == (theirs.text, theirs.alignment.pairs)
        assert mine.score == pytest.approx(theirs.score, abs=1e-5)


def test_an_ensembles_alignment_is_the_weighted_average_of_its_members(folders):
    members = [load_model(folders[kind], "cpu", eager=True)[0] for kind in ("attn_transformer", "attn_rnn")]
    tokenizer = load_model(folders["attn_rnn"], "cpu")[1]
    targets = SENTENCES[::-1]
    ensemble = AttnEnsemble(members, weights=[3, 1])
    found = align_pairs(ensemble, tokenizer, SENTENCES, targets)
    alone = [align_pairs(member, tokenizer, SENTENCES, targets) for member in members]
    for mine, first, second in zip(found, *alone, strict=True):
        assert mine.target_words == first.target_words
        torch.testing.assert_close(mine.weights, 0.75 * first.weights + 0.25 * second.weights)


def test_attn_translate_aligns_with_an_ensemble(folders, capsys, monkeypatch):
    paths = [folders["attn_transformer"], folders["attn_rnn"]]
    argv = ["--model", paths[0], "--model", paths[1], "--ensemble_weights", "2,1", "--no_progress", "--device", "cpu"]
    ensemble, tokenizer = load_ensemble(paths, "cpu", weights=[2, 1], eager=True)
    expected = translate_aligned(ensemble, tokenizer, SENTENCES)
    lines = run_translate([*argv, "--align", *SENTENCES], capsys, monkeypatch)
    assert lines == [aligned_line(item).rstrip("\n") for item in expected]
    assert [line.split(" ||| ")[0] for line in lines] == list(translate(ensemble, tokenizer, SENTENCES))
