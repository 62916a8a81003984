"""Tests of training/plot.py: a PNG of the training curves, or a logged note when matplotlib is missing."""

from __future__ import annotations

import importlib.util
import logging

from modeling_attn.training.plot import plot_history

HISTORY = [{"step": 10, "loss": 3.0}, {"step": 20, "loss": 2.0}, {"step": 20, "eval_bleu": 12.5}]


def test_plot_or_note(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        written = plot_history(HISTORY, tmp_path / "curves.png")
    if importlib.util.find_spec("matplotlib") is None:
        assert written is None and "matplotlib is not installed" in caplog.text
    else:
        assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
