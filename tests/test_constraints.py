"""Lexically constrained decoding (modeling_attn/constraints.py, api/constraints.py, `attn translate --constraints`).

The phrase state machine against hand-worked examples and a brute-force count of non-overlapping occurrences; the
beam allocation by hand, and the search step's shortcut for sentences that meet theirs; the search: every constraint
in every translation that has room for it (random sentences and phrases, both model types and an ensemble),
constraint-free calls token-for-token today's, a constraint that does not fit reported; glossary matching; bad input
in one line; on the dates task, a constrained year that fixes a wrong translation (slow).
"""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch
from tasks import one_thread
from test_translate import error_line, save_tiny_model
from tiny import spread_tiny_rnn, tiny_model

from modeling_attn.api.constraints import ConstraintWarning, Glossary, phrase_ids, read_constraints
from modeling_attn.api.ensemble import AttnEnsemble
from modeling_attn.api.translation import load_model, translate_batch, translate_nbest
from modeling_attn.beam_search import allocated
from modeling_attn.cli.translate import main as translate_main
from modeling_attn.constraints import SentenceConstraints, allocate

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


# -- the state machine ----------------------------------------------------------------------------------------


def test_a_phrase_is_found_after_a_false_start():
    constraints = SentenceConstraints([[1, 2, 3]])
    assert constraints.missing([1, 2, 1, 2, 3]) == []  # 1 2 | 1 2 3: the second 1 restarts the match
    assert constraints.missing([1, 2, 4, 3]) == [(1, 2, 3)]


def test_repeated_tokens_fall_back_to_the_longest_matched_prefix():
    constraints = SentenceConstraints([[4, 4, 5]])
    assert constraints.missing([4, 4, 4, 5]) == []  # KMP: after 4 4 4 the match is still 4 4
    state = constraints.run([4, 4, 4])
    assert state == ((2, 0),) and constraints.next_tokens(state) == {5} and constraints.bank(state) == 2


def test_overlapping_phrases_are_both_found():
    constraints = SentenceConstraints([[1, 2], [2, 3]])
    assert constraints.missing([1, 2, 3]) == []


def test_a_phrase_that_is_a_prefix_of_another():
    constraints = SentenceConstraints([[1, 2], [1, 2, 3]])
    assert constraints.missing([1, 2, 3]) == []
    assert constraints.missing([1, 2]) == [(1, 2, 3)]
    state = constraints.run([1, 2])
    assert constraints.bank(state) == 2 + 2 and constraints.next_tokens(state) == {3}


def test_a_phrase_given_twice_must_appear_twice_without_overlap():
    constraints = SentenceConstraints([[7, 7], [7, 7]])
    assert constraints.missing([7, 7, 7]) == [(7, 7)]  # 7 7 7 holds one 7 7 without overlap
    assert constraints.missing([7, 7, 8, 7, 7]) == []
    assert constraints.bank(constraints.run([7, 7, 7])) == 3


def test_banks_count_constraint_tokens_and_stop_at_the_total():
    constraints = SentenceConstraints([[1, 2, 3], [4]])
    assert [constraints.bank(constraints.run(tokens)) for tokens in ([], [1], [1, 2], [1, 2, 9], [1, 2, 3])] == [
        0,
        1,
        2,
        0,
        3,
    ]
    done = constraints.run([4, 1, 2, 3, 1])  # a met phrase no longer moves
    assert constraints.met(done) and constraints.bank(done) == constraints.tokens == 4
    assert constraints.next_tokens(done) == set()


def non_overlapping(tokens: list[int], phrase: tuple[int, ...]) -> int:
    """The most non-overlapping occurrences of `phrase` in `tokens`, by a left-to-right scan."""
    count, index = 0, 0
    while index + len(phrase) <= len(tokens):
        if tuple(tokens[index : index + len(phrase)]) == phrase:
            count, index = count + 1, index + len(phrase)
        else:
            index += 1
    return count


def test_missing_phrases_equal_a_brute_force_count():
    generator = random.Random(0)
    for _ in range(2000):
        phrases = [
            tuple(generator.choices(range(3), k=generator.randint(1, 3))) for _ in range(generator.randint(1, 3))
        ]
        tokens = generator.choices(range(3), k=generator.randint(0, 12))
        required = {phrase: phrases.count(phrase) for phrase in phrases}
        expected = sorted(
            phrase
            for phrase, count in required.items()
            for _ in range(count - min(count, non_overlapping(tokens, phrase)))
        )
        assert sorted(SentenceConstraints(phrases).missing(tokens)) == expected, (phrases, tokens)


def test_allocation_takes_the_banks_round_robin_furthest_first():
    constraints = SentenceConstraints([[5, 6]])
    states = [constraints.start, constraints.run([5])]  # beam 1 has started the phrase
    candidates = [(-1.0, 0, 9), (-1.5, 0, 8), (-2.0, 1, 9), (-3.0, 1, 6), (-4.0, 0, 5), (-1.0, 0, 9)]
    chosen = allocate(candidates, states, constraints, 4)
    # banks: (0, 9) 0, (0, 8) 0, (1, 9) 0, (1, 6) 2 (met), (0, 5) 1; the duplicate (0, 9) is dropped
    assert [(beam, token) for _, beam, token, _ in chosen] == [(1, 6), (0, 5), (0, 9), (0, 8)]
    assert constraints.met(chosen[0][3]) and not constraints.met(chosen[1][3])


def test_a_sentence_whose_beams_all_meet_gets_what_allocation_gives_it():
    """`beam_search.allocated` skips the state machine for such a sentence: the same candidates, in the same order,
    as `allocate` on the top ones and each beam's best (ties everywhere: scores in whole numbers)."""
    generator = torch.Generator().manual_seed(0)
    constraints = SentenceConstraints([[5, 6], [7]])
    met = constraints.run([7, 5, 6, 1])
    for trial in range(100):
        totals = torch.randint(-5, 0, (1, 3, 9), generator=generator).float()
        live = [[True, trial % 3 != 1, trial % 5 != 2]]
        chosen = allocated(totals, live, [[met] * 3], [constraints], 6)
        scores, picks = torch.topk(totals.view(1, -1), k=6)
        pairs = zip(scores[0].tolist(), picks[0].tolist(), strict=True)
        candidates = [(score, pick // 9, pick % 9) for score, pick in pairs]
        best_scores, best_tokens = totals.max(dim=-1)
        candidates += [(best_scores[0, b].item(), b, best_tokens[0, b].item()) for b in range(3) if live[0][b]]
        assert chosen == [allocate(candidates, [met] * 3, constraints, 6)]


# -- the search ---------------------------------------------------------------------------------------------


def models():
    transformer = tiny_model("sdpa", **SPECIAL)
    rnn = spread_tiny_rnn(**SPECIAL)
    torch.manual_seed(1)
    ensemble = AttnEnsemble(torch.nn.ModuleList([transformer, tiny_model("sdpa", seed=1, **SPECIAL)]))
    return {"attn_transformer": transformer, "attn_rnn": rnn, "ensemble": ensemble.eval()}


def random_batch(generator: random.Random, size: int):
    lengths = [generator.randint(2, 8) for _ in range(size)]
    longest = max(lengths)
    input_ids = torch.tensor([[generator.randint(3, 98) for _ in range(n)] + [0] * (longest - n) for n in lengths])
    mask = torch.tensor([[1] * n + [0] * (longest - n) for n in lengths])
    phrases = [
        [[generator.randint(3, 98) for _ in range(generator.randint(1, 3))] for _ in range(generator.randint(0, 2))]
        for _ in range(size)
    ]
    return input_ids, mask, phrases


@pytest.mark.parametrize("name", ["attn_transformer", "attn_rnn", "ensemble"])
def test_every_constraint_is_in_every_best_translation_that_has_room(name):
    """The best hypothesis of each sentence has every phrase; an n-best list has those with every phrase first (a
    beam of 4 shared across the banks holds few complete ones: the others end at the limit, reported unmet)."""
    model = models()[name]
    generator = random.Random(name)
    for _ in range(6):
        input_ids, mask, phrases = random_batch(generator, 4)
        settings = dict(input_ids=input_ids, attention_mask=mask, num_beams=4, max_new_tokens=16)
        for returned in (1, 3):
            sequences = model.generate(**settings, num_return_sequences=returned, force_words_ids_per_sentence=phrases)
            for sentence, block in enumerate(sequences.view(4, returned, -1).tolist()):
                met = [not SentenceConstraints(phrases[sentence]).missing(tokens[1:]) for tokens in block]
                assert met[0] and met == sorted(met, reverse=True), (phrases[sentence], block)


def test_closing_a_settled_sentence_keeps_its_translation():
    """With one translation returned, a sentence closes once its best finished hypothesis meets its constraints and
    no running beam can beat it at any length (`beam_search.settled_length`): its translation is the first of the
    n-best list of the search that runs on, in fewer steps. The phrases are the first tokens of each sentence's
    unconstrained translation, on an RNN with peaked distributions that ends translations early."""
    model = models()["attn_rnn"]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4)
        model.get_output_embeddings().weight[2] += 2.0
    open_rows = []
    model.beam_search_observer = lambda settings, cur_len, state, *_: open_rows.append(len(state.sentences))
    generator = random.Random(5)
    closed_early = 0
    try:
        for trial in range(6):
            input_ids, mask, _ = random_batch(generator, 4)
            settings = dict(input_ids=input_ids, attention_mask=mask, num_beams=4, max_new_tokens=16)
            settings["length_penalty"] = (1.0, 0.0, -0.5)[trial % 3]
            phrases = [[row[1:3]] for row in model.generate(**settings).tolist()]
            open_rows.clear()
            best = model.generate(**settings, force_words_ids_per_sentence=phrases)
            sentence_steps = sum(open_rows)
            open_rows.clear()
            nbest = model.generate(**settings, force_words_ids_per_sentence=phrases, num_return_sequences=4)[::4]
            assert sentence_steps <= sum(open_rows), trial
            closed_early += sentence_steps < sum(open_rows)
            for one, first in zip(best.tolist(), nbest.tolist(), strict=True):
                assert [t for t in one if t != 0] == [t for t in first if t != 0], (phrases, one, first)
    finally:
        model.beam_search_observer = None
    assert closed_early >= 3


@pytest.mark.parametrize("name", ["attn_transformer", "attn_rnn", "ensemble"])
def test_sentences_without_constraints_translate_as_without_the_argument(name):
    model = models()[name]
    generator = random.Random(1)
    input_ids, mask, _ = random_batch(generator, 4)
    settings = dict(input_ids=input_ids, attention_mask=mask, num_beams=4, max_new_tokens=10)
    plain = model.generate(**settings)
    assert torch.equal(model.generate(**settings, force_words_ids_per_sentence=[[], [], [], []]), plain)
    mixed = model.generate(**settings, force_words_ids_per_sentence=[[[5, 6]], [], [[7]], []])
    for row in (1, 3):  # the sentences without constraints in a constrained batch
        generated = [token for token in mixed[row].tolist() if token != 0]
        assert generated == [token for token in plain[row].tolist() if token != 0]


def test_force_words_ids_applies_to_every_sentence():
    model = models()["attn_transformer"]
    input_ids, mask, _ = random_batch(random.Random(2), 3)
    sequences = model.generate(input_ids=input_ids, attention_mask=mask, num_beams=3, force_words_ids=[[11, 12], [13]])
    for tokens in sequences.tolist():
        assert SentenceConstraints([[11, 12], [13]]).missing(tokens) == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(force_words_ids=[[[1, 2], [3]]]), "disjunctive constraints"),
        (dict(force_words_ids=[[5]], num_beams=1), "needs beam search: num_beams of 2 or more"),
        (dict(force_words_ids=[[5]], do_sample=True), "needs beam search"),
        (dict(force_words_ids=[[]]), "an empty constraint phrase"),
        (dict(force_words_ids_per_sentence=[[[5]]]), "has 1 entries for 3 sentences"),
    ],
)
def test_generate_refuses_what_it_cannot_constrain(settings, message):
    model = models()["attn_transformer"]
    input_ids, mask, _ = random_batch(random.Random(3), 3)
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=input_ids, attention_mask=mask, **{"num_beams": 2, **settings})


def test_a_constraint_that_does_not_fit_ends_at_the_limit_unmet():
    model = models()["attn_transformer"]
    input_ids, mask, _ = random_batch(random.Random(4), 2)
    phrases = [[[10, 11, 12, 13, 14, 15]], [[20]]]  # six tokens in a limit of four
    sequences = model.generate(
        input_ids=input_ids, attention_mask=mask, num_beams=4, max_new_tokens=4, force_words_ids_per_sentence=phrases
    )
    assert sequences.shape[1] == 5
    assert SentenceConstraints(phrases[0]).missing(sequences[0, 1:].tolist()) == [(10, 11, 12, 13, 14, 15)]
    assert SentenceConstraints(phrases[1]).missing(sequences[1, 1:].tolist()) == []


# -- text: tokenizer, the Python API and attn translate ---------------------------------------------------------


@pytest.fixture(scope="module", params=["attn_transformer", "attn_rnn"])
def model_dir(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


PHRASES = ["cat", "Park", "1987", "the mat", "Hund", "July"]
SENTENCES = ["the cat sat", "a dog ran in the park on Tuesday", "1987", "der Hund", "the 4th of March 1987", "park"]


def test_a_phrase_tokenizes_alone_as_inside_a_sentence(model_dir):
    _, tokenizer = load_model(str(model_dir), "cpu")
    for phrase in PHRASES:
        inside = tokenizer(text_target=f"a {phrase} b", add_special_tokens=False)["input_ids"]
        ids = phrase_ids(tokenizer, phrase)
        assert any(inside[i : i + len(ids)] == ids for i in range(len(inside))), phrase


def test_translations_contain_their_phrases_as_text(model_dir):
    model, tokenizer = load_model(str(model_dir), "cpu")
    generator = random.Random(5)
    constraints = [generator.sample(PHRASES, generator.randint(0, 2)) for _ in SENTENCES]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConstraintWarning)
        translations = translate_batch(model, tokenizer, SENTENCES, constraints=constraints, max_new_tokens=24)[0]
        nbest = translate_nbest(model, tokenizer, SENTENCES, 2, constraints=constraints, max_new_tokens=24)
    for translation, block, phrases in zip(translations, nbest, constraints, strict=True):
        assert all(phrase in translation and phrase in block[0].text for phrase in phrases)
        met = [all(phrase in hypothesis.text for phrase in phrases) for hypothesis in block]
        assert met == sorted(met, reverse=True)  # those with every phrase first


def test_no_constraints_give_today_s_translations(model_dir):
    model, tokenizer = load_model(str(model_dir), "cpu")
    plain = translate_batch(model, tokenizer, SENTENCES)[0]
    assert translate_batch(model, tokenizer, SENTENCES, constraints=[[] for _ in SENTENCES])[0] == plain


def test_an_unmet_constraint_is_a_warning_naming_the_sentence(model_dir):
    model, tokenizer = load_model(str(model_dir), "cpu")
    with pytest.warns(
        ConstraintWarning, match=r"sentence 1 of the batch: the translation lacks the constraint 'the mat"
    ):
        translate_batch(
            model, tokenizer, ["1987", "the cat"], constraints=[[], ["the mat the mat the mat"]], max_new_tokens=3
        )


def run(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = translate_main(argv)
    captured = capsys.readouterr()
    err = [line for line in captured.err.replace("\r", "\n").splitlines() if line.startswith("attn translate")]
    return code, captured.out, err


def test_attn_translate_constraints_and_glossary(model_dir, tmp_path, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat\n1987\nder Hund\n")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("Park\tthe mat\n\n\n")
    glossary = tmp_path / "glossary.tsv"
    glossary.write_text("# a comment\nHund\tdog\nhund\tcat\n")
    argv = ["--model", str(model_dir), "--input", str(inputs), "--max_new_tokens", "16", "--no-progress"]
    code, out, err = run([*argv, "--constraints", str(constraints), "--glossary", str(glossary)], capsys)
    lines = out.splitlines()
    assert code == 0 and err == [] and len(lines) == 3
    assert "Park" in lines[0] and "the mat" in lines[0] and "dog" in lines[2] and "cat" not in lines[2]
    code, out, err = run([*argv, "--constraints", str(constraints), "--num_return_sequences", "2"], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 6 and all(line.endswith(" ||| met") for line in lines[::2])
    # one that does not fit: a line on stderr naming the input line, "unmet" in the n-best list
    constraints.write_text("\nthe mat the mat the mat the mat\n\n")
    short = [*argv[:-3], "--max_new_tokens", "3", "--no-progress", "--constraints", str(constraints)]
    code, out, err = run(short, capsys)
    assert code == 0 and len(out.splitlines()) == 3
    assert err == [
        f"attn translate: {inputs}:2: the translation lacks the constraint 'the mat the mat the mat the mat' (it did "
        "not fit within the length limit)"
    ]
    code, out, err = run([*short, "--num_return_sequences", "2"], capsys)
    assert [line.rsplit(" ||| ", 1)[1] for line in out.splitlines()[2:4]] == [
        "unmet: the mat the mat the mat the mat"
    ] * 2


def test_glossary_matches_case_sensitive_whole_words():
    glossary = Glossary((("Hund", "dog"), ("New York", "NYC"), ("C++", "cpp")))
    assert glossary.targets("der Hund und der Hund") == ["dog", "dog"]
    assert glossary.targets("der hund, Hunde, Hundehütte, XHund") == []
    assert glossary.targets("Hund.") == ["dog"] and glossary.targets("(Hund)") == ["dog"]
    assert glossary.targets("New York") == ["NYC"] and glossary.targets("New  York, NewYork") == []
    assert glossary.targets("C++ code, C++11") == ["cpp"]  # "C++1": the next character is a digit


def test_constraint_file_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b\tc\n\n d \n")
    assert read_constraints(str(path), 3) == [["a b", "c"], [], ["d"]]


@pytest.mark.parametrize(
    ("files", "extra", "expected"),
    [
        (
            {"c.txt": "a\nb\n"},
            ["--constraints", "{tmp}/c.txt"],
            "--constraints {tmp}/c.txt: 2 lines for 3 input sentences",
        ),
        ({"c.txt": "a\n\tb\n\n"}, ["--constraints", "{tmp}/c.txt"], "{tmp}/c.txt:2: constraint 1 is empty (a doubled"),
        ({"c.txt": "a\tb\t\tc\n\n\n"}, ["--constraints", "{tmp}/c.txt"], "{tmp}/c.txt:1: constraint 3 is empty"),
        ({"g.tsv": "Hund\tdog\nKatze cat\n"}, ["--glossary", "{tmp}/g.tsv"], "--glossary {tmp}/g.tsv:2: no tab"),
        ({"c.txt": "a\n\n\n"}, ["--constraints", "{tmp}/c.txt", "--num_beams", "1"], "give --num_beams 2 or more"),
        ({"c.txt": "a\n\n\n"}, ["--constraints", "{tmp}/c.txt", "--do_sample"], "drop --do_sample"),
    ],
)
def test_bad_constraint_input_is_one_line(model_dir, tmp_path, capsys, files, extra, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "in.txt").write_text("the cat\n1987\npark\n")
    argv = ["--model", str(model_dir), "--input", str(tmp_path / "in.txt"), *extra]
    line = error_line(translate_main, [argument.replace("{tmp}", str(tmp_path)) for argument in argv], capsys)
    assert line.startswith("attn translate: error: ") and expected.replace("{tmp}", str(tmp_path)) in line


def test_a_short_constraints_file_on_stdin_is_one_line(model_dir, tmp_path, capsys, monkeypatch):
    import io

    (tmp_path / "c.txt").write_text("a\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"the cat\n1987\n")))
    argv = ["--model", str(model_dir), "--no-progress", "--constraints", str(tmp_path / "c.txt")]
    assert "1 lines for more than 1 input sentences" in error_line(translate_main, argv, capsys)


@pytest.mark.parametrize("engine", ["ctranslate2", "onnxruntime"])
def test_a_named_export_engine_refuses_constraints(tmp_path, capsys, engine):
    pytest.importorskip(engine, reason=f"the {engine} engine is not installed")
    folder = save_tiny_model(tmp_path / "model", "attn_transformer")
    (tmp_path / "c.txt").write_text("cat\n")
    argv = ["--model", str(folder), "--engine", engine, "--constraints", str(tmp_path / "c.txt"), "the cat"]
    assert error_line(translate_main, argv, capsys) == (
        f"attn translate: error: --engine {engine}: {engine} has no constraints (--constraints/--glossary); use "
        "--engine torch (or auto)"
    )


# -- attn serve ---------------------------------------------------------------------------------------------------


def test_the_server_takes_constraints_per_sentence_and_says_which_are_unmet(model_dir):
    pytest.importorskip("fastapi", reason='attn serve needs pip install "modeling-attn[serve]"')
    from fastapi.testclient import TestClient

    from modeling_attn.api.server import create_app

    model, tokenizer = load_model(str(model_dir), "cpu")
    sentences = ["the cat sat", "1987", "der Hund"]
    constraints = [["Park"], [], ["the mat the mat the mat the mat"]]
    with TestClient(create_app(model, tokenizer)) as client:
        body = {"text": sentences, "constraints": constraints, "max_new_tokens": 4, "num_return_sequences": 2}
        answer = client.post("/translate", json=body).json()["translations"]
        plain = client.post("/translate", json={"text": sentences, "max_new_tokens": 4}).json()["translations"]
        refused = client.post("/translate", json={"text": ["a", "b"], "constraints": [["x"]]})
        empty = client.post("/translate", json={"text": ["a"], "constraints": [["x", " "]]})
        one_beam = client.post("/translate", json={"text": ["a"], "constraints": [["x"]], "num_beams": 1})
    expected = translate_nbest(model, tokenizer, sentences, 2, constraints=constraints, max_new_tokens=4)
    assert [[found["text"] for found in item["nbest"]] for item in answer] == [
        [hypothesis.text for hypothesis in block] for block in expected
    ]
    assert answer[0]["unmet_constraints"] == [] and "Park" in answer[0]["text"]
    assert answer[1]["text"] == plain[1]["text"] and answer[1]["unmet_constraints"] == []
    assert answer[2]["unmet_constraints"] == ["the mat the mat the mat the mat"]
    assert all("unmet_constraints" not in item for item in plain)
    assert refused.status_code == 422 and "constraints: 1 entries for 2 sentences in text" in refused.json()["error"]
    assert empty.status_code == 422 and "constraints[0][1]: an empty phrase" in empty.json()["error"]
    assert one_beam.status_code == 422 and one_beam.json()["error"].startswith("constraints: a beam search")


# -- the dates task ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_constrained_year_fixes_a_wrong_date():
    """The 0.2M-parameter dates model of tests/test_export_onnx.py (trained here, ~16 s) reads 'APRIL 29 1993' as
    1939-04-29 and '6 July 1978' as 1987-07-06; with the year as a constraint it gets both right."""
    from test_export_onnx import train_dates_model

    model, tokenizer, _ = train_dates_model()
    sentences = ["APRIL 29 1993", "6 July 1978"]
    assert translate_batch(model, tokenizer, sentences)[0] == ["1939-04-29", "1987-07-06"]
    fixed = translate_batch(model, tokenizer, sentences, constraints=[["1993"], ["1978"]])[0]
    assert fixed == ["1993-04-29", "1978-07-06"]


def test_attn_evaluate_constraints_and_glossary_count_what_was_met(model_dir, tmp_path, capsys):
    from modeling_attn.cli.evaluate import main as evaluate_main

    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text("the cat sat\n1987\nder Hund\n")
    references.write_text("the cat sat\n1987\nthe dog\n")
    constraints, glossary = tmp_path / "constraints.txt", tmp_path / "glossary.tsv"
    constraints.write_text("Park\n\n\n")
    glossary.write_text("Hund\tdog\n")
    hypotheses, output = tmp_path / "hyp.txt", tmp_path / "out.json"
    argv = ["--model", str(model_dir), "--sources_file", str(sources), "--references_file", str(references)]
    argv += ["--max_new_tokens", "16", "--no_progress", "--hypotheses", str(hypotheses), "--output", str(output)]
    assert evaluate_main([*argv, "--constraints", str(constraints), "--glossary", str(glossary)]) == 0
    lines = hypotheses.read_text().splitlines()
    assert "Park" in lines[0] and "dog" in lines[2]
    assert json.loads(output.read_text())["constraints_met"] == {"sentences_with_constraints": 2, "met": 2}
    constraints.write_text("Park\n")
    capsys.readouterr()
    assert evaluate_main([*argv, "--constraints", str(constraints), "--overwrite"]) == 2
    assert f"--constraints {constraints}" in capsys.readouterr().err
