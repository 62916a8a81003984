"""The RNN encoder-decoder with attention (modeling_attn/modeling_rnn.py): alignments, batch invariance,
step-by-step decoding, generate() against reference loops, save/load and remote code, a task it must
learn, and bad input."""

import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from isolation import run_isolated
from safetensors.torch import load_file
from tasks import exact_match, one_thread, reverse_task, train_rnn_reverser
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from modeling_attn import (
    AttnRNNCache,
    AttnRNNConfig,
    AttnRNNForConditionalGeneration,
    AttnRNNModel,
)
from modeling_attn.api.presets import load_preset

# Every RNN type, decoder style, score function and input feeding setting appears at least once.
VARIANTS = [
    dict(rnn_type="gru", decoder_style="bahdanau", attention_score="additive"),
    dict(rnn_type="lstm", decoder_style="bahdanau", attention_score="general"),
    dict(rnn_type="gru", decoder_style="luong", attention_score="dot"),
    dict(rnn_type="lstm", decoder_style="luong", attention_score="scaled_dot", input_feeding=True),
    dict(rnn_type="gru", decoder_style="luong", attention_score="additive", input_feeding=True),
    dict(rnn_type="lstm", decoder_style="luong", attention_score="general"),
]
IDS = ["-".join(str(v) for v in variant.values()) for variant in VARIANTS]
VOCAB = 12  # a small target vocabulary makes decoding paths cross and beams compete
PAD, START, EOS = 0, 1, 2


def make_model(**overrides) -> AttnRNNForConditionalGeneration:
    """The rnn-tiny preset in eval mode, with weights N(0, 0.6) instead of the U(-0.1, 0.1) init: the output
    distributions are then peaked, so greedy and beam search take different, non-trivial paths."""
    torch.manual_seed(0)
    model = AttnRNNForConditionalGeneration(load_preset("rnn-tiny", vocab_size=VOCAB, **overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.6)
    return model


def source_batch():
    """Three sources of lengths 7, 5 and 3, right-padded."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (3, 7), generator=generator)
    attention_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    return input_ids.masked_fill(attention_mask == 0, PAD), attention_mask


def sequence_log_probs(model, input_ids, attention_mask, sequences):
    """log p(sequence | source) by one teacher-forced forward pass: the sum over generated tokens up to and
    including the first EOS (beam search fills the positions after it)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences[:, :-1]).logits
    token_log_probs = logits.log_softmax(-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)  # (B, T)
    is_eos = sequences[:, 1:] == EOS
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    return token_log_probs.masked_fill(after_eos, 0.0).sum(-1)


# -- forward: alignments, batch invariance, loss ---------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_alignments_sum_to_one_over_real_tokens(variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(3, VOCAB, (3, 4))
    outputs = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    assert outputs.logits.shape == (3, 4, VOCAB)
    (alignments,) = outputs.cross_attentions  # one attention per decoder
    assert alignments.shape == (3, 4, 7)  # (B, T, S)
    torch.testing.assert_close(alignments.sum(-1), torch.ones(3, 4))
    assert (alignments.masked_select(attention_mask[:, None, :] == 0) == 0).all()
    assert (
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).cross_attentions
        is None
    )


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_sentence_alone_equals_sentence_in_padded_batch(variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    labels = torch.randint(3, VOCAB, (3, 5))
    labels[1, 3:] = -100  # target padding too
    batched = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    for row in range(3):
        source_length, target_length = int(attention_mask[row].sum()), int((labels[row] != -100).sum())
        alone = model(
            input_ids=input_ids[row : row + 1, :source_length], labels=labels[row : row + 1, :target_length]
        ).logits
        torch.testing.assert_close(batched[row : row + 1, :target_length], alone, rtol=0, atol=1e-5)


def test_loss_is_token_mean_or_divided_by_num_items_in_batch():
    model = make_model()
    input_ids, attention_mask = source_batch()
    labels = torch.randint(3, VOCAB, (3, 5))
    labels[2, 2:] = -100
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    total = torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten(), reduction="sum")
    torch.testing.assert_close(outputs.loss, total / 12)
    accumulated = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=30)
    torch.testing.assert_close(accumulated.loss, total / 30)


def test_trainer_runs_with_gradient_accumulation(tmp_path):
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model = make_model().train()
    input_ids, attention_mask = source_batch()
    labels = torch.randint(3, VOCAB, (3, 4)).masked_fill(
        torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 1]]) == 1, -100
    )
    rows = [
        dict(input_ids=input_ids[i % 3], attention_mask=attention_mask[i % 3], labels=labels[i % 3]) for i in range(8)
    ]
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=Dataset.from_list(rows).with_format("torch"))
    assert trainer.model_accepts_loss_kwargs  # forward divides by num_items_in_batch itself
    result = trainer.train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))


# -- decoding step by step and generate() -----------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_step_by_step_decoding_with_cache_equals_full_forward(variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(3, VOCAB, (3, 5))
    full = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache, steps, alignments = None, [], []
    for position in range(5):
        outputs = model(
            attention_mask=attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=cache,
            decoder_input_ids=decoder_input_ids[:, position : position + 1],
            use_cache=True,
            output_attentions=True,
        )
        cache = outputs.past_key_values
        steps.append(outputs.logits)
        alignments.append(outputs.cross_attentions[0])
    assert isinstance(cache, AttnRNNCache) and cache.get_seq_length() == 5
    torch.testing.assert_close(torch.cat(steps, 1), full.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(alignments, 1), full.cross_attentions[0], rtol=0, atol=1e-5)


def reference_greedy(model, input_ids, attention_mask, max_new_tokens):
    """Greedy decoding without a cache: the whole prefix is decoded again at every step."""
    sequences = torch.full((input_ids.shape[0], 1), START)
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences).logits
        next_tokens = logits[:, -1].argmax(-1).masked_fill(finished, PAD)
        sequences = torch.cat([sequences, next_tokens[:, None]], dim=1)
        finished |= next_tokens == EOS
        if finished.all():
            break
    return sequences


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_generate_greedy_equals_reference_loop(variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    expected = reference_greedy(model, input_ids, attention_mask, max_new_tokens=8)
    generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(generated, expected)
    uncached = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False, use_cache=False
    )
    assert torch.equal(uncached, expected)
    one_beam = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=1)
    assert torch.equal(one_beam, expected)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_beam_search_scores_equal_recomputed_sequence_log_probs(variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    settings = dict(
        attention_mask=attention_mask,
        max_new_tokens=8,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=0.0,
        return_dict_in_generate=True,
        output_scores=True,
    )
    outputs = model.generate(input_ids, **settings)
    assert torch.equal(model.generate(input_ids, **settings).sequences, outputs.sequences)  # deterministic
    # A beam whose state had been routed to another beam's row would not score as its own tokens do.
    recomputed = sequence_log_probs(
        model, input_ids.repeat_interleave(4, 0), attention_mask.repeat_interleave(4, 0), outputs.sequences
    )
    torch.testing.assert_close(outputs.sequences_scores, recomputed, rtol=0, atol=1e-4)
    assert (outputs.sequences_scores.view(3, 4).diff(dim=1) <= 0).all()  # best beam first


def test_generate_returns_one_alignment_per_step():
    model = make_model()
    input_ids, attention_mask = source_batch()
    outputs = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=4,
        min_new_tokens=4,
        num_beams=2,
        output_attentions=True,
        return_dict_in_generate=True,
    )
    assert len(outputs.cross_attentions) == 4
    for (alignment,) in outputs.cross_attentions:
        assert alignment.shape == (6, 1, 7)  # (B * beams, 1, S)
        torch.testing.assert_close(alignment.sum(-1), torch.ones(6, 1))
        assert (alignment[:, 0].masked_select(attention_mask.repeat_interleave(2, 0) == 0) == 0).all()


def test_encoder_keys_are_projected_once_per_generate(monkeypatch):
    model = make_model()
    calls = []
    project_keys = model.model.decoder.score.project_keys
    monkeypatch.setattr(
        model.model.decoder.score, "project_keys", lambda states: calls.append(1) or project_keys(states)
    )
    input_ids, attention_mask = source_batch()
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, min_new_tokens=6, num_beams=3)
    assert len(calls) == 1


def test_cache_reorder_select_and_repeat_follow_the_batch_dimension():
    cache = AttnRNNCache()
    hidden = torch.arange(3.0)[None, :, None].expand(2, 3, 4)  # (L, B, H): row b holds b
    cache.store(
        torch.arange(3.0)[:, None, None].expand(3, 5, 4), (hidden, hidden + 10), torch.arange(3.0).view(3, 1, 1), 2
    )
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert cache.keys[:, 0, 0].tolist() == [2, 2, 0] and cache.feed.flatten().tolist() == [2, 2, 0]
    assert cache.hidden[1, :, 0].tolist() == [2, 2, 0] and cache.cell[0, :, 0].tolist() == [12, 12, 10]
    cache.batch_repeat_interleave(2)
    assert cache.hidden[0, :, 0].tolist() == [2, 2, 2, 2, 0, 0] and cache.batch_size == 6
    cache.batch_select_indices(torch.tensor([4, 0]))
    assert cache.cell[1, :, 0].tolist() == [10, 12] and cache.get_seq_length() == 2
    with pytest.raises(NotImplementedError, match="cannot be rolled back"):
        cache.crop(-1)


# -- loading, saving, Auto classes ------------------------------------------------------------------------


def test_presets_and_auto_classes():
    small = load_preset("rnn-small")
    assert isinstance(small, AttnRNNConfig) and small.vocab_size == 8000
    config = load_preset("rnn-tiny")
    assert isinstance(AutoConfig.for_model("attn_rnn"), AttnRNNConfig)
    assert type(AutoModel.from_config(config)) is AttnRNNModel
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is AttnRNNForConditionalGeneration


@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[3]], ids=[IDS[0], IDS[3]])
def test_save_load_round_trip_keeps_weights_bitwise(tmp_path, variant):
    model = make_model(**variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(3, VOCAB, (3, 4))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_rnn.AttnRNNConfig",
        "AutoModel": "modeling_rnn.AttnRNNModel",
        "AutoModelForSeq2SeqLM": "modeling_rnn.AttnRNNForConditionalGeneration",
    }
    assert {"modeling_rnn.py", "configuration_rnn.py", "scores.py", "attention.py"} <= {
        p.name for p in tmp_path.iterdir()
    }
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is AttnRNNForConditionalGeneration
    loaded_weights = loaded.state_dict()
    assert model.state_dict().keys() == loaded_weights.keys()
    assert all(torch.equal(value, loaded_weights[name]) for name, value in model.state_dict().items())
    # Same weights, but the loaded ones may sit at other memory alignments (safetensors memory-maps the file), and
    # the CPU matrix kernels round differently for differently aligned inputs: the logits agree to float32 noise.
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=1e-5)


def test_tied_and_shared_embeddings_survive_loading(tmp_path):
    model = make_model(tie_word_embeddings=True, share_encoder_decoder_embeddings=True)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert model.model.encoder.embed_tokens is model.model.decoder.embed_tokens
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    loaded = AttnRNNForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight
    assert loaded.model.encoder.embed_tokens is loaded.model.decoder.embed_tokens
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)


def test_remote_code_loading_in_a_fresh_process(tmp_path):
    model = make_model(rnn_type="lstm", decoder_style="luong", attention_score="general", input_feeding=True)
    input_ids, attention_mask = source_batch()
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask}, tmp_path / "inputs.pt")
    result = run_isolated(
        """
        import json, torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained("checkpoint", trust_remote_code=True).eval()
        base = AutoModel.from_pretrained("checkpoint", trust_remote_code=True).eval()
        inputs = torch.load("inputs.pt")
        decoder_input_ids = torch.ones(3, 2, dtype=torch.long)
        logits = model(**inputs, decoder_input_ids=decoder_input_ids).logits
        hidden = base(**inputs, decoder_input_ids=decoder_input_ids).last_hidden_state
        beams = model.generate(**inputs, max_new_tokens=6, num_beams=3)
        torch.save({"logits": logits, "hidden": hidden, "beams": beams}, "outputs.pt")
        print(json.dumps({"classes": [type(m).__module__ + "." + type(m).__name__ for m in (model, base)]}))
        """,
        cwd=tmp_path,
    )
    for name, expected in zip(result["classes"], ["AttnRNNForConditionalGeneration", "AttnRNNModel"], strict=True):
        assert name.startswith("transformers_modules.") and name.endswith(f".modeling_rnn.{expected}")
    remote = torch.load(tmp_path / "outputs.pt")
    # float32 noise only: the loaded weights sit at other memory alignments (see the round-trip test above).
    torch.testing.assert_close(
        remote["hidden"],
        model.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.ones(3, 2, dtype=torch.long)
        ).last_hidden_state,
        rtol=0,
        atol=1e-5,
    )
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.ones(3, 2, dtype=torch.long)
    ).logits
    torch.testing.assert_close(remote["logits"], logits, rtol=0, atol=1e-5)
    assert torch.equal(
        remote["beams"], model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=3)
    )


# -- a task it must learn ---------------------------------------------------------------------------------


def check_learns_reverse(variant: dict, steps: int):
    model = train_rnn_reverser(steps, **variant)
    with one_thread():
        input_ids, attention_mask, labels = reverse_task(500, torch.Generator().manual_seed(123))
        with torch.no_grad():
            generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=False)
            (alignments,) = model(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True
            ).cross_attentions
    lengths = attention_mask.sum(1).tolist()
    # Target token t (0-based) is source token length - 1 - t: the alignment should be anti-diagonal.
    aligned = sum(
        (alignments[row, :length].argmax(-1) == torch.arange(length - 1, -1, -1)).sum().item()
        for row, length in enumerate(lengths)
    )
    assert exact_match(generated, labels) >= 0.99
    assert aligned / sum(lengths) >= 0.9


def test_learns_to_reverse_with_diagonal_alignment():
    check_learns_reverse(dict(rnn_type="gru", decoder_style="bahdanau", attention_score="additive"), steps=400)


@pytest.mark.slow
def test_luong_lstm_learns_to_reverse_with_diagonal_alignment():
    check_learns_reverse(
        dict(rnn_type="lstm", decoder_style="luong", attention_score="general", input_feeding=True), steps=600
    )


# -- bad input ---------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    model = make_model()
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.ones(3, 2, dtype=torch.long)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with pytest.raises(IndexError, match=r"input_ids holds token id 12 .* ids must be in \[0, 12\)"):
        model(**{**inputs, "input_ids": input_ids.masked_fill(input_ids == input_ids[0, 0], VOCAB)})
    with pytest.raises(IndexError, match="decoder_input_ids holds token id -1"):
        model(**{**inputs, "decoder_input_ids": -decoder_input_ids})
    with pytest.raises(IndexError, match="labels holds token id 99"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.full((3, 2), 99))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(3, 6\), expected \(batch, length\) = \(3, 7\)"):
        model(**{**inputs, "attention_mask": attention_mask[:, :6]})
    with pytest.raises(ValueError, match="must be a \\(batch, length\\) padding mask"):
        model(**{**inputs, "attention_mask": attention_mask[:, None, None, :]})
    with pytest.raises(ValueError, match="must be right-padded"):
        model(**{**inputs, "attention_mask": attention_mask.flip(1)})
    with pytest.raises(ValueError, match="attention_mask row 1 masks every token"):
        model(**{**inputs, "attention_mask": attention_mask * torch.tensor([[1], [0], [1]])})
    with pytest.raises(
        ValueError, match=r"input_ids must be a non-empty \(batch, length\) tensor, got shape \(0, 7\)"
    ):
        model(**{**inputs, "input_ids": input_ids[:0], "attention_mask": attention_mask[:0]})
    with pytest.raises(ValueError, match="decoder input has batch size 2 but the encoder output has 3"):
        model(**{**inputs, "decoder_input_ids": decoder_input_ids[:2]})
    with pytest.raises(ValueError, match="decoder_attention_mask may only mark padding at the end"):
        model(**inputs, decoder_attention_mask=torch.tensor([[1, 1], [0, 1], [1, 1]]))
    with pytest.raises(TypeError, match="past_key_values must be an AttnRNNCache"):
        model(**inputs, past_key_values=object())
    with pytest.raises(ValueError, match="pass exactly one of input_ids and inputs_embeds"):
        model(attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(decoder_hidden_size=0), "AttnRNNConfig.decoder_hidden_size must be a positive integer, got 0"),
        (dict(encoder_layers=-1), "AttnRNNConfig.encoder_layers must be a positive integer, got -1"),
        (dict(dropout=1.5), r"AttnRNNConfig.dropout must be a probability in \[0, 1\), got 1.5"),
        (dict(rnn_type="rnn"), r"AttnRNNConfig.rnn_type must be one of \['gru', 'lstm'\], got 'rnn'"),
        (dict(decoder_style="vaswani"), "AttnRNNConfig.decoder_style must be one of"),
        (dict(attention_score="location"), "AttnRNNConfig.attention_score must be one of"),
        (
            dict(attention_score="dot", decoder_hidden_size=12),
            r"decoder_hidden_size \(12\) must equal 2 \* encoder_hidden_size \(16\)",
        ),
        (dict(input_feeding=True), "input_feeding is a variant of decoder_style='luong'"),
        (
            dict(tie_word_embeddings=True, readout_size=8),
            r"tie_word_embeddings needs the decoder output width readout_size \(8\) to equal embedding_size \(16\)",
        ),
        (dict(share_encoder_decoder_embeddings=True, decoder_vocab_size=50), r"decoder_vocab_size \(50\) must equal"),
        (dict(eos_token_id=99), r"AttnRNNConfig.eos_token_id must be a token id in \[0, decoder_vocab_size=99\)"),
    ],
)
def test_invalid_config_values_raise_naming_the_field(overrides, message):
    with pytest.raises(StrictDataclassError, match=message):
        load_preset("rnn-tiny", **overrides)
