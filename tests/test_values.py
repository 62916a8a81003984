"""`modeling_attn.api.values.Range`: the declared values of a number (issue 34), checked by hand-picked values on
each side of each bound, and the words of each message."""

from __future__ import annotations

import math

import pytest

from modeling_attn.api.values import COUNT, FINITE, NATURAL, NON_NEGATIVE, POSITIVE, PROBABILITY, Range

MAX_STEPS = Range(low=1, integer=True, also=(-1,), meaning="-1: train for --num_train_epochs")


@pytest.mark.parametrize(
    ("declared", "inside", "outside", "words"),
    [
        (COUNT, [1, 2, 10**9], [0, -1, 1.5, math.nan, True, "3", None], "a positive integer"),
        (NATURAL, [0, 1, 7], [-1, 0.5, math.inf], "an integer of 0 or more"),
        (PROBABILITY, [0, 0.0, 0.5, 1, 1.0], [-1e-9, 1.000001, math.nan, math.inf], "a probability in [0, 1]"),
        (POSITIVE, [1e-12, 3, 0.5], [0, 0.0, -2, math.inf, math.nan], "a finite number above 0"),
        (NON_NEGATIVE, [0, 0.0, 2.5], [-1e-9, math.inf, math.nan], "a finite number of 0 or more"),
        (FINITE, [-1e300, 0, 1e300, -2], [math.nan, math.inf, -math.inf], "a finite number"),
        (Range(low=0, high=1, high_open=True), [0, 0.999], [1, 1.0, -0.1], "a number in [0, 1)"),
        (Range(low=0, high=1, low_open=True), [1, 1e-9], [0, 1.1], "a probability in (0, 1]"),
        (Range(low=2, high=8, integer=True), [2, 8], [1, 9, 4.5], "an integer in [2, 8]"),
        (
            MAX_STEPS,
            [-1, 1, 100],
            [0, -5, -2, math.nan],
            "a positive integer or -1 (-1: train for --num_train_epochs)",
        ),
    ],
)
def test_a_range_holds_what_it_says_and_names_itself(declared, inside, outside, words):
    assert declared.describe() == words
    for value in inside:
        assert declared.contains(value) and declared.problem(value) is None, value
    for value in outside:
        assert not declared.contains(value), value
        assert declared.problem(value) == f"must be {words}, got {value}"


def test_check_names_the_argument_and_lets_none_through():
    COUNT.check("num_beams", None)
    COUNT.check("num_beams", 4)
    with pytest.raises(ValueError, match=r"^num_beams must be a positive integer, got 0$"):
        COUNT.check("num_beams", 0)
