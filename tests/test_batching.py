"""The batching queue of `attn serve` (modeling_attn/api/batching.py) without the serve extra: FastAPI blocked in a
fresh process, real requests of a real tiny Transformer batched by `Batcher`, answered as each sentence alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Runs in a fresh process: `sys.modules[name] = None` is what an environment without the package gives (ImportError).
WITHOUT_FASTAPI = """
import asyncio, json, sys
sys.modules["fastapi"] = sys.modules["starlette"] = sys.modules["uvicorn"] = None
from modeling_attn.api.batching import Batcher, Group, ServeLimits
try:
    import modeling_attn.api.server
    server = "imported"
except ImportError as error:
    server = f"ImportError: {error}"
import torch
from tiny import tiny_config
from modeling_attn import AttnTransformerForConditionalGeneration
from modeling_attn.api.translation import translate_nbest
from modeling_attn.training.tokenizer import train_bpe_tokenizer

REQUESTS = [["the cat sat", "a dog ran in the park"], ["the 4th of July 1776"], ["ein Hund lief", "1987-03-03", ""]]
tokenizer = train_bpe_tokenizer([text for request in REQUESTS for text in request] * 3, vocab_size=80, min_frequency=1)
torch.manual_seed(0)
special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
config = tiny_config(vocab_size=len(tokenizer), **special)
model = AttnTransformerForConditionalGeneration(config).eval()
model.generation_config.update(max_new_tokens=5, num_beams=2)

async def serve(options: dict) -> tuple[list, int]:
    batcher = Batcher(model, tokenizer, ServeLimits(max_wait_ms=500))
    batcher.start()
    loop = asyncio.get_running_loop()
    group = lambda: Group(options, 1, options.get("num_beams", 2), None)
    key = (tuple(sorted(options.items())), 1, None, None)
    futures = [
        batcher.submit(texts, [len(tokenizer(text)["input_ids"]) for text in texts], key, group(), loop)
        for texts in REQUESTS
    ]
    answers = await asyncio.gather(*futures)
    await asyncio.to_thread(batcher.close)
    got = [[found[0].text for found in answer] for answer in answers]
    return got, batcher.batches

def one_by_one(**options) -> list:
    alone = lambda text: translate_nbest(model, tokenizer, [text], 1, **options)[0][0].text
    return [[alone(text) for text in texts] for texts in REQUESTS]

alone, greedy = one_by_one(), one_by_one(num_beams=1)
got, batches = asyncio.run(serve({}))
got_greedy, _ = asyncio.run(serve({"num_beams": 1}))
print(json.dumps({"server": server, "fastapi": "fastapi" in sys.modules and sys.modules["fastapi"] is not None,
                  "got": got, "alone": alone, "batches": batches, "got_greedy": got_greedy, "greedy": greedy}))
"""


def test_the_batcher_imports_and_batches_without_fastapi():
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_FASTAPI], capture_output=True, text=True, env=environment, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["server"].startswith("ImportError"), result["server"]  # the block is real: the app needs FastAPI
    assert result["fastapi"] is False
    assert result["batches"] == 1  # six sentences of three requests, one generate() call
    assert result["got"] == result["alone"]  # batched as translated alone, each request's answers in its order
    assert result["got_greedy"] == result["greedy"]
    assert result["got"][2][2] == ""  # an empty sentence answers an empty translation
