"""The benchmark suite: one harness (`harness.py`), one entry point (`python -m bench NAME [flags]`), these benches.

`BENCHES` names every bench and its module; each module has `main(argv) -> dict`, times through `bench.harness` and
writes its report to bench/results (or where its `--output` says). bench/README.md is the index: the question each
answers, its command, its results file and the doc that cites it. `common.py` holds what the model benches share
(batches of realistic lengths, the reference model and its peers, training and generation tasks, FLOPs).
"""

from __future__ import annotations

# name -> module, in the order of bench/README.md's index
BENCHES: dict[str, str] = {
    "speed": "bench.speed",
    "train_step": "bench.train_step",
    "cpu_mfu": "bench.cpu_mfu",
    "compile_train_step": "bench.compile_train_step",
    "decode_step": "bench.decode_step",
    "beam_search": "bench.beam_search",
    "fast_generation": "bench.fast_generation",
    "engines": "bench.engines",
    "decode": "bench.decode",
    "threads": "bench.threads",
    "steer": "bench.steer",
    "documents": "bench.documents",
    "int8": "bench.int8",
    "ensemble": "bench.ensemble",
    "gpu": "bench.gpu",
    "alignment": "bench.alignment",
    "markup": "bench.markup",
    "multi30k": "bench.multi30k.recipe",
    "multi30k_ensemble": "bench.multi30k.ensemble",
    "multi30k_bleu": "bench.multi30k.bleu",
    "scale": "bench.scale.run",
    "scale_corpus": "bench.scale.make_corpus",
    "serve": "bench.serve.bench",
    "stream": "bench.stream",
}
