"""Tests of training/synthetic.py: the embedded dates task is deterministic, correct and has disjoint splits."""

from __future__ import annotations

import datetime

from modeling_attn.training.synthetic import NUM_STYLES, build_dataset, format_date, generate_pairs


def test_every_style_keeps_the_date_recoverable():
    date = datetime.date(1987, 3, 3)
    written = [format_date(date, style) for style in range(NUM_STYLES)]
    assert len(set(written)) == NUM_STYLES
    assert "Tuesday, March 3rd, 1987" in written and "03.03.1987" in written and "3. März 1987" in written


def test_deterministic_and_correct():
    assert generate_pairs(50, seed=7) == generate_pairs(50, seed=7)
    assert generate_pairs(50, seed=7) != generate_pairs(50, seed=8)
    for source, target in generate_pairs(200, seed=1):
        date = datetime.date.fromisoformat(target)
        assert source in {format_date(date, style) for style in range(NUM_STYLES)}


def test_splits_are_disjoint():
    splits = build_dataset({"train": 2000, "validation": 100, "test": 200})
    sources = {name: set(table["source"]) for name, table in splits.items()}
    assert {name: len(s) for name, s in sources.items()} == {"train": 2000, "validation": 100, "test": 200}
    assert not sources["train"] & sources["test"] and not sources["train"] & sources["validation"]
    assert not sources["validation"] & sources["test"]
