"""The training recipe of "Attention Is All You Need" for the modeling_attn models, on transformers' Trainer.

Modules: `data` (parallel data and its checks), `synthetic` (the embedded dates task), `tokenizer` (joint BPE),
`batching` (token-budget batches), `trainer` (Seq2SeqTrainer with them), `metrics` (sacreBLEU BLEU / chrF),
`averaging` (checkpoint averaging), `plot` (training curves), `train` (the `attn train` entry point).
"""
