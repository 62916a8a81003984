"""The values a number takes, declared once where the number is declared (issue 34): `Range`.

A flag declares its range in its dataclass field's metadata (`field(default=5, metadata={"help": ..., "range":
COUNT})`) or, for transformers' own `Seq2SeqTrainingArguments` flags, in a mapping of flag names to ranges
(`modeling_attn.training.arguments.TRAINER_RANGES`); `modeling_attn.cli.parser.CommandParser` checks every declared
flag once, right after parsing and before any work, and a float flag with no declaration must at least be finite. The
Python API (`modeling_attn.api.translation.translate`) checks its arguments with the same ranges.

A message reads `must be RANGE, got VALUE` (`Range.problem`): "must be a positive integer, got 0", "must be a
probability in [0, 1], got 1.5", "must be a positive integer or -1 (-1: ...), got -5".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """Finite numbers from `low` to `high` (None: no bound; `low_open` / `high_open`: the bound itself excluded),
    whole numbers only if `integer`; `also`: documented special values outside the range, whose meaning `meaning`
    says (e.g. -1 for `--max_steps`: train for `--num_train_epochs`)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    also: tuple[float, ...] = ()
    meaning: str = ""

    def describe(self) -> str:
        """The range in words, for a message: "a positive integer", "a probability in [0, 1]"..."""
        if self.integer and self.high is None and self.low in (0, 1) and not self.low_open:
            text = "a positive integer" if self.low == 1 else "an integer of 0 or more"
        elif self.high is None and self.low == 0:
            text = "a finite number above 0" if self.low_open else "a finite number of 0 or more"
        elif self.low is None and self.high is None:
            text = "an integer" if self.integer else "a finite number"
        else:
            left = "(" if self.low_open or self.low is None else "["
            right = ")" if self.high_open or self.high is None else "]"
            low = "-inf" if self.low is None else _number(self.low)
            high = "inf" if self.high is None else _number(self.high)
            probability = (self.low, self.high) == (0, 1) and not self.high_open
            noun = "an integer" if self.integer else "a probability" if probability else "a number"
            text = f"{noun} in {left}{low}, {high}{right}"
        if self.also:
            text += " or " + " or ".join(_number(value) for value in self.also)
            text += f" ({self.meaning})" if self.meaning else ""
        return text

    def contains(self, value: Any) -> bool:
        """Whether `value` is in the range (or one of the special values); a bool is never a number here."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if value in self.also:
            return True
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or (value < self.high or (not self.high_open and value == self.high))

    def problem(self, value: Any) -> str | None:
        """None if `value` is in the range, else "must be RANGE, got VALUE"."""
        return None if self.contains(value) else f"must be {self.describe()}, got {value}"

    def check(self, name: str, value: Any) -> None:
        """Raise ValueError naming `name` unless `value` is None or in the range (for Python functions' arguments)."""
        if value is not None and (problem := self.problem(value)):
            raise ValueError(f"{name} {problem}")


def _number(value: float) -> str:
    """A bound as written: 4294967295, not 4.29497e+09; 0.5 as 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


COUNT = Range(low=1, integer=True)
"""A positive integer: sizes, counts of steps, beams, samples."""
NATURAL = Range(low=0, integer=True)
"""An integer of 0 or more, where 0 means something documented (no workers, sentence batches, print none)."""
PROBABILITY = Range(low=0, high=1)
"""A probability in [0, 1]."""
POSITIVE = Range(low=0, low_open=True)
"""A finite number above 0 (a rate, a temperature, a ratio-or-count of steps)."""
NON_NEGATIVE = Range(low=0)
"""A finite number of 0 or more (a weight, a threshold, a norm where 0 turns the thing off)."""
FINITE = Range()
"""Any finite number: what a float flag with no declaration must be (no nan, no inf)."""

__all__ = ["COUNT", "FINITE", "NATURAL", "NON_NEGATIVE", "POSITIVE", "PROBABILITY", "Range"]
