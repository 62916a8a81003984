"""The explainer page in a real browser (headless Chromium, tests/browser.py): it loads from file:// with no console
error and no network request, and what it shows are the models' own numbers.

The page is written for two models trained on the reverse task (tests/tasks.py): a Transformer
(tests/test_learning.py's reverser) and Bahdanau's GRU model (`tasks.train_rnn_reverser`), so their alignments are the
anti-diagonal. Choosing another layer, head, step, query or model changes the weights the page shows, and the weights
read back from the DOM equal the models' attention tensors (`output_attentions` of a forward pass over the
translation). Hovering or focusing a target token lights its source tokens by weight; the controls work from the
keyboard.

Screenshots of every view go to $ATTN_EXPLAIN_SCREENSHOTS (a folder; default: the test's temporary folder).
docs/explain-*.png are made by `python tests/explain_screenshots.py` from models trained on the dates task.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from browser import chromium, console_errors, missing, requests, screenshot_views
from explain_models import letter_tokenizer
from tasks import one_thread, train_rnn_reverser

from modeling_attn.api.explain import write_explainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing() is not None, reason=f"no headless Chromium: {missing()}"),
]

SENTENCE = "a c e g i k m"
WEIGHTS = dict(atol=1e-4, rtol=0)  # the page's weights have 4 decimals


@pytest.fixture(scope="module")
def models():
    """The two reversers (about a minute of training on 2 CPU cores), each with its reference attention."""
    from test_learning import train_reverser

    with one_thread():
        transformer = train_reverser()
    transformer.set_attn_implementation("eager")
    rnn = train_rnn_reverser(rnn_type="gru", decoder_style="bahdanau", attention_score="additive")
    for model in (transformer, rnn):
        model.generation_config.update(num_beams=3, max_new_tokens=10)
    return transformer, rnn


@pytest.fixture(scope="module")
def page(models, tmp_path_factory) -> Path:
    tokenizer = letter_tokenizer()
    path = tmp_path_factory.mktemp("explain") / "explain.html"
    return write_explainer([(model, tokenizer) for model in models], SENTENCE, path)


@pytest.fixture(scope="module")
def references(models):
    """Per model: its forward pass over its own translation, with attention weights."""
    tokenizer = letter_tokenizer()
    encoded = tokenizer([SENTENCE], return_tensors="pt", return_token_type_ids=False)
    found = []
    for model in models:
        with torch.no_grad():
            sequence = model.generate(**encoded)
            found.append(model(**encoded, decoder_input_ids=sequence[:, :-1], output_attentions=True))
    return found


@pytest.fixture(scope="module")
def browser(page):
    with chromium() as driver:
        driver.get(page.as_uri())
        yield driver


def select(driver, element_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_value(value)


def heatmap(driver, element_id: str) -> torch.Tensor:
    """The weights a heatmap shows, from its cells' data-w (masked cells read 0)."""
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#' + arguments[0] + ' .cell')]"
        ".map(c => [Number(c.dataset.row), Number(c.dataset.col), Number(c.dataset.w)])",
        element_id,
    )
    rows, cols = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    matrix = torch.zeros(rows, cols, dtype=torch.float64)
    for row, col, weight in cells:
        matrix[row, col] = weight
    return matrix


def column(driver, selector: str) -> torch.Tensor:
    values = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(c => Number(c.dataset.w ?? c.dataset.v))", selector
    )
    return torch.tensor(values, dtype=torch.float64)


def test_page_loads_offline_with_no_error(browser, page):
    assert console_errors(browser) == []
    assert requests(browser) == [page.as_uri()]  # the page itself, nothing else
    assert browser.find_element("id", "model-select").is_displayed()
    assert "m k i g e c a" in browser.find_element("id", "summary").text  # the reversal


def test_cross_attention_per_layer_head_and_step_is_the_models(browser, references):
    cross = torch.stack([layer[0] for layer in references[0].cross_attentions]).double()  # (L, H, T, S)
    select(browser, "model-select", "0")
    shown = {}
    for layer, head in (("mean", "mean"), ("0", "mean"), ("1", "2"), ("0", "0")):
        select(browser, "cross-layer", layer)
        select(browser, "cross-head", head)
        layers = cross if layer == "mean" else cross[int(layer)][None]
        expected = layers.mean(dim=(0, 1)) if head == "mean" else layers[:, int(head)].mean(dim=0)
        shown[layer, head] = heatmap(browser, "cross-heatmap")
        torch.testing.assert_close(shown[layer, head], expected, atol=2e-4, rtol=0)
    assert not torch.allclose(shown["1", "2"], shown["0", "0"], atol=1e-2)  # another head shows other weights
    for step in (0, 3):  # the step's bars are that row
        select(browser, "step-select", str(step))
        torch.testing.assert_close(column(browser, "#cross-bars .v"), cross[0, 0, step], **WEIGHTS)
        assert f"step {step + 1}" in browser.find_element("id", "cross-step").text.lower()
    assert console_errors(browser) == []


def test_self_attention_and_the_mask_are_the_models(browser, references):
    reference = references[0]
    select(browser, "model-select", "0")
    for layer, head in (("0", "1"), ("1", "3")):
        for stack, weights in (("enc", reference.encoder_attentions), ("dec", reference.decoder_attentions)):
            select(browser, f"{stack}-layer", layer)
            select(browser, f"{stack}-head", head)
            expected = weights[int(layer)][0, int(head)].double()
            torch.testing.assert_close(heatmap(browser, f"{stack}-heatmap"), expected, **WEIGHTS)
    steps = reference.decoder_attentions[0].shape[-1]
    masked = browser.find_elements("css selector", "#dec-heatmap .cell.masked")
    assert len(masked) == steps * (steps - 1) // 2  # every future position, none else
    assert all(int(cell.get_attribute("data-col")) > int(cell.get_attribute("data-row")) for cell in masked)
    assert not browser.find_elements("css selector", "#enc-heatmap .cell.masked")


def test_one_head_computed_shows_the_models_weights(browser, references):
    cross = references[0].cross_attentions[-1][0].double()  # the walkthrough's default: the last layer's
    select(browser, "model-select", "0")
    for head, query in (("0", "0"), ("3", "5")):
        select(browser, "head-select", head)
        select(browser, "query-select", query)
        torch.testing.assert_close(column(browser, "#walk-table td.w"), cross[int(head), int(query)], **WEIGHTS)
    check = browser.find_element("id", "head-check")
    assert "Checked against the model" in check.text and "bad" not in check.get_attribute("class")


def test_rnn_alignment_step_is_the_models(browser, references):
    alignment = references[1].cross_attentions[0][0].double()  # (T, S)
    select(browser, "model-select", "1")
    assert browser.find_element("id", "rnn-body").is_displayed()
    assert not browser.find_element("id", "self-body").is_displayed()  # the RNN has no self-attention
    torch.testing.assert_close(heatmap(browser, "cross-heatmap"), alignment, **WEIGHTS)
    for step in (0, 4):
        select(browser, "step-select", str(step))
        torch.testing.assert_close(column(browser, "#rnn-table td.w"), alignment[step], **WEIGHTS)
    energies = column(browser, "#rnn-table td.energy")
    assert torch.isfinite(energies).all() and torch.softmax(energies, -1).argmax() == alignment[4].argmax()
    assert "bad" not in browser.find_element("id", "rnn-check").get_attribute("class")


def test_hover_and_keyboard(browser, references):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    select(browser, "model-select", "1")
    select(browser, "step-select", "0")
    target = browser.find_elements("css selector", "#cross-target .tok")[2]
    ActionChains(browser).move_to_element(target).perform()
    shades = browser.execute_script(
        "return [...document.querySelectorAll('#cross-source .tok')].map(b => getComputedStyle(b).backgroundColor)"
    )
    darkest = min(range(len(shades)), key=lambda j: sum(map(int, shades[j][4:-1].split(",")[:3])))
    assert darkest == int(references[1].cross_attentions[0][0, 2].argmax())  # its most attended source token
    button = browser.find_element("id", "step-next")
    button.send_keys(Keys.ENTER)  # a real button: Enter presses it
    assert browser.find_element("id", "step-select").get_attribute("value") == "1"
    assert browser.switch_to.active_element == button
    outline = browser.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # the focus is visible
    browser.find_element("id", "step-select").send_keys(Keys.ARROW_DOWN)
    assert browser.find_element("id", "step-select").get_attribute("value") == "2"
    assert console_errors(browser) == []


def test_screenshots_of_the_views(browser, tmp_path):
    folder = Path(os.environ.get("ATTN_EXPLAIN_SCREENSHOTS", tmp_path))
    select(browser, "model-select", "0")
    select(browser, "step-select", "2")
    written = screenshot_views(browser, folder / "explain-reverse")
    select(browser, "model-select", "1")
    written += screenshot_views(browser, folder / "explain-reverse-rnn", ("rnn",))
    assert {path.name for path in written} >= {f"explain-reverse-{view}.png" for view in ("beam", "cross", "head")}
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    assert console_errors(browser) == []
