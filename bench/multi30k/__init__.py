"""The Multi30k recipe (`python -m bench multi30k`), its seed and checkpoint ensembles, and its BLEU scorer."""
