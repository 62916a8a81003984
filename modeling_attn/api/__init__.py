"""The Python API over the models (never copied to the Hub)."""
