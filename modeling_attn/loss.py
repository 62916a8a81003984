"""The training loss of both model types: token-level cross-entropy with label smoothing, and guided alignment.

`token_loss` takes logits; `labelled_token_loss` takes the decoder's outputs and the output layer and computes the
logits of the labelled positions only (`skip_logits=True`); on the CPU it goes through `linear_token_loss`, which
computes the projection, the loss and its gradients a chunk of rows at a time without holding the logits (its
autograd function `_LinearTokenLoss`). All of them compute the same loss as `torch.nn.functional.cross_entropy`
and Trainer's `LabelSmoother` (tests/test_loss.py, tests/test_padding_free.py). `guided_alignment_loss` (Garg et
al. 2019) is added to it when reference word alignments are given; `consistency_loss` (R-Drop) when the recipe
trains with `--rdrop_alpha`: `labelled_consistency_loss` computes R-Drop's cross-entropy and KL from the decoder's
outputs of the doubled batch at the labelled positions, through `linear_consistency_loss` (chunked, no logits held,
`_LinearConsistencyLoss`) where `fuses_output_loss` allows it.
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
        _at_least_float32(logits.flatten(0, 1)),
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
    (picked,), picked_labels = _labelled_rows(hidden_states[None], labels)
    if fuses_output_loss(output_layer, picked):
        return linear_token_loss(picked, output_layer.weight, picked_labels, bias, num_items_in_batch, label_smoothing)
    logits = output_layer(picked)
    if bias is not None:
        logits = logits + bias
    return token_loss(logits[None], picked_labels[None], num_items_in_batch, label_smoothing)


def _labelled_rows(hidden_states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of `hidden_states` (C, B, T, E) (C copies of a batch) at the labelled positions of `labels` (B, T),
    (C, N, E), and their labels (N,)."""
    rows = (labels != -100).reshape(-1).nonzero().squeeze(1)
    picked = hidden_states.reshape(hidden_states.shape[0], -1, hidden_states.shape[-1]).index_select(1, rows)
    return picked, labels.reshape(-1).index_select(0, rows)


def linear_consistency_loss(
    hidden_a: torch.Tensor,
    hidden_b: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R-Drop's loss, cross_entropy + alpha x divergence, and its two parts, of the logits `hidden @ weight.T + bias`
    of two copies of the same rows, computed without holding the logits (as `linear_token_loss`).

    `hidden_a`, `hidden_b` (N, E) and `labels` (N,) (-100 ignored): cross_entropy is `token_loss` of both copies'
    logits (2N rows, so divided by twice the labelled rows, or twice `num_items_in_batch`), divergence is
    `consistency_loss` of the two (divided by the labelled rows or `num_items_in_batch`). Only the first result is
    differentiable (its gradients are computed in the forward pass, as `linear_token_loss`'s, in one pass over
    both copies: the cost of a cross-entropy of 2N rows); the parts are for the log. Equal to `token_loss` +
    `consistency_loss` on the full logits, values and gradients (tests/test_rdrop.py).
    """
    if hidden_a.dim() != 2 or hidden_b.shape != hidden_a.shape or labels.shape != hidden_a.shape[:1]:
        raise ValueError(
            f"linear_consistency_loss takes hidden_a and hidden_b (rows, width) and labels (rows,), got shapes "
            f"{tuple(hidden_a.shape)}, {tuple(hidden_b.shape)} and {tuple(labels.shape)}"
        )
    if weight.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"linear_consistency_loss takes float32 or float64 weights, got {weight.dtype}")
    chunk = max(1, LOSS_CHUNK_LOGITS // weight.shape[0])
    count = _token_count(labels, num_items_in_batch, hidden_a.device)
    inputs = (hidden_a, hidden_b, weight, bias, labels, label_smoothing, chunk, float(alpha))
    with torch.autocast(hidden_a.device.type, enabled=False):
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs[:4]):
            sums = _LinearConsistencyLoss.apply(*inputs)
        else:
            cross_entropy, divergence = _linear_consistency_sums(*inputs).unbind()
            sums = (cross_entropy + alpha * divergence, cross_entropy, divergence)
    return tuple(total / (2 * count) for total in sums)  # both sums are of 2N terms: CE twice, D as KL + KL


def labelled_consistency_loss(
    hidden_states: torch.Tensor,
    labels: torch.Tensor,
    output_layer: torch.nn.Module,
    bias: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R-Drop's loss and its two parts (`linear_consistency_loss`) from the decoder's outputs `hidden_states`
    (2B, T, E) of a batch twice, `labels` (B, T) the labels of one copy, at the labelled positions only, as
    `labelled_token_loss`: fused where `fuses_output_loss` allows it, else the logits of the labelled rows through
    `output_layer`, `token_loss` and `consistency_loss`."""
    if hidden_states.shape[0] % 2:
        raise ValueError(f"hidden_states hold a batch twice: an even number of rows, got {hidden_states.shape[0]}")
    check_labels_shape(labels, (hidden_states.shape[0] // 2, hidden_states.shape[1]))
    labels = labels.to(hidden_states.device)
    (picked_a, picked_b), picked_labels = _labelled_rows(hidden_states.unflatten(0, (2, -1)), labels)
    if fuses_output_loss(output_layer, picked_a):
        return linear_consistency_loss(
            picked_a, picked_b, output_layer.weight, picked_labels, bias, num_items_in_batch, label_smoothing, alpha
        )
    logits = output_layer(torch.stack([picked_a, picked_b]))
    if bias is not None:
        logits = logits + bias
    twice = None if num_items_in_batch is None else 2 * num_items_in_batch
    cross_entropy = token_loss(logits.flatten(0, 1)[None], picked_labels.repeat(2)[None], twice, label_smoothing)
    divergence = consistency_loss(logits[:1], logits[1:], picked_labels[None], num_items_in_batch)
    return cross_entropy + alpha * divergence, cross_entropy, divergence


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
    log_p = torch.log_softmax(_at_least_float32(logits[kept]), dim=-1)
    log_q = torch.log_softmax(_at_least_float32(other_logits[kept]), dim=-1)
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


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Logits in float32 for the loss (bfloat16 and float16 ones upcast), float64 ones kept."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


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
    total = torch.zeros((), dtype=weight.dtype, device=hidden_states.device)  # float32 or float64
    labels = labels.to(hidden_states.device)
    for start in range(0, hidden_states.shape[0], chunk):
        rows = hidden_states[start : start + chunk]
        kept, safe_targets = _chunk_targets(labels[start : start + chunk])
        log_probs = torch.log_softmax(torch.nn.functional.linear(rows, weight, bias), dim=-1)
        total += _smoothed_nll(log_probs, safe_targets, label_smoothing).masked_fill(~kept, 0.0).sum()
        if grads is None:
            continue
        grad_logits = _minus_targets_(log_probs.exp_(), safe_targets, kept, label_smoothing)  # softmax, in place
        _accumulate_grads(grad_logits, rows, weight, grads, slice(start, start + chunk), first=start == 0)
    return total


def _chunk_targets(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The labelled rows of a chunk (a mask) and its targets as a (rows, 1) index, 0 where ignored."""
    kept = targets != -100
    return kept, torch.where(kept, targets, 0)[:, None]


def _smoothed_nll(log_probs: torch.Tensor, safe_targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Each row's label-smoothed cross-entropy: -(1 - eps) log p_y - eps / V sum_k log p_k."""
    losses = -(1.0 - label_smoothing) * log_probs.gather(1, safe_targets).squeeze(1)
    if label_smoothing:
        losses = losses - (label_smoothing / log_probs.shape[1]) * log_probs.sum(dim=1)
    return losses


def _minus_targets_(grad_logits, safe_targets, kept, label_smoothing):
    """`grad_logits` (rows holding softmax + anything else) minus the smoothed one-hot target, (1 - eps) one-hot +
    eps / V, so that softmax becomes d cross-entropy / d logits; the ignored rows zeroed. In place."""
    if label_smoothing:
        grad_logits.sub_(label_smoothing / grad_logits.shape[1])
    grad_logits.scatter_add_(1, safe_targets, grad_logits.new_full(safe_targets.shape, label_smoothing - 1.0))
    return grad_logits.mul_(kept[:, None])


def _accumulate_grads(grad_logits, rows, weight, grads, where, first):
    """From d sum / d logits of a chunk of `rows`: d / d hidden written into `grads[0][where]`, d / d weight and
    d / d bias added into `grads[1]` and `grads[2]` (None: not wanted); the `first` chunk writes the weight's."""
    grad_hidden, grad_weight, grad_bias = grads
    if grad_hidden is not None:
        torch.mm(grad_logits, weight, out=grad_hidden[where])
    if grad_weight is not None and first:
        torch.mm(grad_logits.T, rows, out=grad_weight)  # no zero fill
    elif grad_weight is not None:
        grad_weight.addmm_(grad_logits.T, rows)
    if grad_bias is not None:
        grad_bias += grad_logits.sum(dim=0)


def _grad_buffers(wants, hidden_states, weight, bias):
    """Buffers for the gradients of `hidden_states`, `weight` and `bias` that `wants` (None for the others); the
    weight's is written by the first chunk, so left empty unless there is none."""
    return (
        torch.empty_like(hidden_states) if wants[0] else None,
        (torch.empty_like if hidden_states.shape[0] else torch.zeros_like)(weight) if wants[1] else None,
        torch.zeros_like(bias) if bias is not None and wants[2] else None,
    )


class _LinearTokenLoss(torch.autograd.Function):
    """`linear_token_loss`'s summed loss, its gradients computed in the forward pass (once differentiable)."""

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, labels, label_smoothing, chunk):
        grads = _grad_buffers(ctx.needs_input_grad, hidden_states, weight, bias)
        total = _linear_token_loss_sum(hidden_states, weight, bias, labels, label_smoothing, chunk, grads)
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        return (*_scaled(ctx.saved_tensors, grad_total), None, None, None)


def _scaled(grads, grad_total):
    return [grad * grad_total.to(grad.dtype) if grad is not None else None for grad in grads]


def _linear_consistency_sums(hidden_a, hidden_b, weight, bias, labels, label_smoothing, chunk, alpha, grads=None):
    """`linear_consistency_loss`'s sums, chunk by chunk: cross-entropy of both copies, CE, and 2 x the symmetric
    KL, 2 D (both over the labelled rows); with `grads` = (hidden_a, hidden_b, weight, bias) buffers (None where
    not wanted), d (CE + alpha 2 D) / d each, written into them. Per row, with z the logits, p = softmax(z_a),
    q = softmax(z_b), r = log p - log q: 2 D = sum_k (p_k - q_k) r_k = E_p[r] - E_q[r] (KL(p||q) + KL(q||p)), and
    d 2 D / d z_a = p (r - E_p[r]) + p - q, d 2 D / d z_b = q (E_q[r] - r) + q - p."""
    sums = torch.zeros(2, dtype=weight.dtype, device=hidden_a.device)
    labels = labels.to(hidden_a.device)
    for start in range(0, hidden_a.shape[0], chunk):
        rows_a, rows_b = hidden_a[start : start + chunk], hidden_b[start : start + chunk]
        kept, safe_targets = _chunk_targets(labels[start : start + chunk])
        log_p = torch.log_softmax(torch.nn.functional.linear(rows_a, weight, bias), dim=-1)
        log_q = torch.log_softmax(torch.nn.functional.linear(rows_b, weight, bias), dim=-1)
        cross_entropy = _smoothed_nll(log_p, safe_targets, label_smoothing)
        cross_entropy += _smoothed_nll(log_q, safe_targets, label_smoothing)
        p = log_p.exp()
        ratio = log_p.sub_(log_q)  # r, in place of log p
        q = log_q.exp_()  # in place of log q
        grad_a = torch.mul(p, ratio)
        mean_a = grad_a.sum(dim=1, keepdim=True)  # E_p[r] = KL(p||q)
        ratio.mul_(q)
        mean_b = ratio.sum(dim=1, keepdim=True)  # E_q[r] = -KL(q||p)
        sums += torch.stack([cross_entropy, (mean_a - mean_b).squeeze(1)], dim=1).masked_fill(~kept[:, None], 0).sum(0)
        if grads is None:
            continue
        # d / d z_a = softmax(z_a) - targets + alpha (p (r - E_p[r]) + p - q); z_b alike, q r in place of r
        grad_a.addcmul_(p, mean_a, value=-1.0).mul_(alpha).add_(p, alpha=1.0 + alpha).sub_(q, alpha=alpha)
        grad_b = ratio.addcmul_(q, mean_b, value=-1.0).mul_(-alpha).add_(q, alpha=1.0 + alpha).sub_(p, alpha=alpha)
        where, (grad_hidden_a, grad_hidden_b, grad_weight, grad_bias) = slice(start, start + chunk), grads
        for grad_logits, rows, grad_hidden, first in (
            (grad_a, rows_a, grad_hidden_a, start == 0),
            (grad_b, rows_b, grad_hidden_b, False),
        ):
            _minus_targets_(grad_logits, safe_targets, kept, label_smoothing)
            _accumulate_grads(grad_logits, rows, weight, (grad_hidden, grad_weight, grad_bias), where, first)
    return sums


class _LinearConsistencyLoss(torch.autograd.Function):
    """`linear_consistency_loss`'s sums (CE + alpha 2 D, CE, 2 D), the gradient of the first computed in the forward
    pass (once differentiable); the other two are not differentiable (the parts, for the log)."""

    @staticmethod
    def forward(ctx, hidden_a, hidden_b, weight, bias, labels, label_smoothing, chunk, alpha):
        wants = ctx.needs_input_grad
        grad_a, grad_weight, grad_bias = _grad_buffers((wants[0], wants[2], wants[3]), hidden_a, weight, bias)
        grads = (grad_a, torch.empty_like(hidden_b) if wants[1] else None, grad_weight, grad_bias)
        sums = _linear_consistency_sums(hidden_a, hidden_b, weight, bias, labels, label_smoothing, chunk, alpha, grads)
        ctx.save_for_backward(*grads)
        cross_entropy, divergence = sums.unbind()
        ctx.mark_non_differentiable(cross_entropy, divergence)
        return cross_entropy + alpha * divergence, cross_entropy, divergence

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total, _grad_cross_entropy, _grad_divergence):
        return (*_scaled(ctx.saved_tensors, grad_total), None, None, None, None)
