"""`--quantize int8` (modeling_attn/api/quantize.py: `quantize_int8`, used by attn translate, evaluate and serve).

Reference checks: each quantized Linear of a model equals int8 arithmetic written out by hand (weights symmetric
per tensor, inputs quantized per tensor to 7 bits with a zero point, as the dynamic linear layers of fbgemm (`x86`)
and oneDNN do), on the inputs the layer gets inside the model; the default engine is the one `int8_engine` picks for
the CPU; the commands' `--quantize int8` output equals `quantize_int8` + `translate_batch`.
On a trained model (the reverser of test_learning.py) the int8 model's probabilities stay close to float32's and it
translates the same (thresholds below, with their reasons). A model on another device than the CPU is refused.
"""

from __future__ import annotations

import re
import sys

import pytest
import sacrebleu
import torch
from tasks import exact_match, one_thread, reverse_task
from test_learning import train_reverser
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from torch import nn

from modeling_attn.api.quantize import (
    QuantizeError,
    RowwiseInt8Linear,
    describe_quantization,
    int8_engine,
    int_mm_is_exact,
    quantize_device,
    quantize_int8,
    quantize_int8_rowwise,
)
from modeling_attn.api.translation import load_model, translate_batch
from modeling_attn.cli.evaluate import main as evaluate_main
from modeling_attn.cli.translate import main as translate_main

SEVEN_BIT_ENGINES = sorted({"x86", "onednn"} & set(torch.backends.quantized.supported_engines))

# torch's int8 (these tests are about it); `--engine auto` would quantize with CTranslate2's (tests/test_engines.py)
ON_TORCH = ("--engine", "torch")


def linears(model: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def dynamic_linears(model: nn.Module) -> dict[str, nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return {name: module for name, module in model.named_modules() if isinstance(module, DynamicLinear)}


@pytest.mark.parametrize("make", [lambda: tiny_model("sdpa"), spread_tiny_rnn], ids=["transformer", "rnn"])
def test_every_linear_becomes_int8_and_the_float_model_is_left_as_it_was(make):
    model = make()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = quantize_int8(model)
    assert set(dynamic_linears(quantized)) == set(linears(model)) and len(linears(model)) > 5
    assert linears(quantized) == {} and not quantized.training
    for name, module in dynamic_linears(quantized).items():
        assert module.weight().dtype == torch.qint8, name
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(type(module) is nn.Linear for module in linears(model).values())


@pytest.mark.parametrize(
    "engine", sorted({"x86", "fbgemm", "onednn"} & set(torch.backends.quantized.supported_engines))
)
def test_an_engine_packs_the_weights_for_its_kernels_and_torch_keeps_its_own(engine):
    model = tiny_model("sdpa")
    before = torch.backends.quantized.engine
    quantized = quantize_int8(model, engine=engine)
    assert torch.backends.quantized.engine == before  # the process-wide setting is left as it was
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with torch.no_grad():
        exact = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        found = quantized(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits
    assert not torch.equal(found, exact)  # int8 arithmetic, run with the kernels packed for `engine`
    torch.testing.assert_close(found, exact, rtol=0, atol=0.05 * exact.abs().max().item())


def test_the_default_engine_is_onednn_on_a_cpu_with_amx_int8_and_torch_s_own_elsewhere(monkeypatch):
    engines = torch.backends.quantized.supported_engines
    own = torch.backends.quantized.engine
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_int8": True, "avx512_vnni": True})
    assert int8_engine() == int8_engine("auto") == ("onednn" if "onednn" in engines else own)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_vnni": True, "avx2": True})
    assert int8_engine() == int8_engine("auto") == own
    assert int8_engine("qnnpack") == "qnnpack"  # a named engine is taken as it is
    monkeypatch.undo()
    model = tiny_model("sdpa")
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():  # the default packs for the engine int8_engine() names on this machine
        assert torch.equal(quantize_int8(model)(**inputs).logits, quantize_int8(model, int8_engine())(**inputs).logits)


def test_an_engine_this_torch_lacks_is_refused_naming_the_ones_it_has():
    engines = ", ".join(torch.backends.quantized.supported_engines)
    with pytest.raises(QuantizeError, match=re.escape(f"int8 engine 'tpu8': this torch build has {engines}")):
        quantize_int8(tiny_model("sdpa"), engine="tpu8")


def int8_linear(linear: nn.Linear, stored: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamically quantized linear layer written out, with its stored int8 weight `stored` (checked here to be
    w -> round(w / s_w) in [-128, 127], s_w = max|w| / 127.5: symmetric, per tensor): input x -> round(x / s_x) + z
    in [0, 127] (7 bits: fbgemm's `reduce_range`, which keeps its 8-bit x 8-bit products from saturating 16-bit
    sums) with s_x, z from the tensor's range (0 included); output = s_x * s_w * sum((x_q - z) * w_q) + bias.

    Also returns which output rows have an input within 1e-4 of a rounding tie (x / s_x = k + 0.5): fbgemm rounds
    x * (1 / s_x) in float32, this function x / s_x in float64, so such an input may land one step apart."""
    weight = linear.weight.detach().double()
    weight_scale = stored.q_scale()
    assert weight_scale == pytest.approx(weight.abs().max().item() / 127.5, rel=1e-6) and stored.q_zero_point() == 0
    weight_q = stored.int_repr().double()
    assert ((weight / weight_scale - weight_q).abs() <= 0.5 + 1e-3).all()  # rounded to the nearest step
    low, high = min(inputs.min().item(), 0.0), max(inputs.max().item(), 0.0)
    scale = float(torch.tensor((high - low) / 127, dtype=torch.float32))
    zero_point = min(127, max(0, round(-low / scale)))
    steps = inputs.double() / scale
    inputs_q = torch.clamp(torch.round(steps) + zero_point, 0, 127)
    output = ((inputs_q - zero_point) @ weight_q.T) * (scale * weight_scale)
    near_tie = ((steps - steps.floor() - 0.5).abs() < 1e-4).any(dim=-1)
    return (output + linear.bias.double() if linear.bias is not None else output).float(), near_tie


@pytest.mark.parametrize("engine", SEVEN_BIT_ENGINES)  # qnnpack quantizes inputs to 8 bits and rounds differently
@pytest.mark.parametrize("make", [lambda: tiny_model("sdpa"), spread_tiny_rnn], ids=["transformer", "rnn"])
def test_each_int8_layer_equals_int8_arithmetic_written_out(make, engine):
    model = make()
    quantized = quantize_int8(model, engine=engine)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        module.register_forward_pre_hook(lambda module, args, name=name: seen.__setitem__(name, args[0]))
        for name, module in linears(model).items()
    ]  # each layer runs once in this forward
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    for hook in hooks:
        hook.remove()
    assert set(seen) == set(linears(model))
    float_layers, int8_layers = linears(model), dynamic_linears(quantized)
    rows = ties = 0
    for name, inputs in seen.items():
        with torch.no_grad():
            expected, near_tie = int8_linear(float_layers[name], int8_layers[name].weight(), inputs)
            found = int8_layers[name](inputs)
            exact = float_layers[name](inputs)
        # the same integer sums, scaled in float32 here and in float64 there: ~1e-7 relative
        keep = ~near_tie
        torch.testing.assert_close(found[keep], expected[keep], rtol=1e-5, atol=1e-5 * exact.abs().max().item())
        assert not torch.equal(found, exact), name  # it is quantized
        rows, ties = rows + keep.numel(), ties + int(near_tie.sum())
    assert ties <= 0.02 * rows, (ties, rows)  # the rows left out are few


def test_every_linear_becomes_rowwise_int8_and_the_float_model_is_left_as_it_was():
    for model in (tiny_model("sdpa"), spread_tiny_rnn()):
        before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        quantized = quantize_int8_rowwise(model)
        rowwise = {name for name, module in quantized.named_modules() if isinstance(module, RowwiseInt8Linear)}
        assert rowwise == set(linears(model)) and len(rowwise) > 5 and linears(quantized) == {}
        assert not quantized.training
        assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("make", [lambda: tiny_model("sdpa"), spread_tiny_rnn], ids=["transformer", "rnn"])
def test_each_rowwise_int8_layer_equals_its_arithmetic_written_out(make):
    """Weights: w -> round(w / s_o) with s_o = max|w[o, :]| / 127 per output row o; inputs: x -> round(x / s_r) with
    s_r = max|x[r, :]| / 127 per input row r; output = s_r * s_o * sum(x_q * w_q) + bias, the sums exact (int64
    here, int32 in torch._int_mm): equal to ~1e-6 relative, the float32 scaling of the same integers."""
    model = make()
    quantized = quantize_int8_rowwise(model)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        module.register_forward_pre_hook(lambda module, args, name=name: seen.__setitem__(name, args[0]))
        for name, module in linears(model).items()
    ]
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    for hook in hooks:
        hook.remove()
    layers = dict(quantized.named_modules())
    for name, inputs in seen.items():
        linear = linears(model)[name]
        weight, rows = linear.weight.detach().double(), inputs.reshape(-1, inputs.shape[-1]).double()
        weight_scale = weight.abs().amax(dim=1) / 127
        weight_scale[weight_scale == 0] = 1  # a row of zeros (the tied padding embedding): zeros too
        row_scale = rows.abs().amax(dim=1, keepdim=True) / 127
        row_scale[row_scale == 0] = 1  # a row of zeros (a padded position): zeros, whatever its scale
        sums = torch.round(rows / row_scale) @ torch.round(weight / weight_scale[:, None]).T
        expected = sums * row_scale * weight_scale + (0 if linear.bias is None else linear.bias.double())
        with torch.no_grad():
            found = layers[name](inputs).reshape(-1, linear.out_features).double()
        torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        assert not torch.equal(found.float(), linear(inputs).reshape(found.shape)), name  # it is quantized


def saturating_int_mm(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """An s8s8 gemm as oneDNN computes it without VNNI: rows + 128 as u8, products summed in pairs in int16 with
    saturation (vpmaddubsw), then the 128 * column sums taken back off."""
    shifted, weight = rows.long() + 128, weight.long()
    products = shifted[:, :, None] * weight[None, :, :]  # [rows, in, out]
    pairs = products[:, 0::2] + torch.nn.functional.pad(products[:, 1::2], (0, 0, 0, products.shape[1] % 2))
    sums = pairs.clamp(-32768, 32767).sum(dim=1) - 128 * weight.sum(dim=0)
    return sums.int()


def test_the_int_mm_check_finds_a_saturating_kernel_and_passes_an_exact_one():
    exact = lambda rows, weight: (rows.long() @ weight.long()).int()  # noqa: E731
    assert int_mm_is_exact(24, 8, exact)
    assert not int_mm_is_exact(24, 8, saturating_int_mm)
    small = torch.tensor([[1, -2, 3]], dtype=torch.int8), torch.tensor([[4], [5], [-6]], dtype=torch.int8)
    assert torch.equal(saturating_int_mm(*small), exact(*small))  # it is the same arithmetic where nothing saturates


@pytest.mark.parametrize("exact_int_mm", [None, False], ids=["as this CPU allows", "float32 sums"])
def test_a_rowwise_int8_linear_on_either_kernel_equals_its_arithmetic_written_out(exact_int_mm):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    inputs = torch.randn(7, 96) * torch.logspace(-2, 2, 7)[:, None]
    layer = RowwiseInt8Linear(linear, exact_int_mm=exact_int_mm)
    assert layer.uses_int_mm == (int_mm_is_exact(96, 40) if exact_int_mm is None else exact_int_mm)
    weight, rows = linear.weight.detach().double(), inputs.double()
    weight_scale = weight.abs().amax(dim=1, keepdim=True) / 127
    row_scale = rows.abs().amax(dim=1, keepdim=True) / 127
    sums = torch.round(rows / row_scale) @ torch.round(weight / weight_scale).T
    expected = sums * row_scale * weight_scale.T + linear.bias.detach().double()
    with torch.no_grad():
        found = layer(inputs).double()
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_a_rowwise_int8_row_is_the_same_in_any_batch_and_a_per_tensor_one_is_not():
    """One row computed alone, and in a batch beside a row of 100x its range: bit for bit the same with int8_rowwise;
    with per-tensor input scales (int8) the other row's range coarsens this row's steps 100-fold."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    row, loud = torch.randn(1, 64), 100 * torch.randn(1, 64)
    rowwise = RowwiseInt8Linear(linear)
    per_tensor = dynamic_linears(quantize_int8(nn.Sequential(linear)))["0"]
    with torch.no_grad():
        assert torch.equal(rowwise(torch.cat([row, loud]))[:1], rowwise(row))
        assert not torch.allclose(per_tensor(torch.cat([row, loud]))[:1], per_tensor(row), atol=1e-3)


def test_the_kernels_are_named():
    assert describe_quantization(None) is None
    assert describe_quantization("int8", "x86") == "int8 (x86 kernels)"
    assert describe_quantization("int8") == f"int8 ({int8_engine()} kernels)"
    assert describe_quantization("int8_rowwise") == (
        "int8_rowwise (torch._int_mm)" if int_mm_is_exact() else "int8_rowwise (float32 matmul: inexact torch._int_mm)"
    )


@pytest.fixture(scope="module")
def reverser():
    """The Transformer reverser of test_learning.py (500 steps, >= 99% exact greedy): float, and a quantized copy
    per --quantize choice."""
    with one_thread():
        model = train_reverser()
    return model, {"int8": quantize_int8(model), "int8_rowwise": quantize_int8_rowwise(model)}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int8_rowwise"])
def test_int8_probabilities_stay_close_to_float32_on_a_trained_model(reverser, method):
    """Tolerances: int8 weights (a step of max|w| / 127.5) and 7-bit inputs (a step of range / 127) make each
    product off by ~0.5-1% of its scale; through 2 + 2 layers and the output layer this moves a probability by well
    under 1% at most positions (measured: mean 4e-4, 99th percentile 4e-3); where two tokens are close to a tie it
    can move more (measured max 0.12). The bounds are ~3x those measurements."""
    model, quantized = reverser[0], reverser[1][method]
    input_ids, attention_mask, labels = reverse_task(500, torch.Generator().manual_seed(123))
    decoder_input_ids = torch.cat([torch.ones_like(labels[:, :1]), labels[:, :-1].clamp(min=0)], dim=1)
    with torch.no_grad(), one_thread():
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        float_probs, int8_probs = model(**inputs).logits.softmax(-1), quantized(**inputs).logits.softmax(-1)
    difference = (float_probs - int8_probs).abs().amax(dim=-1)[labels != -100]
    assert difference.mean() <= 2e-3 and difference.quantile(0.99) <= 1.5e-2 and difference.max() <= 0.4
    assert difference.max() > 0  # quantized, not the float model again
    agree = float_probs.argmax(-1) == int8_probs.argmax(-1)
    assert agree[labels != -100].float().mean() >= 0.995


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int8_rowwise"])
def test_int8_translates_as_float32_on_a_trained_model(reverser, method):
    """Threshold: >= 98% of 500 held-out sentences translated identically (measured: 100%), and the int8 model
    still >= 99% exact, as the float model must be (test_learning.py)."""
    model, quantized = reverser[0], reverser[1][method]
    input_ids, attention_mask, labels = reverse_task(500, torch.Generator().manual_seed(123))
    with torch.no_grad(), one_thread():
        float_out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=2)
        int8_out = quantized.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=2)
    same = (float_out == int8_out).all(dim=1).float().mean().item() if float_out.shape == int8_out.shape else 0.0
    assert same >= 0.98
    assert exact_match(int8_out, labels) >= 0.99


@pytest.mark.slow
def test_int8_rowwise_scores_a_sentence_nearly_the_same_in_any_batch(reverser):
    """Beam search over 64 held-out sentences in one padded batch, and each alone: the sentence scores differ by
    float32's own batch noise, enlarged by an occasional rounding step (measured: max 3e-6; float32 2e-8); per-tensor
    int8 moved them by 1e-3 (its input scale spans the batch). Bound: 1e-4."""
    quantized = reverser[1]["int8_rowwise"]
    input_ids, attention_mask, _ = reverse_task(64, torch.Generator().manual_seed(7))
    settings = dict(max_new_tokens=10, num_beams=2, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad(), one_thread():
        together = quantized.generate(input_ids, attention_mask=attention_mask, **settings).sequences_scores
        for row, length in enumerate(attention_mask.sum(dim=1).tolist()):
            alone = quantized.generate(input_ids[row : row + 1, :length], **settings).sequences_scores[0]
            assert abs(alone - together[row]) <= 1e-4, (row, alone, together[row])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from test_serve import save_model

    return save_model(tmp_path_factory.mktemp("quantize-model"))


def test_the_commands_quantize_with_quantize_int8(model_dir, tmp_path, capsys):
    from test_serve import sentences

    lines = sentences(12, seed=9)
    model, tokenizer = load_model(str(model_dir), "cpu")
    expected = translate_batch(quantize_int8(model), tokenizer, lines)[0]
    source, references = tmp_path / "source.txt", tmp_path / "references.txt"
    source.write_text("".join(f"{line}\n" for line in lines))
    references.write_text("".join(f"{line}\n" for line in reversed(lines)))
    capsys.readouterr()
    assert (
        translate_main(
            ["--model", str(model_dir), "--input", str(source), "--quantize", "int8", "--no_progress", *ON_TORCH]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == expected
    assert (
        evaluate_main(
            [
                "--model",
                str(model_dir),
                "--sources_file",
                str(source),
                "--references_file",
                str(references),
                "--quantize",
                "int8",
                "--no_progress",
                *ON_TORCH,
                "--hypotheses",
                str(tmp_path / "hypotheses.txt"),
            ]
        )
        == 0
    )
    assert (tmp_path / "hypotheses.txt").read_text().splitlines() == expected
    bleu = sacrebleu.corpus_bleu(expected, [list(reversed(lines))]).score
    assert f'"bleu": {bleu}' in capsys.readouterr().out
    for engine in SEVEN_BIT_ENGINES:  # --int8_engine packs for the engine named
        expected = translate_batch(quantize_int8(model, engine=engine), tokenizer, lines)[0]
        argv = ["--model", str(model_dir), "--input", str(source), "--quantize", "int8", "--int8_engine", engine]
        assert translate_main([*argv, "--no_progress"]) == 0
        assert capsys.readouterr().out.splitlines() == expected
    expected = translate_batch(quantize_int8_rowwise(model), tokenizer, lines)[0]
    argv = ["--model", str(model_dir), "--input", str(source), "--quantize", "int8_rowwise", "--no_progress"]
    assert translate_main(argv) == 0 and capsys.readouterr().out.splitlines() == expected


def test_an_int8_engine_without_quantize_int8_is_refused_in_one_line(model_dir, capsys):
    for main, name in ((translate_main, "translate"), (evaluate_main, "evaluate")):
        capsys.readouterr()
        argv = ["--model", str(model_dir), "--int8_engine", "x86"] + (["the cat"] if name == "translate" else [])
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"attn {name}: error: --int8_engine x86: picks the kernels of --quantize int8, which is not given; add "
            f"--quantize int8 or drop --int8_engine (see attn {name} --help)\n"
        )


def test_a_model_or_device_other_than_the_cpu_is_refused_in_one_line(model_dir, capsys):
    with torch.device("meta"):
        on_meta = tiny_model("sdpa")
    with pytest.raises(QuantizeError, match=r"^--quantize int8 runs on the CPU only .*; the model is on meta"):
        quantize_int8(on_meta)
    assert quantize_device(None, "int8") == "cpu" and quantize_device(None, None) is None
    assert quantize_device("cpu", "int8") == "cpu" and quantize_device("cuda", None) == "cuda"
    for main, name in ((translate_main, "translate"), (evaluate_main, "evaluate")):
        capsys.readouterr()
        argv = ["--model", str(model_dir), "--device", "cuda:0", "--quantize", "int8"]
        assert main(argv + (["the cat"] if name == "translate" else [])) == 2
        error = capsys.readouterr().err
        assert error == (
            f"attn {name}: error: --quantize int8 runs on the CPU only (int8 kernels), not on "
            f"--device cuda:0; drop --quantize, or use --device cpu (see attn {name} --help)\n"
        )


def test_torch_without_quantize_dynamic_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)  # what a torch that removed it gives
    with pytest.raises(QuantizeError, match=r"torch .* has no torch\.ao\.quantization\.quantize_dynamic"):
        quantize_int8(tiny_model("sdpa"))
