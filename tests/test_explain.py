"""The attention explainer (modeling_attn/api/explain.py, `attn explain`): its page's numbers are the model's.

Reference checks, all on the data read back from the written page:
- the cross-, encoder and decoder self-attention equal the model's own weights twice over: from `output_attentions`
  of a forward pass over the decoded translation, and from generate()'s (cached, step by step; beam search followed
  back through `beam_indices` by heatmaps.attention_from_generate), for both model types and two models side by side;
- one head, computed: the layer's output read by a hook of the test's own equals the page's output, and the page's
  q.k equal its own q and k; the softmax of its scores equals the model's weights;
- the RNN's scores e_ij give the model's alignment through a softmax, and the dot score is q.h_j of the page's own
  query and annotations;
- the beam tree: every node's score is its parent's plus the model's log-probability of its token (teacher-forced
  forward passes), the returned translation is the best finished node, scored as `translation.sequence_scores`;
- the page is self-contained (no URL, no external resource) and a file that is not an explainer page is never
  replaced unless forced.
Probabilities and weights are rounded to 4 decimals on the page, other numbers to 4 significant digits: the
tolerances below are those roundings.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser

import pytest
import torch
from explain_models import letter_tokenizer, page_data, tiny_rnn, tiny_transformer

from modeling_attn.api.explain import ExplainError, explain, write_explainer
from modeling_attn.api.heatmaps import attention_from_generate
from modeling_attn.api.translation import sequence_scores
from modeling_attn.cli.main import main as attn

SENTENCE = "a c e g i"
WEIGHTS = dict(atol=1e-4, rtol=0)  # 4 decimals
VALUES = dict(atol=1e-6, rtol=1e-3)  # 4 significant digits


def tensor(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def write(models, tmp_path, name="page.html", **kwargs) -> dict:
    path = write_explainer(models, SENTENCE, tmp_path / name, **kwargs)
    return page_data(path)


def translation_ids(entry: dict, tokenizer) -> torch.Tensor:
    """The page's translation as a generate() sequence: the decoder start token, then the target tokens."""
    return torch.tensor([[1, *tokenizer.convert_tokens_to_ids(entry["target_tokens"])]])


def forward_attention(model, tokenizer, sequence: torch.Tensor):
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        return model(**encoded, decoder_input_ids=sequence[:, :-1], output_attentions=True, use_cache=False)


def generate_attention(model, tokenizer, num_beams: int):
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        outputs = model.generate(
            **encoded, num_beams=num_beams, max_new_tokens=6, output_attentions=True, return_dict_in_generate=True
        )
    return outputs, attention_from_generate(outputs, encoded["input_ids"], encoded["attention_mask"], 0, tokenizer)


def check_model_entry(entry: dict, model, tokenizer, num_beams: int) -> None:
    """The page's attention of one model equals its forward pass's and its generate()'s."""
    sequence = translation_ids(entry, tokenizer)
    plain = model.generate(
        **tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False),
        num_beams=num_beams,
        max_new_tokens=6,
    )
    assert sequence.tolist() == plain.tolist()  # the page's translation is generate()'s
    assert entry["translation"] == tokenizer.decode(plain[0], skip_special_tokens=True)
    assert entry["source_tokens"] == SENTENCE.split()
    reference = forward_attention(model, tokenizer, sequence)
    outputs, gathered = generate_attention(model, tokenizer, num_beams)
    assert outputs.sequences.tolist() == plain.tolist()
    assert gathered.target_tokens == entry["target_tokens"]
    cross = torch.stack([layer[0] for layer in reference.cross_attentions]).double()
    if entry["model_type"] == "attn_rnn":
        cross = cross[:, None]  # one "layer", one "head"
    torch.testing.assert_close(tensor(entry["cross"]), cross, **WEIGHTS)
    torch.testing.assert_close(tensor(entry["cross"]), gathered.cross_attention.double(), **WEIGHTS)
    if entry["model_type"] == "attn_transformer":
        for name, steps in (("encoder", reference.encoder_attentions), ("decoder", reference.decoder_attentions)):
            weights = torch.stack([layer[0] for layer in steps]).double()
            torch.testing.assert_close(tensor(entry[name]), weights, **WEIGHTS)
            torch.testing.assert_close(tensor(entry[name]), getattr(gathered, f"{name}_attention").double(), **WEIGHTS)
        steps = len(entry["target_tokens"])
        assert entry["decoder_visible"] == torch.ones(steps, steps).tril().int().tolist()  # causal, as received
    probabilities = torch.softmax(
        model(
            **tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False),
            decoder_input_ids=sequence[:, :-1],
        )
        .logits[0]
        .double(),
        -1,
    )
    chosen = probabilities.gather(1, sequence[0, 1:, None]).squeeze(1)
    torch.testing.assert_close(tensor([step["p"] for step in entry["steps"]]), chosen, **WEIGHTS)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_transformer_page_equals_its_attention(num_beams, tmp_path):
    model, tokenizer = tiny_transformer(), letter_tokenizer()
    data = write((model, tokenizer), tmp_path, num_beams=num_beams, max_new_tokens=6)
    (entry,) = data["models"]
    assert data["sentence"] == SENTENCE and entry["model_type"] == "attn_transformer"
    assert model.config._attn_implementation == "sdpa"  # put back after the eager run
    model.set_attn_implementation("eager")  # the weights to compare with
    check_model_entry(entry, model, tokenizer, num_beams)


@pytest.mark.parametrize(
    "variant, num_beams",
    [
        (dict(decoder_style="bahdanau", attention_score="additive"), 1),
        (dict(decoder_style="luong", attention_score="general", input_feeding=True), 3),
        (dict(decoder_style="luong", attention_score="dot", input_feeding=False), 2),
    ],
)
def test_rnn_page_equals_its_alignment(variant, num_beams, tmp_path):
    model, tokenizer = tiny_rnn(**variant), letter_tokenizer()
    (entry,) = write((model, tokenizer), tmp_path, num_beams=num_beams, max_new_tokens=6)["models"]
    check_model_entry(entry, model, tokenizer, num_beams)
    rnn = entry["rnn"]
    assert (rnn["style"], rnn["score"]) == (variant["decoder_style"], variant["attention_score"])
    energies, alignment = tensor(rnn["energies"]), tensor(entry["cross"][0][0])
    torch.testing.assert_close(torch.softmax(energies, -1), alignment, atol=1e-3, rtol=0)  # alpha = softmax(e)
    annotations, context = tensor(rnn["annotations"]), tensor(rnn["context"])
    torch.testing.assert_close(context, alignment @ annotations, atol=1e-3, rtol=1e-3)  # c_i = sum_j alpha_ij h_j
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        model_annotations = model.get_encoder()(**encoded).last_hidden_state[0].double()
    torch.testing.assert_close(annotations, model_annotations, **VALUES)
    if variant["attention_score"] == "dot":  # Luong's dot score: e_ij = h_i . h_j of the page's own vectors
        torch.testing.assert_close(energies, tensor(rnn["query"]) @ annotations.T, atol=1e-3, rtol=2e-3)
    assert rnn["check"]["alignment"] < 1e-6 and rnn["check"]["context"] < 1e-5


def test_two_models_side_by_side(tmp_path):
    transformer, rnn, tokenizer = tiny_transformer(seed=3), tiny_rnn(seed=4), letter_tokenizer()
    data = write([(transformer, tokenizer), (rnn, tokenizer)], tmp_path, num_beams=2, max_new_tokens=6)
    assert [entry["model_type"] for entry in data["models"]] == ["attn_transformer", "attn_rnn"]
    transformer.set_attn_implementation("eager")
    check_model_entry(data["models"][0], transformer, tokenizer, 2)
    check_model_entry(data["models"][1], rnn, tokenizer, 2)


@pytest.mark.parametrize("kind, layer", [("cross", None), ("encoder", 0), ("decoder", 1)])
def test_one_head_computed_equals_the_layers_output(kind, layer, tmp_path):
    model, tokenizer = tiny_transformer(seed=1, attn_implementation="eager"), letter_tokenizer()
    (entry,) = write((model, tokenizer), tmp_path, walkthrough=(kind, layer), num_beams=1, max_new_tokens=6)["models"]
    walk = entry["walkthrough"]
    layer = 1 if layer is None else layer  # the default: the last of the 2 layers
    assert (walk["kind"], walk["layer"], walk["num_heads"], walk["head_dim"]) == (kind, layer, 4, 4)
    stack = model.model.encoder if kind == "encoder" else model.model.decoder
    module = stack.layers[layer].encoder_attn if kind == "cross" else stack.layers[layer].self_attn
    seen = []
    handle = module.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        reference = forward_attention(model, tokenizer, translation_ids(entry, tokenizer))
    finally:
        handle.remove()
    ((output, weights),) = seen
    torch.testing.assert_close(tensor(walk["output"]), output[0].double(), atol=1e-5, rtol=1e-3)
    heads = tensor(walk["heads"])  # (H, T, D): merged and projected by the layer's own W^O
    merged = heads.transpose(0, 1).reshape(heads.shape[1], -1)
    with torch.no_grad():
        projected = module.out_proj(merged.float()).double()
    torch.testing.assert_close(projected, output[0].double(), atol=1e-3, rtol=1e-2)
    q, k = tensor(walk["q"]), tensor(walk["k"])
    torch.testing.assert_close(tensor(walk["dots"]), q @ k.transpose(-1, -2), atol=1e-3, rtol=5e-3)
    visible = tensor(walk["visible"]).bool()
    scores = (tensor(walk["dots"]) * walk["scaling"]).masked_fill(~visible, float("-inf"))
    torch.testing.assert_close(torch.softmax(scores, -1), weights[0].double(), atol=1e-3, rtol=0)
    attentions = {
        "cross": reference.cross_attentions,
        "encoder": reference.encoder_attentions,
        "decoder": reference.decoder_attentions,
    }[kind]
    torch.testing.assert_close(weights[0], attentions[layer][0])
    if kind == "decoder":
        assert walk["visible"] == torch.ones_like(visible).tril().int().tolist()
    else:
        assert visible.all()
    assert walk["check"]["weights"] < 1e-6 and walk["check"]["output"] < 1e-5
    assert walk["scaling"] == pytest.approx(walk["head_dim"] ** -0.5)


def test_beam_tree_is_the_search_generate_ran(tmp_path):
    model, tokenizer = tiny_transformer(seed=2, attn_implementation="eager"), letter_tokenizer()
    model.generation_config.update(num_beams=3, length_penalty=0.6, max_new_tokens=7)
    (entry,) = write((model, tokenizer), tmp_path)["models"]
    search, nodes = entry["search"], entry["search"]["nodes"]
    assert (search["method"], search["num_beams"], search["candidates"], search["length_penalty"]) == (
        "beam",
        3,
        6,
        0.6,
    )
    assert "beam_search_observer" not in model.__dict__  # the recorder is gone
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    paths, next_token = {0: []}, {}  # next_token[parent]: the model's log-probabilities after the parent's tokens
    for index, node in enumerate(nodes[1:], start=1):
        parent = nodes[node["parent"]]
        assert parent["status"] in ("start", "kept") and node["step"] == parent["step"] + 1
        paths[index] = paths[node["parent"]] + [tokenizer.convert_tokens_to_ids(node["token"])]
        if node["parent"] not in next_token:
            with torch.no_grad():
                decoder_input_ids = torch.tensor([[1, *paths[node["parent"]]]])
                logits = model(**encoded, decoder_input_ids=decoder_input_ids).logits[0, -1]
            next_token[node["parent"]] = torch.log_softmax(logits.double(), -1)
        # the score: the parent's plus the model's log-probability of the token
        step_score = float(next_token[node["parent"]][paths[index][-1]])
        assert node["score"] == pytest.approx(parent["score"] + step_score, rel=1e-3, abs=1e-3)
    for step in range(max(node["step"] for node in nodes) + 1):
        statuses = [node["status"] for node in nodes if node["step"] == step]
        assert statuses.count("kept") <= 3 and len(statuses) <= 6
    best = [index for index, node in enumerate(nodes) if node["best"] and node["status"] == "finished"]
    assert len(best) == 1 and nodes[best[0]]["rank"] == 0
    assert tokenizer.convert_ids_to_tokens(paths[best[0]]) == entry["target_tokens"]
    sequence = translation_ids(entry, tokenizer)
    score = sequence_scores(model, encoded["input_ids"], encoded["attention_mask"], sequence, length_penalty=0.6)
    assert nodes[best[0]]["final_score"] == pytest.approx(float(score), rel=1e-3)
    finished = [node["final_score"] for node in nodes if node["status"] == "finished"]
    assert max(finished) == nodes[best[0]]["final_score"]


class Resources(HTMLParser):
    """Every tag, and every attribute that could load something, of a page."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.links: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "action", "poster", "background"):
                self.links.append((tag, name, value or ""))


def test_page_is_self_contained(tmp_path):
    model, tokenizer = tiny_transformer(), letter_tokenizer()
    path = write_explainer((model, tokenizer), "a b </script><!-- c", tmp_path / "page.html", max_new_tokens=4)
    text = path.read_text(encoding="utf-8")
    parser = Resources()
    parser.feed(text)
    assert all(value.startswith("#") for _, name, value in parser.links if name == "href"), parser.links
    assert not [link for link in parser.links if link[1] != "href"], parser.links  # no src, srcset, data...
    assert not {"link", "img", "iframe", "object", "embed", "audio", "video", "base"} & set(parser.tags)
    assert parser.tags.count("script") == 2  # the data and the page's own script, both inline
    # the one URL is the SVG namespace, a name that is never fetched
    assert set(re.findall(r"https?://[^\s\"'`)]+", text)) == {"http://www.w3.org/2000/svg"}
    for pattern in (r"url\(", r"@import", r"\bfetch\(", r"XMLHttpRequest", r"\bimport\(", r"WebSocket"):
        assert not re.search(pattern, text), pattern
    data = page_data(path)  # the sentence cannot end the data's script element early
    assert data["sentence"] == "a b </script><!-- c" and "</script><!--" not in text.split("explain-data")[1][:200]


def test_a_file_it_did_not_write_is_kept_unless_forced(tmp_path):
    model, tokenizer = tiny_transformer(), letter_tokenizer()
    target = tmp_path / "notes.html"
    target.write_text("my notes")
    with pytest.raises(ExplainError, match=r"notes\.html: exists and is not an explainer page; pass force=True"):
        write_explainer((model, tokenizer), SENTENCE, target, max_new_tokens=3)
    assert target.read_text() == "my notes"
    write_explainer((model, tokenizer), SENTENCE, target, force=True, max_new_tokens=3)
    assert page_data(target)["sentence"] == SENTENCE
    write_explainer((model, tokenizer), "b d f", target, max_new_tokens=3)  # its own page: replaced
    assert page_data(target)["sentence"] == "b d f"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.html"]  # no temporary file, no record beside it
    with pytest.raises(ExplainError, match="does not exist"):
        write_explainer((model, tokenizer), SENTENCE, tmp_path / "missing" / "page.html")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    inside = tmp_path / "model" / "page.html"
    with pytest.raises(ExplainError, match=rf"--output {inside} is inside --model {tmp_path / 'model'}: write it "):
        write_explainer(str(tmp_path / "model"), SENTENCE, inside, max_new_tokens=3)
    assert not inside.exists()


def test_bad_input_is_refused_with_its_reason(tmp_path):
    model, tokenizer = tiny_transformer(), letter_tokenizer()
    pair = (model, tokenizer)
    with pytest.raises(ExplainError, match="the sentence is empty"):
        explain(pair, "  ")
    with pytest.raises(ExplainError, match="one model, or two side by side; got 3"):
        explain([pair, pair, pair], SENTENCE)
    with pytest.raises(ExplainError, match=r"one of \['cross', 'encoder', 'decoder'\], got 'self'"):
        explain(pair, SENTENCE, walkthrough=("self", 0))
    with pytest.raises(ExplainError, match=r"layer 3: the decoder attention has layers 1\.\.2"):
        explain(pair, SENTENCE, walkthrough=("decoder", 2))
    with pytest.raises(ExplainError, match="do_sample=True is not supported"):
        explain(pair, SENTENCE, do_sample=True)
    with pytest.raises(ExplainError, match="more than the model's max_position_embeddings=4"):
        explain((tiny_transformer(max_position_embeddings=4), tokenizer), SENTENCE)
    assert model.training is False and model.config._attn_implementation == "sdpa"


def run(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = attn(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, stdout.getvalue(), stderr.getvalue()


def test_attn_explain_writes_the_page_of_two_saved_models(tmp_path):
    tokenizer = letter_tokenizer()
    for name, model in (("transformer", tiny_transformer(seed=5)), ("rnn", tiny_rnn(seed=6))):
        model.generation_config.update(max_new_tokens=5, num_beams=2)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    page = tmp_path / "explain.html"
    argv = [
        "explain",
        "--model",
        str(tmp_path / "transformer"),
        "--model",
        str(tmp_path / "rnn"),
        SENTENCE,
        "--output",
        str(page),
        "--walkthrough",
        "encoder",
        "--walkthrough_layer",
        "1",
    ]
    status, stdout, stderr = run(argv)
    assert status == 0, stderr
    assert stdout.startswith(f"wrote {page} (")
    data = page_data(page)
    assert [entry["name"] for entry in data["models"]] == ["transformer", "rnn"]
    assert (data["models"][0]["walkthrough"]["kind"], data["models"][0]["walkthrough"]["layer"]) == ("encoder", 0)
    assert [entry["search"]["num_beams"] for entry in data["models"]] == [2, 2]
    status, _, stderr = run([*argv, "--num_beams", "1"])  # its own page is replaced
    assert status == 0 and page_data(page)["models"][0]["search"]["method"] == "greedy"
    page.write_text("not mine")
    status, _, stderr = run(argv)
    assert status == 2 and "exists and is not an explainer page; pass force=True (--force)" in stderr
    assert page.read_text() == "not mine"
    assert run([*argv, "--force"])[0] == 0 and json.dumps(page_data(page))
    errors = {
        "--model given 3 times": ["explain", *argv[1:5], *argv[3:5], SENTENCE, "--output", str(page)],
        "give the sentence as one argument (quote it); got 2": [
            "explain",
            *argv[1:3],
            "a",
            "b",
            "--output",
            str(page),
        ],
        "required: --output": ["explain", *argv[1:3], SENTENCE],
        "required: --model": ["explain", SENTENCE, "--output", str(page)],
        "no such model folder": ["explain", "--model", str(tmp_path / "none"), SENTENCE, "--output", str(page)],
        "--walkthrough_layer: must be a positive integer": [*argv, "--walkthrough_layer", "0"],
    }
    for message, arguments in errors.items():
        status, _, stderr = run(arguments)
        assert status == 2 and message in stderr and len(stderr.splitlines()) == 1, (message, stderr)


@pytest.mark.slow
def test_page_of_a_30_token_sentence_on_base_stays_small(tmp_path):
    """Issue 32: at most ~2 MB for a 30-token sentence on the `base` preset (random weights: their attention is
    spread out, so more weights need all 4 decimals than a trained model's would)."""
    from modeling_attn import AttnTransformerForConditionalGeneration
    from modeling_attn.api.presets import load_preset

    torch.manual_seed(0)
    model = AttnTransformerForConditionalGeneration(load_preset("base")).eval()
    sentence = " ".join(("abcdefghijklm" * 3)[:29])  # 29 tokens, then the 30th: none is added by this tokenizer
    page = write_explainer(
        (model, letter_tokenizer()),
        sentence + " a",
        tmp_path / "base.html",
        num_beams=4,
        min_new_tokens=30,
        max_new_tokens=30,
    )
    entry = page_data(page)["models"][0]
    assert len(entry["source_tokens"]) == 30 and len(entry["target_tokens"]) == 30
    assert page.stat().st_size <= 2_000_000, page.stat().st_size
