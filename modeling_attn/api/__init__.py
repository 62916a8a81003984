"""The Python API over the models (never copied to the Hub with a checkpoint).

- `presets`: the named model sizes of configuration/*.json;
- `translation`: translate / n-best / score sentences with a saved model; `heatmaps`: attention pictures;
- `corpus`: reading parallel text (UTF-8 lines, split files, TSV / JSONL rows), shared with the recipe;
- `metrics`: BLEU, chrF and TER with sacreBLEU, through the offline `evaluate` modules of `evaluate_modules/`;
- `hub`: the one decoding policy, the model card, `save_for_hub` and `push_to_hub`;
- `convert_marian`, `export_ctranslate2`: Marian (OPUS-MT) and CTranslate2 interop as libraries.

It imports the model core (`modeling_attn`'s flat modules) and nothing of the recipe or the commands.
"""
