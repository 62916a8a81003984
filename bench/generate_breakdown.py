"""Where beam-search time goes: `generate()` (beam 4, batch 32) against the model's own work on the same batch.

    python bench/generate_breakdown.py --preset base --threads 1

Times (CPU clock of this process): one `generate()` with beam 4 forced to the batch's longest reference length; the
encoder on the 32 sentences; the same number of cached decoder steps on 4 x 32 rows (greedy, no beam bookkeeping);
and the output projection alone on 4 x 32 rows for as many steps. What `generate()` spends beyond the encoder and
the decoder steps is the beam search around the model (scores, top-k, cache reordering, Python).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (this folder's shared helpers)

BEAMS = 4


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = common.reference_model(args.preset, 256, seed=0).eval()
    batch = common.make_batches(1, args.batch_size, model.config.vocab_size, seed=2)[0]
    steps = max(batch.target_lengths)
    clock = time.process_time
    seconds = {}
    with torch.no_grad():
        common.hf_generate(model, batch, BEAMS, 5)  # warm-up
        start = clock()
        common.hf_generate(model, batch, BEAMS, steps)
        seconds["generate (beam 4)"] = clock() - start

        start = clock()
        encoded = model.get_encoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        seconds["encoder"] = clock() - start
        rows = BEAMS * args.batch_size
        encoded = BaseModelOutput(last_hidden_state=encoded.last_hidden_state.repeat_interleave(BEAMS, 0))
        mask = batch.attention_mask.repeat_interleave(BEAMS, 0)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        tokens = torch.full((rows, 1), common.BOS)
        start = clock()
        for _ in range(steps):
            out = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=tokens, past_key_values=cache)
            cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        seconds["decoder steps (incl. output projection)"] = clock() - start

        hidden = torch.randn(rows, model.config.d_model)
        start = clock()
        for _ in range(steps):
            model.lm_head(hidden)
        seconds["output projection alone"] = clock() - start
    total = seconds["generate (beam 4)"]
    print(f"preset {args.preset}, batch {args.batch_size}, beam {BEAMS}, {steps} steps, {args.threads} thread(s)")
    for name, value in seconds.items():
        print(f"{name:45s} {value:6.2f} s  {100 * value / total:5.1f}%")


if __name__ == "__main__":
    main()
