"""The recurrent layers of the RNN encoder-decoder (`modeling_rnn.py`), in a form torch.compile and torch.export trace.

- `Recurrent`: a stacked GRU or LSTM (Cho et al. 2014; Hochreiter & Schmidhuber 1997) holding exactly the parameters
  of `nn.GRU` / `nn.LSTM` (same names and shapes, so checkpoints are unchanged). Run eagerly it calls their fused
  kernels on packed inputs; traced (`traced_loops`) it runs `masked_forward`: the same cell equations over the same
  parameters, one step per position, where a padded position leaves the state unchanged.
- `step_loop`: `carry, output_t = step(carry, input_t)` over the positions; a Python loop in eager mode, and
  `torch._higher_order_ops.scan` when traced, so that the number of steps can be a dynamic dimension.
- `traced_loops`: whether the loops are traced as `scan` (no gradient recorded, under torch.export or torch.compile).

Why two paths, where torch 2.13 limits them, and the cell equations: docs/model.md, "Recurrent layers". The two paths
agree to float rounding (tests/test_recurrent.py); eager results are those of `nn.GRU` / `nn.LSTM`, bit for bit.

Shapes: B batch, T steps, I input width, H hidden units, L layers, D directions (1 or 2).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._higher_order_ops.scan import scan
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

RNNState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # GRU: h (L * D, B, H); LSTM: (h, c)
# why torch.compile graph-breaks at the recurrent layers when gradients are recorded (fullgraph=True shows it)
COMPILED_WITH_GRADIENTS = (
    "attn_rnn's recurrent layers run eagerly under torch.compile while gradients are recorded (inductor in torch 2.13 "
    "computes wrong gradients through torch._higher_order_ops.scan): train compiled without fullgraph=True, or "
    "compile for inference under torch.no_grad(), where the whole forward is one graph"
)
Carry = torch.Tensor | tuple


def traced_loops() -> bool:
    """Whether recurrent loops run as `scan` (module docstring): exported, or compiled without gradients. An export
    that records gradients is refused."""
    if torch.compiler.is_exporting():
        if torch.is_grad_enabled():
            raise RuntimeError(
                "attn_rnn exports as an inference graph: call torch.export.export / torch.onnx.export inside "
                "`with torch.no_grad():` (recording gradients, torch 2.13 fails to trace its recurrent loops, "
                "torch._higher_order_ops.scan, with dynamic shapes)"
            )
        return True
    return torch.compiler.is_compiling() and not torch.is_grad_enabled()


def step_loop(
    step: Callable[[Carry, tuple[torch.Tensor, ...]], tuple[Carry, tuple[torch.Tensor, ...]]],
    carry: Carry,
    inputs: tuple[torch.Tensor, ...],
    reverse: bool = False,
) -> tuple[Carry, tuple[torch.Tensor, ...]]:
    """`carry, outputs_t = step(carry, inputs_t)` for t along dim 1 of every tensor in `inputs` (backwards with
    `reverse`); returns the last carry and the outputs stacked along dim 1, in position order.

    Scan's rules: the carry is a tensor or a tuple of tensors (no None), its tensors are distinct, and `step` returns
    no tensor that is also (a view of) its carry: clone it.
    """
    length = inputs[0].shape[1]
    if traced_loops() and not (isinstance(length, int) and length == 1):  # a static 1: no loop needed
        return scan(step, carry, inputs, dim=1, reverse=reverse)
    outputs = [None] * length
    for position in reversed(range(length)) if reverse else range(length):
        carry, outputs[position] = step(carry, tuple(tensor[:, position] for tensor in inputs))
    return carry, tuple(torch.stack(column, dim=1) for column in zip(*outputs, strict=True))


def gru_cell(input_gates: torch.Tensor, hidden: torch.Tensor, weight_hh: torch.Tensor, bias_hh: torch.Tensor):
    """One GRU step from the input's gate pre-activations W_i x + b_i (B, 3H) and the state h (B, H): h' (B, H)."""
    reset_in, update_in, new_in = input_gates.chunk(3, dim=-1)
    reset_hidden, update_hidden, new_hidden = nn.functional.linear(hidden, weight_hh, bias_hh).chunk(3, dim=-1)
    reset = torch.sigmoid(reset_in + reset_hidden)
    update = torch.sigmoid(update_in + update_hidden)
    new = torch.tanh(new_in + reset * new_hidden)
    return (1 - update) * new + update * hidden


def lstm_cell(input_gates: torch.Tensor, state: tuple, weight_hh: torch.Tensor, bias_hh: torch.Tensor):
    """One LSTM step from the input's gate pre-activations (B, 4H) and the state (h, c): (h', c')."""
    hidden, cell = state
    gates = input_gates + nn.functional.linear(hidden, weight_hh, bias_hh)
    input_gate, forget_gate, cell_gate, output_gate = gates.chunk(4, dim=-1)
    cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(input_gate) * torch.tanh(cell_gate)
    return torch.sigmoid(output_gate) * torch.tanh(cell), cell


class Recurrent(nn.RNNBase):
    """A stacked, batch-first GRU or LSTM (`rnn_type` "gru" / "lstm"), optionally bidirectional, with the parameters
    of `nn.GRU` / `nn.LSTM` and, in eager mode, their computation (module docstring).

    `forward(inputs, state=None, mask=None)`: inputs (B, T, I); state (L * D, B, H) (a pair for an LSTM), zeros when
    None; mask (B, T), True at real tokens, which must be right-padded and hold one token per row. Returns the outputs
    (B, T, D * H), zero at padding, and the state after each row's last real token (backward direction: after its
    first).
    """

    def __init__(
        self,
        rnn_type: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
    ):
        super().__init__(
            rnn_type.upper(),
            input_size,
            hidden_size,
            num_layers=num_layers,
            dropout=dropout,
            batch_first=True,
            bidirectional=bidirectional,
        )
        self.eager_class = nn.LSTM if self.mode == "LSTM" else nn.GRU  # the module whose forward runs eagerly

    # nn.LSTM's checks of an (h, c) state, which nn.LSTM.forward calls on its module
    def check_forward_args(self, *args) -> None:
        return self.eager_class.check_forward_args(self, *args)

    def permute_hidden(self, *args):
        return self.eager_class.permute_hidden(self, *args)

    def get_expected_cell_size(self, *args) -> tuple[int, int, int]:
        return nn.LSTM.get_expected_cell_size(self, *args)

    def forward(
        self, inputs: torch.Tensor, state: RNNState | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, RNNState]:
        if traced_loops():
            return self.masked_forward(inputs, state, mask)
        return self.fused_forward(inputs, state, mask)

    @torch.compiler.disable(reason=COMPILED_WITH_GRADIENTS)  # run eagerly (module docstring)
    def fused_forward(
        self, inputs: torch.Tensor, state: RNNState | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, RNNState]:
        """`forward` with nn.GRU / nn.LSTM's fused kernels, on the packed sequence when there is padding."""
        if mask is None:
            return self.eager_class.forward(self, inputs, state)
        lengths = mask.sum(dim=1).cpu()  # packing reads the lengths on the CPU
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        outputs, state = self.eager_class.forward(self, packed, state)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
        return outputs, state

    def masked_forward(
        self, inputs: torch.Tensor, state: RNNState | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, RNNState]:
        """`forward`'s result computed one step at a time with `step_loop` (what tracing runs; module docstring)."""
        directions = 2 if self.bidirectional else 1
        if state is None:
            shape = (self.num_layers * directions, inputs.shape[0], self.hidden_size)
            state = (
                (inputs.new_zeros(shape), inputs.new_zeros(shape)) if self.mode == "LSTM" else inputs.new_zeros(shape)
            )
        states = state if isinstance(state, tuple) else (state,)  # each (L * D, B, H)
        mask = torch.ones(inputs.shape[:2], dtype=torch.bool, device=inputs.device) if mask is None else mask.bool()
        final_states = []
        for layer in range(self.num_layers):
            if layer > 0:  # between stacked layers, as nn.GRU / nn.LSTM
                inputs = nn.functional.dropout(inputs, self.dropout, self.training)
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                # a copy, not a view at an offset into the state: traced, a scan's carry at a fixed storage offset
                # would pin the batch size
                initial = tuple(part[index].clone() for part in states)
                output, final = self._layer(inputs, mask, initial, layer, direction == 1)
                outputs.append(output)
                final_states.append(final)
            inputs = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        final_state = tuple(torch.stack(part) for part in zip(*final_states, strict=True))  # each (L * D, B, H)
        return inputs * mask[..., None], final_state if self.mode == "LSTM" else final_state[0]

    def _layer(self, inputs, mask, state: tuple, layer: int, backward: bool):
        """One direction of one layer: outputs (B, T, H) and the final state (a tuple of (B, H))."""
        suffix = f"_l{layer}" + ("_reverse" if backward else "")
        weight_hh, bias_hh = getattr(self, "weight_hh" + suffix), getattr(self, "bias_hh" + suffix)
        input_gates = nn.functional.linear(
            inputs, getattr(self, "weight_ih" + suffix), getattr(self, "bias_ih" + suffix)
        )

        def step(carry, position):
            gates, real = position  # (B, G H), (B,)
            if self.mode == "LSTM":
                new = lstm_cell(gates, carry, weight_hh, bias_hh)
            else:
                new = (gru_cell(gates, carry[0], weight_hh, bias_hh),)
            carry = tuple(torch.where(real[:, None], updated, old) for updated, old in zip(new, carry, strict=True))
            return carry, (carry[0].clone(),)

        final, (outputs,) = step_loop(step, state, (input_gates, mask), reverse=backward)
        return outputs, final


__all__ = ["Recurrent", "gru_cell", "lstm_cell", "step_loop", "traced_loops"]
