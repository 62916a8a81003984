"""The training recipe of "Attention Is All You Need" for the modeling_attn models, on transformers' Trainer.

It is installed as `modeling_attn.training`. Modules: `data` (parallel data into Arrow, and its checks), `prepare`
(the caches of read data, tokenized splits and BPE vocabularies), `synthetic` (the embedded dates task), `tokenizer`
(joint BPE), `bpe_dropout`, `batching` (token-budget batches, also from a stream), `alignment` (guided alignment),
`trainer` (Seq2SeqTrainer with them), `metrics` (`compute_metrics`), `averaging` (checkpoint averaging), `plot`
(training curves), `arguments` (the recipe's flags, the paper's defaults), `validate` (every check of the flags,
before any work), `hub_push` (the Hub repository and the checkpoint pushes, a callback), `train` (the recipe's
steps: `run`), `__main__` (`python -m modeling_attn.training`, `torchrun -m modeling_attn.training`: `attn train`).
docs/architecture.md names every module of the package with one line each.
"""
