"""What client code this project did not write does with the models, for both model types, as its documentation
shows it: each section follows one client's documented calls and checks the result against a reference (logits
equal to the model's own, state equal after a resume). docs/clients.md lists what works and the test behind it.

Sections (each self-contained; other sections of this file may be added by other work):
- PEFT LoRA: train -> save the adapter -> reload it onto the saved base model -> merge, with equal logits.
- accelerate's documented training loop: Accelerator, prepare, backward, save_state / load_state; a resumed run ends
  with the same weights as an uninterrupted one.
- Loading: bf16 (`dtype` and the older `torch_dtype`), `device_map="cpu"`, `low_cpu_mem_usage`.
- transformers' run_translation.py steps: a tokenizer with added tokens, `resize_token_embeddings`, a plain
  Seq2SeqTrainer run with `save_steps`; every checkpoint reloads with AutoModelForSeq2SeqLM to the logits the model
  had when it was saved.
"""

from __future__ import annotations

import datasets
import pytest
import torch
from modeling_attn.training.synthetic import generate_pairs
from modeling_attn.training.tokenizer import train_bpe_tokenizer
from peft import LoraConfig, PeftModel, get_peft_model
from tiny import padded_batch, tiny_model, tiny_rnn_config
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from modeling_attn import AttnRNNForConditionalGeneration


def transformer(**overrides):
    return tiny_model(**overrides).train()


def rnn(**overrides):
    torch.manual_seed(0)
    return AttnRNNForConditionalGeneration(tiny_rnn_config(**overrides)).train()


MODELS = {"transformer": transformer, "rnn": rnn}


def load(folder):
    """The saved model, with the attention the tiny models use (eager: their logits are compared bit for bit)."""
    return AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager")


def training_batches(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Padded source/label batches of the tiny vocabulary (labels -100 after each row's end)."""
    batches = []
    for index in range(count):
        input_ids, attention_mask, labels = padded_batch(seed=seed + index, batch=4)
        labels[1:, -1] = -100
        batches.append(dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels))
    return batches


@torch.no_grad()
def logits_of(model, batch: dict) -> torch.Tensor:
    was_training = model.training
    model.eval()
    inputs = dict(batch)
    labels = inputs.pop("labels")
    decoder_input_ids = labels.masked_fill(labels == -100, 0)
    logits = model(**inputs, decoder_input_ids=decoder_input_ids, use_cache=False).logits
    model.train(was_training)
    return logits


# --- PEFT: LoRA -----------------------------------------------------------------------------------------------------
# Adapters on linear layers: the Transformer's query/value projections, the RNN's readout, bridge and score layers.
LORA_TARGETS = {"transformer": ["q_proj", "v_proj"], "rnn": ["readout", "bridge", "query_proj", "key_proj"]}


@pytest.mark.parametrize("kind", MODELS)
def test_peft_lora_trains_saves_reloads_and_merges_with_equal_logits(tmp_path, kind):
    base = MODELS[kind](dropout=0.0)
    base.save_pretrained(tmp_path / "base")
    frozen = {name: parameter.clone() for name, parameter in base.named_parameters()}
    lora = LoraConfig(task_type="SEQ_2_SEQ_LM", r=4, lora_alpha=8, target_modules=LORA_TARGETS[kind])
    model = get_peft_model(base, lora)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batches = training_batches(4)
    losses = []
    for batch in batches * 3:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[8] < losses[0]  # the first batch, seen a third time
    # the base weights did not move; the adapters did (LoRA's B starts at zero)
    for name, parameter in model.base_model.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(parameter, frozen[name.replace(".base_layer", "")]), name
    trained = logits_of(model, batches[0])
    assert not torch.equal(trained, logits_of(load(tmp_path / "base"), batches[0]))

    model.save_pretrained(tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    reloaded = PeftModel.from_pretrained(load(tmp_path / "base"), tmp_path / "adapter")
    assert torch.equal(logits_of(reloaded, batches[0]), trained)
    merged = reloaded.merge_and_unload()
    assert type(merged) is type(base) and not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(logits_of(merged, batches[0]), trained, rtol=0, atol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    assert torch.equal(logits_of(load(tmp_path / "merged"), batches[0]), logits_of(merged, batches[0]))


# --- accelerate: the documented loop with save_state / load_state ----------------------------------------------------


def accelerate_run(kind: str, batches: list[dict], state_dir, stop_at: int | None = None, resume: bool = False):
    """accelerate's documented loop (Accelerator, prepare, backward, step) over `batches`; with `stop_at`, save the
    state after that many steps and stop; with `resume`, load it and skip the steps it covered."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    accelerator = Accelerator(cpu=True)
    # no dropout: the DataLoader draws its seed from the global generator when a loop starts, so a resumed run's
    # dropout masks differ from an uninterrupted run's (accelerate's loop, not the model); everything else is exact
    model = MODELS[kind](dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=1.0, end_factor=0.1, total_iters=len(batches)
    )
    examples = [{key: value[row] for key, value in batch.items()} for batch in batches for row in range(4)]
    dataloader = torch.utils.data.DataLoader(examples, batch_size=4)  # the batches again, as a client builds them
    model, optimizer, dataloader, scheduler = accelerator.prepare(model, optimizer, dataloader, scheduler)
    skip = 0
    if resume:
        accelerator.load_state(state_dir)
        skip = stop_at
        dataloader = accelerator.skip_first_batches(dataloader, skip)
    for step, batch in enumerate(dataloader, start=skip + 1):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if not resume and step == stop_at:
            accelerator.save_state(state_dir)
            break
    return accelerator.unwrap_model(model), optimizer


@pytest.mark.parametrize("kind", MODELS)
def test_accelerate_save_state_and_load_state_resume_to_the_same_weights(tmp_path, kind):
    batches = training_batches(6)
    uninterrupted, optimizer = accelerate_run(kind, batches, tmp_path / "unused")
    accelerate_run(kind, batches, tmp_path / "state", stop_at=3)
    resumed, resumed_optimizer = accelerate_run(kind, batches, tmp_path / "state", stop_at=3, resume=True)
    for (name, parameter), resumed_parameter in zip(
        uninterrupted.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(parameter, resumed_parameter), name
    assert optimizer.param_groups[0]["lr"] == resumed_optimizer.param_groups[0]["lr"]
    if uninterrupted.config.tie_word_embeddings:
        assert resumed.lm_head.weight is resumed.get_decoder().embed_tokens.weight


# --- loading: bf16, device_map, low_cpu_mem_usage --------------------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
def test_bf16_and_device_map_loading(tmp_path, kind):
    model = MODELS[kind](dropout=0.0).eval()
    model.save_pretrained(tmp_path)
    batch = training_batches(1)[0]
    reference = logits_of(model, batch)
    tied = model.config.tie_word_embeddings
    for loading in (dict(device_map="cpu"), dict(low_cpu_mem_usage=True)):
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager", **loading)
        assert {parameter.device.type for parameter in loaded.parameters()} == {"cpu"}
        assert torch.equal(logits_of(loaded, batch), reference), loading
        assert (loaded.lm_head.weight is loaded.get_decoder().embed_tokens.weight) == tied
    for loading in (dict(dtype=torch.bfloat16), dict(torch_dtype=torch.bfloat16)):  # torch_dtype: the older name
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager", **loading)
        assert {parameter.dtype for parameter in loaded.parameters()} == {torch.bfloat16}
        logits = logits_of(loaded, batch)
        assert logits.dtype == torch.bfloat16
        torch.testing.assert_close(logits.float(), reference, rtol=0.05, atol=0.05)
        assert (logits.float().argmax(-1) == reference.argmax(-1)).float().mean() > 0.9
        generated = loaded.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=4)
        assert generated.shape[0] == batch["input_ids"].shape[0]


# --- transformers' run_translation.py: added tokens, resize, Seq2SeqTrainer checkpoints -----------------------------


class LogitsAtSave(TrainerCallback):
    """Records the model's logits on a fixed batch at every checkpoint Trainer saves."""

    def __init__(self, batch: dict):
        self.batch, self.logits = batch, {}

    def on_save(self, args, state, control, model=None, **kwargs):
        self.logits[state.global_step] = logits_of(model, self.batch)


def translation_tokenizer(pairs):
    return train_bpe_tokenizer([text for pair in pairs for text in pair], vocab_size=120, min_frequency=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", MODELS)
def test_run_translation_steps_resize_train_and_write_checkpoints_that_reload(tmp_path, kind):
    pairs = generate_pairs(64, seed=0)
    tokenizer = translation_tokenizer(pairs)
    # a model "pretrained" on the tokenizer's vocabulary, as run_translation.py finds it with --model_name_or_path
    MODELS[kind](vocab_size=len(tokenizer), dropout=0.0).save_pretrained(tmp_path / "pretrained")

    # run_translation.py: the tokenizer grew (--tokenizer_name with more tokens); the model is resized to it
    new_tokens = ["<2iso>", "<date>"]
    assert tokenizer.add_tokens(new_tokens) == 2
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "pretrained")
    embedding_size = model.get_input_embeddings().weight.shape[0]
    assert len(tokenizer) > embedding_size
    assert model.config.joint_vocabulary  # one tokenizer's ids: run_translation.py's one call resizes both sides
    model.resize_token_embeddings(len(tokenizer))
    assert model.config.vocab_size == model.config.decoder_vocab_size == len(tokenizer)

    sources = [f"<2iso> {source}" for source, _ in pairs]
    targets = [f"<date> {target}" for _, target in pairs]  # the new tokens in the labels too
    features = tokenizer(sources, text_target=targets, max_length=32, truncation=True)
    train = datasets.Dataset.from_dict(dict(features))
    assert any(tokenizer.convert_tokens_to_ids("<date>") in labels for labels in train["labels"])
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    probe = collator([train[index] for index in range(4)])
    probe = {key: probe[key] for key in ("input_ids", "attention_mask", "labels")}
    logits_at_save = LogitsAtSave(probe)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[logits_at_save],
    )
    trainer.train()

    checkpoints = sorted((tmp_path / "run").glob("checkpoint-*"))
    assert [checkpoint.name for checkpoint in checkpoints] == ["checkpoint-2", "checkpoint-4"]
    assert sorted(logits_at_save.logits) == [2, 4]
    for checkpoint in checkpoints:
        names = {path.name for path in checkpoint.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names
        loaded = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
        assert loaded.config.vocab_size == loaded.config.decoder_vocab_size == len(tokenizer)
        step = int(checkpoint.name.split("-")[1])
        torch.testing.assert_close(logits_of(loaded, probe), logits_at_save.logits[step], rtol=0, atol=1e-6)
        assert len(AutoTokenizer.from_pretrained(checkpoint)) == len(tokenizer)
    assert not torch.equal(logits_at_save.logits[2], logits_at_save.logits[4])  # it trained between the saves
