"""The training recipe of "Attention Is All You Need" for the modeling_attn models, on transformers' Trainer.

Modules: `data` (parallel data into Arrow, and its checks), `prepare` (the caches of read data, tokenized splits
and BPE vocabularies), `synthetic` (the embedded dates task), `tokenizer` (joint BPE), `bpe_dropout`, `batching`
(token-budget batches, also from a stream), `trainer` (Seq2SeqTrainer with them), `metrics` (sacreBLEU BLEU / chrF /
TER), `averaging` (checkpoint averaging), `plot` (training curves), `arguments` (the command-line convention of every
`attn` command), `train` (the `attn train` entry point), `__main__` (`python -m training`, `torchrun -m training`).
"""
