"""The training loss of both model types: token-level cross-entropy with label smoothing, and guided alignment.

`token_loss` takes logits; `labelled_token_loss` takes the decoder's outputs and the output layer and computes the
logits of the labelled positions only (`skip_logits=True`); on the CPU it goes through `linear_token_loss`, which
computes the projection, the loss and its gradients a chunk of rows at a time without holding the logits (its
autograd function `_LinearTokenLoss`). All of them compute the same loss as `torch.nn.functional.cross_entropy`
and Trainer's `LabelSmoother` (tests/test_loss.py, tests/test_padding_free.py). `guided_alignment_loss` (Garg et
al. 2019) is added to it when reference word alignments are given; `consistency_loss` (R-Drop) when the recipe
trains with `--rdrop_alpha`.
"""

from __future__ import annotations

import torch
from transformers.utils import is_torchdynamo_compiling


def check_labels_shape(labels: torch.Tensor, shape: tuple[int, ...]) -> None:
    """`labels` must be (B, T) like the decoder's output."""
    if tuple(shape) != tuple(labels.shape):
        raise ValueError(
            f"labels have shape {tuple(labels.shape)} but the decoder produced logits for (batch, length) = "
            f"{tuple(shape)}; pass decoder_input_ids of the same shape as labels, or labels alone"
        )


def token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy summed over target tokens (-100 ignored), divided by their number.

    With gradient accumulation Trainer passes `num_items_in_batch`, the token count of the whole
    accumulated batch, so that the accumulated gradient equals that of one large batch. `label_smoothing`
    (Sec. 5.4, epsilon_ls) mixes the one-hot target with the uniform distribution, as
    `torch.nn.functional.cross_entropy(label_smoothing=...)` and Trainer's `LabelSmoother` do.
    """
    check_labels_shape(labels, logits.shape[:2])
    total = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(),
        labels.flatten().to(logits.device),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    return total / _token_count(labels, num_items_in_batch, total.device)


# Rows of the output projection handled at once by `linear_token_loss`: about 6M logits (24 MiB in float32) per chunk.
# Fewer rows make the weight-gradient update a thin matmul: 56 rows a chunk (2M logits, a 37k vocabulary) made the
# base preset's output layer 1.4x slower than 128 or more. Chunks of 64 MiB measured slower again (a 6k vocabulary):
# past glibc's 32 MiB mmap threshold an allocation is mapped afresh, not reused from the heap (bench/README.md).
LOSS_CHUNK_LOGITS = 6 << 20


def fuses_output_loss(output_layer: torch.nn.Module, hidden_states: torch.Tensor) -> bool:
    """Whether `linear_token_loss(hidden_states, output_layer.weight, ...)` may stand in for `token_loss` of
    `output_layer(hidden_states)`: where it was measured faster (the CPU, float32 or float64, outside autocast and
    torch.compile) and only for a plain bias-free `nn.Linear` with no hooks, so that nothing a wrapper, an adapter
    or a sharding library (DeepSpeed ZeRO-3, FSDP: they gather the weight in hooks) put on the layer is bypassed."""
    return (
        type(output_layer) is torch.nn.Linear
        and output_layer.bias is None
        and type(output_layer.weight) is torch.nn.Parameter
        and output_layer.weight.dtype in (torch.float32, torch.float64)
        and not (output_layer._forward_hooks or output_layer._forward_pre_hooks)
        and not hasattr(output_layer, "_hf_hook")  # accelerate's hooks (offloading, device_map) replace forward
        and not (torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)
        and hidden_states.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    )


def linear_token_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """`token_loss` of the logits `hidden_states @ weight.T + bias`, computed without holding the logits.

    `hidden_states` (N, E) and `labels` (N,) are rows (-100 ignored), `weight` (V, E) float32 or float64 (the
    loss is computed in its precision, autocast off). The rows go through the output projection, the log-softmax
    and the loss a chunk at a time (`LOSS_CHUNK_LOGITS` logits), and when a gradient is wanted it is computed in
    the same pass: d loss / d logits = softmax - (1 - eps) one-hot - eps / V, turned at once into the gradients of
    `hidden_states`, `weight` and `bias`; backward only scales them (once differentiable: no `create_graph`
    double backward, no `torch.func` transforms). So the gradient work is done whenever grad mode is on and an
    input requires grad, even if backward never runs. The loss and the gradients are `token_loss`'s on the full
    logits (tests/test_loss.py). Why: a (N, V) float tensor of a 4,096-token batch is 100 MB, and each of
    the half dozen the unfused loss allocates costs page faults on the CPU (no caching allocator there), where a
    chunk is reused from the heap (bench/README.md). `fuses_output_loss` says where the models use it.
    """
    if hidden_states.dim() != 2 or labels.shape != hidden_states.shape[:1]:
        raise ValueError(
            f"linear_token_loss takes hidden_states (rows, width) and labels (rows,), got shapes "
            f"{tuple(hidden_states.shape)} and {tuple(labels.shape)}"
        )
    if weight.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"linear_token_loss takes float32 or float64 weights, got {weight.dtype}; use token_loss")
    wants_grad = torch.is_grad_enabled() and any(
        tensor is not None and tensor.requires_grad for tensor in (hidden_states, weight, bias)
    )
    chunk = max(1, LOSS_CHUNK_LOGITS // weight.shape[0])
    with torch.autocast(hidden_states.device.type, enabled=False):
        if wants_grad:
            total = _LinearTokenLoss.apply(hidden_states, weight, bias, labels, label_smoothing, chunk)
        else:
            total = _linear_token_loss_sum(hidden_states, weight, bias, labels, label_smoothing, chunk)
    return total / _token_count(labels, num_items_in_batch, total.device)


def check_skip_logits(skip_logits: bool, labels: torch.Tensor | None) -> None:
    """`forward(..., skip_logits=True)` computes only the loss, so it needs `labels`."""
    if skip_logits and labels is None:
        raise ValueError("skip_logits=True computes only the loss, from labels; pass labels or drop skip_logits")


def check_label_smoothing(label_smoothing: float) -> None:
    """`forward(..., label_smoothing=eps)` takes epsilon_ls in [0, 1), as Trainer's `label_smoothing_factor`."""
    if (
        isinstance(label_smoothing, bool)
        or not isinstance(label_smoothing, (int, float))
        or not 0 <= label_smoothing < 1
    ):
        raise ValueError(f"label smoothing must be a probability in [0, 1), got {label_smoothing!r}")


def labelled_token_loss(
    hidden_states: torch.Tensor,
    labels: torch.Tensor,
    output_layer: torch.nn.Module,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """`token_loss` of the logits `output_layer(hidden_states) + bias`, computed at the labelled positions only.

    What a training step of either model needs (`skip_logits=True`): `hidden_states` (B, T, E) are the decoder's
    outputs, `labels` (B, T) with -100 at padding; the (B, T, V) logits of the padding are never made. Where
    `fuses_output_loss` allows it (the CPU) the projection and the loss go through `linear_token_loss` without
    any (tokens, V) tensor; elsewhere `output_layer` itself runs, hooks, adapters and sharding included.
    """
    check_labels_shape(labels, hidden_states.shape[:2])
    labels = labels.to(hidden_states.device)
    if is_torchdynamo_compiling():  # picking the rows is data-dependent (a graph break); -100 counts nothing anyway
        logits = output_layer(hidden_states)
        return token_loss(logits if bias is None else logits + bias, labels, num_items_in_batch, label_smoothing)
    rows = (labels != -100).reshape(-1).nonzero().squeeze(1)
    picked = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, rows)
    picked_labels = labels.reshape(-1).index_select(0, rows)
    if fuses_output_loss(output_layer, picked):
        return linear_token_loss(picked, output_layer.weight, picked_labels, bias, num_items_in_batch, label_smoothing)
    logits = output_layer(picked)
    if bias is not None:
        logits = logits + bias
    return token_loss(logits[None], picked_labels[None], num_items_in_batch, label_smoothing)


# Marian's default --guided-alignment-weight (Garg et al. 2019 use 0.05).
GUIDED_ALIGNMENT_WEIGHT = 0.1


def consistency_loss(
    logits: torch.Tensor,
    other_logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """R-Drop's regularizer (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): the symmetric
    KL divergence (KL(p || q) + KL(q || p)) / 2 between the token distributions p and q of two passes of the same
    batch (two dropout masks), summed over the labelled positions (-100 ignored) and divided by their number (or
    Trainer's `num_items_in_batch`), as `token_loss` divides."""
    check_labels_shape(labels, logits.shape[:2])
    kept = labels != -100
    log_p = torch.log_softmax(logits[kept].float(), dim=-1)
    log_q = torch.log_softmax(other_logits[kept].float(), dim=-1)
    total = 0.5 * ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum()  # the two KLs' sum, in one pass
    return total / _token_count(labels, num_items_in_batch, logits.device)


def guided_alignment_loss(
    attention: torch.Tensor,
    links: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy between reference alignments and the supervised attention (Garg et al. 2019, "Jointly Learning
    to Align and Translate with Transformer Models", Sec. 4; Marian's `--guided-alignment-cost ce`).

    `attention` (B, T, S): the attention that target position t (the step predicting `labels[:, t]`) gives each
    source position; `links` (B, T, S): 1 where reference target token t is aligned with source token s, else 0.
    Each target token's links are normalized to sum to 1 (G^p of the paper), and -sum_s G^p_ts log A_ts is summed
    over the target tokens that have links (the others are not supervised), then divided as `token_loss` divides
    (the labelled tokens, or Trainer's `num_items_in_batch`), so that gradient accumulation stays exact.
    """
    if links.shape != attention.shape:
        raise ValueError(
            f"the reference alignment has shape {tuple(links.shape)} but the attention is (batch, target, source) = "
            f"{tuple(attention.shape)}; give one (target length, source length) link matrix per pair"
        )
    check_labels_shape(labels, attention.shape[:2])
    links = links.to(attention.device, torch.float32)
    reference = links / links.sum(dim=-1, keepdim=True).clamp(min=1.0)
    # Clamped so that a linked position the attention gives exactly 0 costs a large finite amount, not inf
    log_attention = attention.float().clamp_min(torch.finfo(torch.float32).tiny).log()
    total = -(reference * log_attention).sum()
    return total / _token_count(labels, num_items_in_batch, total.device)


def _token_count(
    labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None, device: torch.device
) -> int | torch.Tensor:
    """The loss's divisor: `num_items_in_batch` (Trainer's count over accumulated batches) or the labelled tokens."""
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
        if not is_torchdynamo_compiling() and num_items_in_batch.item() == 0:
            raise ValueError("labels hold no target token (all positions are -100): the loss is undefined")
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(device)
    return num_items_in_batch


def _linear_token_loss_sum(hidden_states, weight, bias, labels, label_smoothing, chunk, grads=None):
    """The summed label-smoothed cross-entropy, chunk by chunk; with `grads` = (hidden, weight, bias) buffers
    (None where no gradient is wanted), also d sum / d each of them, written into those buffers."""
    vocab = weight.shape[0]
    total = torch.zeros((), dtype=weight.dtype, device=hidden_states.device)  # float32 or float64
    labels = labels.to(hidden_states.device)
    for start in range(0, hidden_states.shape[0], chunk):
        rows = hidden_states[start : start + chunk]
        targets = labels[start : start + chunk]
        kept = targets != -100
        safe_targets = torch.where(kept, targets, 0)[:, None]
        log_probs = torch.log_softmax(torch.nn.functional.linear(rows, weight, bias), dim=-1)
        losses = -(1.0 - label_smoothing) * log_probs.gather(1, safe_targets).squeeze(1)
        if label_smoothing:
            losses = losses - (label_smoothing / vocab) * log_probs.sum(dim=1)
        total += losses.masked_fill(~kept, 0.0).sum()
        if grads is None:
            continue
        grad_logits = log_probs.exp_()  # softmax, in place of the log-probabilities
        if label_smoothing:
            grad_logits.sub_(label_smoothing / vocab)
        grad_logits.scatter_add_(1, safe_targets, grad_logits.new_full(safe_targets.shape, label_smoothing - 1.0))
        grad_logits.mul_(kept[:, None])
        grad_hidden, grad_weight, grad_bias = grads
        if grad_hidden is not None:
            torch.mm(grad_logits, weight, out=grad_hidden[start : start + chunk])
        if grad_weight is not None and start == 0:
            torch.mm(grad_logits.T, rows, out=grad_weight)  # the first chunk writes the buffer: no zero fill
        elif grad_weight is not None:
            grad_weight.addmm_(grad_logits.T, rows)
        if grad_bias is not None:
            grad_bias += grad_logits.sum(dim=0)
    return total


class _LinearTokenLoss(torch.autograd.Function):
    """`linear_token_loss`'s summed loss, its gradients computed in the forward pass (once differentiable)."""

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, labels, label_smoothing, chunk):
        wants = ctx.needs_input_grad
        grads = (
            torch.empty_like(hidden_states) if wants[0] else None,
            (torch.empty_like if hidden_states.shape[0] else torch.zeros_like)(weight) if wants[1] else None,
            torch.zeros_like(bias) if bias is not None and wants[2] else None,
        )
        total = _linear_token_loss_sum(hidden_states, weight, bias, labels, label_smoothing, chunk, grads)
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        scaled = [grad * grad_total.to(grad.dtype) if grad is not None else None for grad in ctx.saved_tensors]
        return (*scaled, None, None, None)
