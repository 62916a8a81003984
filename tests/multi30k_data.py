"""Where the tests find Multi30k, and the mark of a test that needs it (skipped, saying how to get it, without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# this project's machines keep it beside the repository; MULTI30K names another folder (docs/multi30k.md)
BESIDE_THE_REPOSITORY = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
MULTI30K = Path(os.environ.get("MULTI30K", BESIDE_THE_REPOSITORY))
needs_multi30k = pytest.mark.skipif(
    not (MULTI30K / "test_2016_flickr.en.gz").is_file(),
    reason=f"Multi30k not found at {MULTI30K}: docs/multi30k.md ('Get the data') says how to get it; set MULTI30K",
)
