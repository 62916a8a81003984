"""What tests/test_compat.py computes both with the package and in a process without it: translations by greedy
and beam generate, and the loss of one Trainer step. Imports nothing of modeling_attn."""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments


def generated(model, tokenizer, sentences: list[str]) -> dict[str, list[str]]:
    """Greedy and beam (4) translations of `sentences`, batched, and with the saved generation config one sentence at a
    time (as the translation pipeline calls generate), decoded."""
    encoded = tokenizer(sentences, return_tensors="pt", padding=True, return_token_type_ids=False)
    with torch.no_grad():
        greedy = model.generate(**encoded, num_beams=1, do_sample=False, max_new_tokens=12)
        beam = model.generate(**encoded, num_beams=4, do_sample=False, max_new_tokens=12)
        one_by_one = [tokenizer([text], return_tensors="pt", return_token_type_ids=False) for text in sentences]
        alone = [model.generate(**encoded_text) for encoded_text in one_by_one]
    return {
        "greedy": tokenizer.batch_decode(greedy, skip_special_tokens=True),
        "beam": tokenizer.batch_decode(beam, skip_special_tokens=True),
        "saved_settings": [tokenizer.decode(ids[0], skip_special_tokens=True) for ids in alone],
    }


def trainer_step(model, tokenizer, sentences: list[str], output_dir) -> float:
    """The training loss of one Seq2SeqTrainer step on the sentences translated to themselves (fixed seed)."""
    data = Dataset.from_dict({"source": sentences})
    data = data.map(lambda row: {**tokenizer(row["source"]), "labels": tokenizer(row["source"])["input_ids"]})
    data = data.remove_columns(["source"])
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        max_steps=1,
        per_device_train_batch_size=len(sentences),
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        seed=0,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        use_cpu=True,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=data, data_collator=collator)
    return trainer.train().training_loss
