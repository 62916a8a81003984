"""Named presets (model sizes, launch configs) as data files; loaded by `modeling_attn.api.presets`."""
