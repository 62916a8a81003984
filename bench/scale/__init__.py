"""`attn train` at WMT scale: a synthetic corpus (`python -m bench scale_corpus`) and its memory run (`scale`)."""
