"""The fast CPU training step (issue 41): in training the attention's projections run on real tokens only
(`AttnTransformerEncoderLayer.attention_rows`), with the same loss and gradients as on every position, and
evaluation still projects every position; bench/cpu_mfu.py, the step's share of torch.mm's peak, runs."""

from __future__ import annotations

import pytest
import torch
from test_padding_free import ragged_labels
from tiny import padded_batch, tiny_model

from modeling_attn.inputs import labelled_prefix
from modeling_attn.modeling_transformer import AttnTransformerEncoderLayer


def loss_and_gradients(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    input_ids, attention_mask, labels = batch
    model.zero_grad(set_to_none=True)
    loss = model(input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True, smoothing=0.1).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def ragged_batch():
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    return input_ids, attention_mask, ragged_labels(decoder_input_ids)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("norm_first", [False, True])
def test_projections_on_real_tokens_give_the_loss_and_gradients_of_all_positions(monkeypatch, norm_first, dropout):
    """With dropout too: its masks are drawn over the same (B, L, E) tensors either way, so one seed gives the same
    masks, and the same loss and gradients up to float rounding."""
    model = tiny_model(
        norm_first=norm_first, dropout=dropout, attention_dropout=dropout, activation_dropout=dropout
    ).train()
    batch = ragged_batch()
    torch.manual_seed(0)
    loss, gradients = loss_and_gradients(model, batch)
    monkeypatch.setattr(AttnTransformerEncoderLayer, "attention_rows", lambda self, rows: None)
    torch.manual_seed(0)
    full_loss, full_gradients = loss_and_gradients(model, batch)
    torch.testing.assert_close(loss, full_loss)
    assert gradients.keys() == full_gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, full_gradients[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("training", [True, False])
def test_the_projections_see_real_tokens_in_training_and_every_position_in_evaluation(training):
    model = tiny_model().train(training)
    input_ids, attention_mask, labels = ragged_batch()
    seen = {}

    def record(name):
        def hook(module, args, output) -> None:
            seen[name] = args[0].shape

        return hook

    for name, module in model.named_modules():
        if name.endswith(("self_attn.q_proj", "encoder_attn.k_proj", "encoder_attn.q_proj")):
            module.register_forward_hook(record(name))
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask, labels=labels, skip_logits=True)
    source, target = int(attention_mask.sum()), int(labelled_prefix(labels).sum())  # target: up to the last label
    positions = {"encoder": input_ids.numel(), "decoder": labels.numel()}
    for name, shape in seen.items():
        if not training:
            source_side = name.startswith("model.encoder") or "encoder_attn.k_proj" in name
            assert shape[:2] == (input_ids if source_side else labels).shape, name
        elif name.startswith("model.encoder") or "encoder_attn.k_proj" in name:
            assert shape == (source, model.config.d_model), name
        else:
            assert shape == (target, model.config.d_model), name
    assert len(seen) == 3 * model.config.decoder_layers + model.config.encoder_layers
    assert source < positions["encoder"] and target < positions["decoder"]


def test_the_cpu_mfu_bench_reports_each_step(tmp_path):
    """bench/cpu_mfu.py on the tiny preset: every step measured, its share of the mm peak and its aten op count; the
    ablation rows run the attention projections on every position, with more aten ops (no row picking), and the
    output loss in the smaller chunks of before, the module's chunk restored afterwards."""
    from bench import cpu_mfu as module

    report = module.main(
        ["--output", str(tmp_path / "mfu"), "--preset", "tiny", "--batch_size", "4", "--threads", "1", "--reps", "1"]
        + ["--mm_size", "64"]
        + ["--mm_products", "4", "--optimizers", "fused", "for-loop", "--every_position", "--small_loss_chunks"]
    )
    ablation = "fused, attention on every position"
    small_chunks = "fused, loss in 2M-logit chunks"
    assert report["step"] == "fused" and list(report["steps"]) == ["fused", "for-loop", ablation, small_chunks]
    assert module.loss.LOSS_CHUNK_LOGITS == 6 << 20 != module.SMALL_LOSS_CHUNK_LOGITS
    assert all(
        entry["share_of_mm_peak"] > 0 and entry["share_of_mm_peak_medians"] > 0 and entry["aten_ops"] > 0
        for entry in report["steps"].values()
    )
    assert len(report["mm_round_cpu_seconds"]) == 1
    assert report["steps"][ablation]["aten_ops"] < report["steps"]["fused"]["aten_ops"]
