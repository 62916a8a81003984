"""A PNG plot of training loss and validation BLEU against steps, from `Trainer.state.log_history`.

matplotlib is optional: without it the plot is skipped with a logged note.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def plot_history(log_history: list[dict], path: str | Path) -> Path | None:
    """Write the plot to `path`; return it, or None when matplotlib is missing or nothing was logged."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: skipping the training plot (pip install matplotlib)")
        return None
    losses = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry and "step" in entry]
    bleus = [(entry["step"], entry["eval_bleu"]) for entry in log_history if "eval_bleu" in entry]
    if not losses and not bleus:
        return None
    figure, loss_axis = plt.subplots(figsize=(7, 4))
    if losses:
        loss_axis.plot(*zip(*losses, strict=True), color="tab:blue", label="training loss")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("training loss", color="tab:blue")
    if bleus:
        bleu_axis = loss_axis.twinx()
        bleu_axis.plot(*zip(*bleus, strict=True), color="tab:red", marker="o", label="validation BLEU")
        bleu_axis.set_ylabel("validation BLEU", color="tab:red")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)
