"""The recurrent layers of attn_rnn (modeling_attn/recurrent.py) and what they make possible: the model traces.

- `Recurrent` has nn.GRU / nn.LSTM's parameters and, eagerly, their results bit for bit; its traced path
  (`masked_forward`, one masked step per position) gives the same outputs and final states as the packed fused
  kernels, for both cell types, one or two layers, one or two directions, with and without padding and initial state.
- The whole model on its traced path equals the eager model for every decoder variant (quick).
- Slow: `torch.export` with a dynamic batch, source and target length, run on other shapes; `torch.compile(...,
  fullgraph=True)` with no graph break; compiled training gradients equal eager ones; the dynamo ONNX export run in
  onnxruntime. Each is compared with the eager model's logits on batches of other shapes than the traced example.
"""

from __future__ import annotations

import onnxruntime
import pytest
import torch
from test_modeling_rnn import IDS, VARIANTS, VOCAB, make_model
from tiny import padded_batch, tiny_rnn_config
from torch import nn
from torch.export import Dim
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from modeling_attn import AttnRNNForConditionalGeneration
from modeling_attn.recurrent import Recurrent, step_loop

SHAPES = [
    (rnn_type, layers, bidirectional)
    for rnn_type in ("gru", "lstm")
    for layers in (1, 2)
    for bidirectional in (False, True)
]


def pair(rnn_type: str, layers: int, bidirectional: bool) -> tuple[nn.RNNBase, Recurrent]:
    torch.manual_seed(0)
    reference = (nn.GRU if rnn_type == "gru" else nn.LSTM)(
        5, 4, num_layers=layers, batch_first=True, bidirectional=bidirectional
    )
    recurrent = Recurrent(rnn_type, 5, 4, num_layers=layers, bidirectional=bidirectional)
    recurrent.load_state_dict(reference.state_dict())  # strict: the same parameter names and shapes
    return reference.eval(), recurrent.eval()


def padded_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(4, 6, 5, generator=generator)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5, [1] * 5 + [0]], dtype=torch.bool)
    return inputs, mask


def initial_state(rnn_type: str, layers: int, bidirectional: bool) -> torch.Tensor | tuple:
    generator = torch.Generator().manual_seed(1)
    shape = (layers * (2 if bidirectional else 1), 4, 4)
    hidden = torch.randn(shape, generator=generator)
    return (hidden, torch.randn(shape, generator=generator)) if rnn_type == "lstm" else hidden


def states(state) -> tuple[torch.Tensor, ...]:
    return state if isinstance(state, tuple) else (state,)


@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_eager_results_are_nn_gru_and_nn_lstm_bit_for_bit(shape):
    reference, recurrent = pair(*shape)
    inputs, mask = padded_inputs()
    state = initial_state(*shape)
    expected = reference(inputs, state)
    got = recurrent(inputs, state)
    assert torch.equal(got[0], expected[0]) and all(map(torch.equal, states(got[1]), states(expected[1])))
    packed = pack_padded_sequence(inputs, mask.sum(1), batch_first=True, enforce_sorted=False)
    outputs, final = reference(packed)
    outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
    got = recurrent(inputs, mask=mask)
    assert torch.equal(got[0], outputs) and all(map(torch.equal, states(got[1]), states(final)))


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("with_mask", [False, True], ids=["no-padding", "padding"])
@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_masked_steps_equal_the_packed_fused_kernels(shape, with_mask, with_state):
    _, recurrent = pair(*shape)
    inputs, mask = padded_inputs()
    mask = mask if with_mask else None
    state = initial_state(*shape) if with_state else None
    fused_outputs, fused_final = recurrent.fused_forward(inputs, state, mask)
    masked_outputs, masked_final = recurrent.masked_forward(inputs, state, mask)
    torch.testing.assert_close(masked_outputs, fused_outputs, rtol=0, atol=1e-6)
    for masked, fused in zip(states(masked_final), states(fused_final), strict=True):
        torch.testing.assert_close(masked, fused, rtol=0, atol=1e-6)
    if with_mask:
        assert not masked_outputs[~mask].any()  # zero at padding, as pad_packed_sequence leaves it


def test_step_loop_visits_positions_in_order_or_reversed():
    def step(carry, position):
        carry = carry * 10 + position[0]
        return carry, (carry.clone(),)

    values = torch.tensor([[1.0, 2.0, 3.0]])
    carry, (outputs,) = step_loop(step, torch.zeros(1), (values,))
    assert carry.item() == 123 and outputs.tolist() == [[1, 12, 123]]
    carry, (outputs,) = step_loop(step, torch.zeros(1), (values,), reverse=True)
    assert carry.item() == 321 and outputs.tolist() == [[321, 32, 3]]


def tiny_rnn(**variant) -> AttnRNNForConditionalGeneration:
    torch.manual_seed(0)
    model = AttnRNNForConditionalGeneration(tiny_rnn_config(**variant)).eval()
    with torch.no_grad():  # spread weights: outputs that differ clearly between positions and sentences
        for parameter in model.parameters():
            parameter.uniform_(-0.5, 0.5)
    return model


def as_kwargs(batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    return dict(zip(("input_ids", "attention_mask", "decoder_input_ids"), batch, strict=True))


@pytest.mark.parametrize("variant", [dict(VARIANTS[0], encoder_layers=2, decoder_layers=2), *VARIANTS[1:]], ids=IDS)
@torch.no_grad()
def test_the_traced_path_of_the_model_equals_eager(monkeypatch, variant):
    """What torch.export / torch.compile run (every recurrent layer as masked steps), eagerly, equals fused."""
    model = make_model(**variant)
    batch = as_kwargs(padded_batch(vocab=VOCAB))
    eager = model(**batch, use_cache=False).logits
    monkeypatch.setattr(Recurrent, "forward", Recurrent.masked_forward)
    torch.testing.assert_close(model(**batch, use_cache=False).logits, eager, rtol=0, atol=1e-5)


# --- attn_rnn traces (slow: each trace takes 20-90 s on a CPU) ---------------------------------------------------
# Variants: Bahdanau GRU (the default), a two-layer Luong LSTM with input feeding (both step by step), and a Luong
# GRU decoder that runs the whole target in one recurrent call.
TRACED = {
    "bahdanau-gru": dict(),
    "luong-lstm-feed-2layer": dict(
        decoder_style="luong",
        rnn_type="lstm",
        input_feeding=True,
        encoder_layers=2,
        decoder_layers=2,
        attention_score="general",
    ),
    "luong-gru": dict(decoder_style="luong", attention_score="general"),
}
EXAMPLE = padded_batch()  # batch 3, source 7, target 5
OTHERS = [
    padded_batch(seed=1, batch=5, source_length=11, target_length=8),
    padded_batch(seed=2, batch=2, source_length=4, target_length=3),
]
DYNAMIC = dict(
    batch=Dim("batch", min=1, max=64), source=Dim("source", min=2, max=256), target=Dim("target", min=2, max=256)
)
DYNAMIC_SHAPES = (
    {0: DYNAMIC["batch"], 1: DYNAMIC["source"]},
    {0: DYNAMIC["batch"], 1: DYNAMIC["source"]},
    {0: DYNAMIC["batch"], 1: DYNAMIC["target"]},
)


class Logits(nn.Module):
    """forward(input_ids, attention_mask, decoder_input_ids) -> logits: the tensor function an exporter traces."""

    def __init__(self, model: AttnRNNForConditionalGeneration):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return self.model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False).logits


def eager_logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return Logits(model)(*batch)


def test_an_export_that_records_gradients_is_refused_naming_the_fix():
    with pytest.raises(
        RuntimeError, match=r"attn_rnn exports as an inference graph: call .* inside `with torch.no_grad\(\):`"
    ):
        torch.export.export(Logits(tiny_rnn()), EXAMPLE, dynamic_shapes=DYNAMIC_SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize("variant", TRACED)
def test_torch_export_with_dynamic_batch_and_lengths_equals_eager(variant):
    model = tiny_rnn(**TRACED[variant])
    with torch.no_grad():
        program = torch.export.export(Logits(model), EXAMPLE, dynamic_shapes=DYNAMIC_SHAPES)
    for batch in OTHERS:
        torch.testing.assert_close(program.module()(*batch), eager_logits(model, batch), rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bahdanau-gru", "luong-lstm-feed-2layer"])
def test_torch_compile_fullgraph_equals_eager_with_no_graph_break(variant):
    model = tiny_rnn(**TRACED[variant])
    kwargs = dict(as_kwargs(OTHERS[0]), use_cache=False)
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(**kwargs)
        assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
        compiled = torch.compile(model, fullgraph=True)
        for batch in OTHERS:
            got = compiled(**as_kwargs(batch), use_cache=False).logits
            torch.testing.assert_close(got, eager_logits(model, batch), rtol=0, atol=1e-5)


def test_fullgraph_compile_of_a_training_step_is_refused_naming_why():
    model = tiny_rnn().train()
    input_ids, attention_mask, labels = EXAMPLE
    with pytest.raises(
        torch._dynamo.exc.Unsupported,
        match=r"(?s)disable.*attn_rnn's recurrent layers run eagerly under torch.compile while gradients are recorded",
    ):
        torch.compile(model, fullgraph=True)(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


@pytest.mark.slow
def test_compiled_training_gradients_equal_eager():
    """With gradients the recurrent layers run eagerly under torch.compile (recurrent.py: an inductor scan-gradient
    bug); the loss and every parameter's gradient must equal the eager ones."""
    model = tiny_rnn().train()
    input_ids, attention_mask, labels = EXAMPLE

    def loss_and_gradients(forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        loss = forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()}

    loss, gradients = loss_and_gradients(model)
    compiled_loss, compiled_gradients = loss_and_gradients(torch.compile(model))
    torch.testing.assert_close(compiled_loss, loss, rtol=0, atol=1e-6)
    for name, gradient in gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bahdanau-gru", "luong-lstm-feed-2layer"])
def test_dynamo_onnx_export_runs_in_onnxruntime_like_eager(tmp_path, variant):
    model = tiny_rnn(**TRACED[variant])
    with torch.no_grad():
        program = torch.onnx.export(Logits(model), EXAMPLE, dynamo=True, dynamic_shapes=DYNAMIC_SHAPES, verbose=False)
    program.save(tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in OTHERS:
        (logits,) = session.run(None, {name: tensor.numpy() for name, tensor in as_kwargs(batch).items()})
        torch.testing.assert_close(torch.from_numpy(logits), eager_logits(model, batch), rtol=0, atol=1e-5)
