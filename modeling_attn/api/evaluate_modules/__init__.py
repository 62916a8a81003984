"""The translation metrics as Hugging Face `evaluate` modules, shipped inside the package so that they load offline.

`evaluate.load("sacrebleu")` fetches its script from the Hub (it fails with no network). These scripts are local
module files: `evaluate.load(modeling_attn.api.metrics.module_path("sacrebleu"))` loads one from its path, and
`modeling_attn.api.metrics.load_metric("sacrebleu")` builds the same class without evaluate's copy into its modules
cache. `modeling_attn.api.metrics.translation_scores` (`attn evaluate`, the recipe's `compute_metrics`) computes
through them. The modules (docs/evaluate.md, "The metrics as `evaluate` modules"): `sacrebleu` (Post, 2018),
`chrf` (Popović, 2015), `ter` (Snover et al., 2006), each as the Hub's `evaluate-metric/*` plus `signature`, and
`multi30k_bleu`, BLEU on lowercased, Moses-tokenized text, the way published Multi30k numbers are computed.

Each file imports only `evaluate`, `datasets`, sacreBLEU (sacremoses) and `_common.py` beside it (relative, so that
`evaluate.load` copies it along), and defines exactly one `evaluate.Metric`.
"""
