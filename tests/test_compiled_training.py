"""The compiled training step (issue 41): `torch.compile(model)`, what Trainer's `--torch_compile` does, on the
variable-length token batches of `attn train`. For attn_transformer: forward plus loss is one graph (no graph break),
the compiled step's loss and every gradient equal eager's, and a run over batches of changing shapes compiles a
bounded number of graphs (bench/compile_train_step.py measures it over a Multi30k epoch). attn_rnn: its recurrent
layers run eagerly inside the compiled model (`recurrent.COMPILED_WITH_GRADIENTS`), one graph break each."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from modeling_attn.api.presets import load_preset


@pytest.fixture(scope="module")
def bench():
    """bench/compile_train_step.py (its batches and its counting backend), the suite's module."""
    return importlib.import_module("bench.compile_train_step")


def tiny(preset: str = "tiny", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
    return AutoModelForSeq2SeqLM.from_config(load_preset(preset, **special, **overrides)).train()


# (source, target) lengths of twelve sentences: token batches of 64 padded tokens per side give batches of changing
# sizes and lengths, as attn train's do
LENGTHS = [(3, 4), (5, 5), (9, 7), (12, 14), (4, 3), (7, 9), (20, 18), (6, 6), (15, 12), (2, 3), (11, 10), (8, 8)]


def test_forward_and_loss_are_one_graph():
    model = tiny()
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([[5, 6, 2, -100, -100], [7, 8, 9, 10, 2]]),
    }

    def loss(input_ids, attention_mask, labels):
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True).loss

    explained = torch._dynamo.explain(loss)(**batch)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_the_compiled_step_equals_eager_loss_and_gradients(bench):
    """aot_eager: Dynamo's forward graph and AOTAutograd's backward graph, run by torch's own kernels (inductor's
    code generation is not what is checked here). Dropout off, so both steps compute the same function."""
    torch._dynamo.reset()
    eager = tiny(dropout=0.0)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    for batch in bench.token_batches(LENGTHS, 64, 1, eager.config.vocab_size)[:3]:
        expected, got = bench.training_step(eager, batch), bench.training_step(compiled, batch)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        for (name, parameter), twin in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
            torch.testing.assert_close(twin.grad, parameter.grad, rtol=1e-4, atol=1e-6, msg=name)
        eager.zero_grad(set_to_none=True)
        compiled_model.zero_grad(set_to_none=True)


def test_changing_batch_shapes_recompile_a_bounded_number_of_times(bench):
    """torch's default: the first batch compiles with its sizes, the next of another shape once more with dynamic
    sizes, and no later batch recompiles, but for a batch of one sentence (torch specializes sizes 0 and 1), which
    these batches hold (a 20-token pair fills half the budget alone): at most three graphs."""
    model = tiny()
    batches = bench.token_batches(LENGTHS * 2, 64, 1, model.config.vocab_size)
    assert len({(*b["input_ids"].shape, b["labels"].shape[1]) for b in batches}) > 4
    counts = bench.count_compilations(model, batches, dynamic=None, backend="eager")
    assert any(len(batch["input_ids"]) == 1 for batch in batches)
    assert counts["graph_breaks"] == 0 and counts["graphs_compiled"] <= 3


def test_the_rnn_runs_its_recurrent_layers_eagerly_inside_the_compiled_model():
    model = tiny("rnn-tiny")
    batch = {"input_ids": torch.tensor([[5, 6, 7]]), "labels": torch.tensor([[5, 6, 2]])}
    explained = torch._dynamo.explain(lambda **inputs: model(**inputs, skip_logits=True).loss)(**batch)
    reasons = {str(reason.reason).split("\n")[0] for reason in explained.break_reasons}
    assert explained.graph_break_count > 0
    assert all("torch.compiler.disable" in reason for reason in reasons), reasons
