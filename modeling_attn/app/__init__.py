"""The application layer: what a person runs on top of the models and the training recipe.

- `cli.py`: the `attn` command (`attn train | average | translate | evaluate | push | convert | export | preset`);
- `translate.py`: `attn translate`; `evaluate.py`: `attn evaluate`;
- `push.py`: `attn push` (what it uploads: `modeling_attn.hub`);
- `convert_marian.py`: Marian / OPUS-MT checkpoints to `attn_transformer` and back (`attn convert`);
- `export_ctranslate2.py`: the CTranslate2 export and translator (`attn export`).

The layers import downward only: this package may import the model package (`modeling_attn`'s own modules) and
the training recipe (`training`); neither of them imports this package (tests/test_layers.py checks it).
"""
