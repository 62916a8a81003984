"""The CPU training step of `attn_rnn`, with full logits and with `skip_logits=True`, interleaved.

    python bench/rnn_train_step.py --preset multi30k-rnn --batch_size 128 --threads 1

`skip_logits=True` (what `attn train` passes) computes the output projection and the label-smoothed loss on the
labelled positions only, through `modeling_attn.loss.labelled_token_loss` (the fused CPU loss,
`linear_token_loss`, where `fuses_output_loss` allows); the other variant makes the (batch, length, vocabulary)
logits and takes `token_loss` of them. Both run the same training step (`common.training_task`: forward, backward,
Adam; label smoothing 0.1, dropout from the preset) on the same batch of Multi30k-like lengths (`common.make_batches`,
seed 0), each on its own copy of the same weights; timing is `common.interleaved` (one warm-up round, then `--reps`
rounds in rotating order, the CPU clock of this process), the median is reported. `--compile` adds the
`skip_logits` step of `torch.compile(model)` with torch's default backend (inductor), as Trainer's `--torch_compile`
runs it: the recurrent layers stay eager (`modeling_attn/recurrent.py`), the rest is compiled; its compilation falls
in the warm-up round. `--similar_lengths` takes the batch's sentences from the middle of 32 batches' worth sorted by
length, as `attn train`'s token batches group them (little padding), instead of at random.
"""

from __future__ import annotations

import copy
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

from modeling_attn import AttnRNNForConditionalGeneration  # noqa: E402
from modeling_attn.api.presets import load_preset  # noqa: E402

# the losses of common.py's peers: `hf_loss` as a plain training loop calls the model, `ours_loss` as `attn train` does
VARIANTS = {
    "full logits": partial(common.hf_loss, smoothing=0.1),
    "skip_logits (what attn train uses)": partial(common.ours_loss, smoothing=0.1),
}


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure, print the table, and return the median seconds per step of each variant."""
    parser = common.step_parser(__doc__.split("\n")[0], "multi30k-rnn", 128)
    parser.add_argument("--compile", action="store_true", help="also the skip_logits step of torch.compile(model)")
    parser.add_argument("--similar_lengths", action="store_true", help="a batch of similar lengths (little padding)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_preset(args.preset)
    if config.model_type != "attn_rnn":
        raise ValueError(f"--preset {args.preset} has model_type {config.model_type}; this script times attn_rnn")
    torch.manual_seed(0)
    reference = AttnRNNForConditionalGeneration(config).train()
    batch = common.make_batches(1, args.batch_size, config.vocab_size, seed=0, max_length=255)[0]
    if args.similar_lengths:
        lengths = sorted(common.sentence_lengths(32 * args.batch_size, seed=0), key=lambda pair: (pair[1], pair[0]))
        middle = lengths[len(lengths) // 2 : len(lengths) // 2 + args.batch_size]
        batch = common.make_batch(middle, config.vocab_size, torch.Generator().manual_seed(0))
    tasks = {
        name: common.training_task(
            copy.deepcopy(reference), common.Peer(name, lambda model: model, loss=loss), [batch], "cpu"
        )
        for name, loss in VARIANTS.items()
    }
    if args.compile:
        compiled = torch.compile(copy.deepcopy(reference))
        ours = common.Peer("compiled", lambda model: model, loss=VARIANTS["skip_logits (what attn train uses)"])
        tasks["skip_logits, torch.compile (inductor)"] = common.training_task(compiled, ours, [batch], "cpu")
    return common.step_report(args, batch, common.interleaved(tasks, args.reps, common.CLOCKS["cpu"]))


if __name__ == "__main__":
    main()
