"""The Transformer against independent references: torch.nn.Transformer, itself uncached, a plain decoding loop."""

from __future__ import annotations

import json
import math

import pytest
import torch
from isolation import run_isolated
from tiny import padded_batch, tiny_config, tiny_model
from transformers import AutoModel, AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache

from modeling_attn import AttnTransformerForConditionalGeneration, AttnTransformerModel
from modeling_attn.modeling_transformer import sinusoid_table


def _copy_attention(ours, theirs: torch.nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.load_state_dict(ours.out_proj.state_dict())


def _reference_transformer(model: AttnTransformerModel) -> torch.nn.Transformer:
    """torch.nn.Transformer with our weights copied in."""
    config = model.config
    reference = torch.nn.Transformer(
        d_model=config.d_model,
        nhead=config.num_heads,
        num_encoder_layers=config.encoder_layers,
        num_decoder_layers=config.decoder_layers,
        dim_feedforward=config.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=config.norm_first,
        activation=config.activation_function,
    ).eval()
    reference.encoder.use_nested_tensor = False  # keep padded encoder rows (the nested fast path zeroes them)
    with torch.no_grad():
        for ours, theirs in zip(model.encoder.layers, reference.encoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            theirs.norm1.load_state_dict(ours.self_attn_layer_norm.state_dict())
            theirs.norm2.load_state_dict(ours.final_layer_norm.state_dict())
            theirs.linear1.load_state_dict(ours.fc1.state_dict())
            theirs.linear2.load_state_dict(ours.fc2.state_dict())
        for ours, theirs in zip(model.decoder.layers, reference.decoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            _copy_attention(ours.encoder_attn, theirs.multihead_attn)
            theirs.norm1.load_state_dict(ours.self_attn_layer_norm.state_dict())
            theirs.norm2.load_state_dict(ours.encoder_attn_layer_norm.state_dict())
            theirs.norm3.load_state_dict(ours.final_layer_norm.state_dict())
            theirs.linear1.load_state_dict(ours.fc1.state_dict())
            theirs.linear2.load_state_dict(ours.fc2.state_dict())
        if config.norm_first:
            reference.encoder.norm.load_state_dict(model.encoder.layer_norm.state_dict())
            reference.decoder.norm.load_state_dict(model.decoder.layer_norm.state_dict())
        else:
            # nn.Transformer always ends each stack with a LayerNorm; the post-LN paper model does not
            # (its last sub-layer already ends in one), so the reference drops it.
            reference.encoder.norm = None
            reference.decoder.norm = None
    return reference


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "relu"), (True, "relu"), (False, "gelu")])
def test_matches_torch_nn_transformer(norm_first, activation):
    torch.manual_seed(0)
    model = AttnTransformerModel(tiny_config(norm_first=norm_first, activation_function=activation)).eval()
    for parameter in model.parameters():  # non-trivial LayerNorm and bias values
        parameter.data.add_(torch.randn_like(parameter) * 0.1)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    reference = _reference_transformer(model)

    # Embeddings computed here, independently of the model: E * sqrt(d_model) + PE (Sec. 3.4, 3.5).
    table = sinusoid_table(16, 16)
    embed = model.shared.weight
    source = embed[input_ids] * math.sqrt(16) + table[: input_ids.shape[1]]
    target = embed[decoder_input_ids] * math.sqrt(16) + table[: decoder_input_ids.shape[1]]
    target_length = decoder_input_ids.shape[1]
    with torch.no_grad():
        expected = reference(
            source,
            target,
            tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(target_length),
            src_key_padding_mask=attention_mask == 0,
            memory_key_padding_mask=attention_mask == 0,
            tgt_is_causal=True,
        )
        ours = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(ours.last_hidden_state, expected, atol=1e-5, rtol=1e-5)


def test_sinusoid_table_hand_computed():
    table = sinusoid_table(3, 8)
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))
    for pos in range(3):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    halves = sinusoid_table(3, 8, "halves")
    assert torch.equal(halves[:, :4], table[:, 0::2]) and torch.equal(halves[:, 4:], table[:, 1::2])


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"positional_layout": "halves"}])
def test_eager_and_sdpa_agree(overrides):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    eager = tiny_model("eager", **overrides)
    sdpa = tiny_model("sdpa", **overrides)
    sdpa.load_state_dict(eager.state_dict())
    with torch.no_grad():
        expected = eager(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        actual = sdpa(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_set_attn_implementation_switches_backend():
    model = tiny_model("eager")
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    assert model.model.encoder.config._attn_implementation == "sdpa"


def test_attention_weights_sum_to_one_and_are_zero_on_padding():
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    model = tiny_model("eager")
    with torch.no_grad():
        out = model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
        )
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == 2 and len(out.cross_attentions) == 2
    padding = attention_mask == 0  # (B, S)
    for weights in out.encoder_attentions + out.cross_attentions:  # (B, H, T, S)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert torch.all(
            weights.permute(0, 2, 1, 3)[padding[:, None, None, :].expand_as(weights.permute(0, 2, 1, 3))] == 0
        )
    for weights in out.decoder_attentions:  # causal: nothing above the diagonal
        assert torch.all(weights.triu(diagonal=1) == 0)


def test_cached_decoding_equals_full_forward():
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    model = tiny_model("eager")
    with torch.no_grad():
        full = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        steps = []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                attention_mask=attention_mask,
                encoder_outputs=encoder_outputs,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_keys_are_computed_once_per_generation():
    input_ids, attention_mask, _ = padded_batch()
    model = tiny_model("sdpa")
    calls = []
    for layer in model.model.decoder.layers:
        layer.encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, min_new_tokens=6)
    assert len(calls) == model.config.decoder_layers


def _greedy_reference(model, input_ids, attention_mask, steps):
    """Plain greedy decoding: re-run the whole decoder on the prefix each step, take the argmax."""
    config, eos_token_id = model.config, model.generation_config.eos_token_id
    prefix = torch.full((input_ids.shape[0], 1), config.decoder_start_token_id)
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(steps):
        logits = model(input_ids, attention_mask=attention_mask, decoder_input_ids=prefix).logits[:, -1]
        next_token = logits.argmax(-1).masked_fill(finished, config.pad_token_id)
        prefix = torch.cat([prefix, next_token[:, None]], dim=1)
        finished |= next_token == eos_token_id
        if finished.all():
            break
    return prefix


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_generate_greedy_equals_reference_loop(attn_implementation):
    model = tiny_model(attn_implementation, seed=3)
    input_ids, attention_mask, _ = padded_batch(seed=1, batch=4)
    with torch.no_grad():
        expected = _greedy_reference(model, input_ids, attention_mask, steps=12)
        generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False)
    assert torch.equal(generated, expected)


def test_generate_with_eos_stops_and_pads():
    model = tiny_model("sdpa", seed=3)
    input_ids, attention_mask, _ = padded_batch(seed=1, batch=4)
    with torch.no_grad():
        first = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=3)[:, 2]
        model.generation_config.eos_token_id = int(first[0])  # make row 0 stop after its second token
        expected = _greedy_reference(model, input_ids, attention_mask, steps=12)
        generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12)
    assert torch.equal(generated, expected)
    assert generated[0, 3:].eq(model.config.pad_token_id).all()


def test_beam_search_and_sampling_run_and_beam_one_is_greedy():
    input_ids, attention_mask, _ = padded_batch()
    model = tiny_model("sdpa", seed=3)
    with torch.no_grad():
        greedy = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8)
        beam1 = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=1)
        beam4 = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=8,
            num_beams=4,
            length_penalty=0.6,
            return_dict_in_generate=True,
            output_scores=True,
        )
        again = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=4, length_penalty=0.6
        )
        torch.manual_seed(0)
        sampled = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=True, top_k=5)
    assert torch.equal(greedy, beam1)
    assert torch.equal(beam4.sequences, again)
    assert sampled.shape[0] == input_ids.shape[0]
    # The best beam's score is its log-probability under a full forward pass, length-normalised (length penalty 0.6).
    sequences = beam4.sequences
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, decoder_input_ids=sequences[:, :-1]).logits
    log_probs = logits.log_softmax(-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    generated_length = sequences.shape[1] - 1
    expected = log_probs.sum(-1) / (generated_length**0.6)
    torch.testing.assert_close(beam4.sequences_scores, expected, atol=1e-4, rtol=1e-4)


def test_beam_search_reorders_only_the_self_attention_cache(monkeypatch):
    """The beams of a sentence share its encoder output, so skipping the cross-attention reordering (a speed-up)
    must give exactly what transformers' default, reordering both caches, gives."""
    input_ids, attention_mask, _ = padded_batch()
    model = tiny_model("sdpa", seed=3)
    settings = dict(attention_mask=attention_mask, max_new_tokens=8, num_beams=4, return_dict_in_generate=True)
    reorders = []  # one per cache layer reordered (our _reorder_cache reorders layer by layer)
    reorder = DynamicLayer.reorder_cache
    monkeypatch.setattr(
        DynamicLayer, "reorder_cache", lambda layer, beam_idx: (reorders.append(1), reorder(layer, beam_idx))
    )
    with torch.no_grad():
        ours = model.generate(input_ids, output_scores=True, **settings)
        ours_reorders = len(reorders)
        monkeypatch.setattr(
            type(model), "_reorder_cache", lambda self, cache, beam_idx: (cache.reorder_cache(beam_idx), cache)[1]
        )
        full = model.generate(input_ids, output_scores=True, **settings)
    assert len(reorders) - ours_reorders == 2 * ours_reorders > 0  # the default reorders both caches at each step
    assert torch.equal(ours.sequences, full.sequences)
    torch.testing.assert_close(ours.sequences_scores, full.sequences_scores)


def test_save_pretrained_round_trip_is_bitwise_and_keeps_ties(tmp_path):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    model = tiny_model("sdpa")
    model.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" in files and not any(name.endswith((".bin", ".pt", ".pth")) for name in files)
    assert {"configuration_transformer.py", "modeling_transformer.py", "attention.py", "masks.py"} <= set(files)
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_transformer.AttnTransformerConfig",
        "AutoModel": "modeling_transformer.AttnTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_transformer.AttnTransformerForConditionalGeneration",
    }
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is AttnTransformerForConditionalGeneration
    shared = reloaded.model.shared.weight
    assert reloaded.lm_head.weight is shared
    assert (
        reloaded.model.encoder.embed_tokens.weight is shared and reloaded.model.decoder.embed_tokens.weight is shared
    )
    with torch.no_grad():
        kwargs = dict(attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        assert torch.equal(reloaded(input_ids, **kwargs).logits, model(input_ids, **kwargs).logits)
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is AttnTransformerModel


def test_separate_vocabularies_round_trip(tmp_path):
    model = tiny_model("sdpa", share_encoder_decoder_embeddings=False, decoder_vocab_size=57)
    assert model.model.encoder.embed_tokens.weight.shape == (99, 16)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert model.lm_head.weight.shape == (57, 16)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert reloaded.lm_head.weight is reloaded.model.decoder.embed_tokens.weight
    input_ids = torch.randint(3, 99, (2, 6))
    decoder_input_ids = torch.randint(3, 57, (2, 4))
    with torch.no_grad():
        assert torch.equal(
            reloaded(input_ids, decoder_input_ids=decoder_input_ids).logits,
            model(input_ids, decoder_input_ids=decoder_input_ids).logits,
        )


@pytest.mark.parametrize("share", [False, True])
def test_untied_output_projection_round_trip(tmp_path, share):
    model = tiny_model("sdpa", share_encoder_decoder_embeddings=share, tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.decoder.embed_tokens.weight
    # Sharing source and target embeddings does not depend on tying the output projection.
    assert (model.model.encoder.embed_tokens.weight is model.model.decoder.embed_tokens.weight) == share
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert (reloaded.model.encoder.embed_tokens.weight is reloaded.model.decoder.embed_tokens.weight) == share
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_remote_code_loads_without_the_package(tmp_path):
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    model = tiny_model("sdpa")
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    result = run_isolated(
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(checkpoint)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        with torch.no_grad():
            logits = model(torch.tensor({input_ids.tolist()}), attention_mask=torch.tensor({attention_mask.tolist()}),
                           decoder_input_ids=torch.tensor({decoder_input_ids.tolist()})).logits
        print(json.dumps({{"logits": logits.tolist(), "tied": model.lm_head.weight is model.model.shared.weight}}))
        """,
        cwd=tmp_path,
    )
    assert result["tied"]
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=1e-6, rtol=0)


def test_loss_ignores_padding_and_uses_num_items_in_batch():
    input_ids, attention_mask, labels = padded_batch()
    labels = labels.clone()
    labels[1, 3:] = -100
    model = tiny_model("sdpa")
    with torch.no_grad():
        out = model(input_ids, attention_mask=attention_mask, labels=labels)
        log_probs = out.logits.log_softmax(-1)
        mask = labels != -100
        per_token = -log_probs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)[mask]
        assert out.loss.item() == pytest.approx(per_token.mean().item(), rel=1e-5)
        # Gradient accumulation: two micro-batches normalised by the whole batch's token count sum to the full loss.
        total = mask.sum()
        halves = [
            model(
                input_ids[rows], attention_mask=attention_mask[rows], labels=labels[rows], num_items_in_batch=total
            ).loss
            for rows in (slice(0, 1), slice(1, 3))
        ]
        assert (halves[0] + halves[1]).item() == pytest.approx(out.loss.item(), rel=1e-5)


def test_decoder_inputs_are_labels_shifted_right():
    model = tiny_model("sdpa")
    labels = torch.tensor([[5, 6, 2, -100]])
    assert model.prepare_decoder_input_ids_from_labels(labels).tolist() == [[1, 5, 6, 2]]


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask, labels = padded_batch()
    model = tiny_model("sdpa").train()
    reference = tiny_model("sdpa").train()
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing
    for m in (model, reference):
        m(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_hidden_states_are_returned_per_layer():
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    model = tiny_model("sdpa")
    with torch.no_grad():
        out = model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_hidden_states=True
        )
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 3  # embeddings + 2 layers
    assert torch.equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


def test_no_split_modules_names_the_layer_classes():
    model = tiny_model()
    assert model._no_split_modules == {"AttnTransformerEncoderLayer", "AttnTransformerDecoderLayer"}
    layer_classes = {type(m).__name__ for m in model.modules()}
    assert model._no_split_modules <= layer_classes
