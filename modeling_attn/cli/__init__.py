"""The commands: `attn COMMAND` (`main.py` dispatches), one module per command, `parser.py` shared.

They import everything below them (the Python API `modeling_attn.api`, the recipe `modeling_attn.training`, the
model core); nothing below imports them (tests/test_layers.py).
"""
