"""The embedded task: human-written dates in many formats -> ISO 8601 dates, generated with no network.

A date such as "Tuesday, March 3rd, 1987", "3. März 1987" or "03.03.1987" must become "1987-03-03". The task has
real alignment structure (day, month and year move to fixed target positions; month names map to numbers; weekday
names must be ignored) and is deterministic: the same seed gives the same sentences on every machine. The splits
are disjoint by source sentence.
"""

from __future__ import annotations

import datetime
import random

from datasets import Dataset, DatasetDict

SOURCE_LANG = "date"
TARGET_LANG = "iso"
SPLIT_SIZES = {"train": 20_000, "validation": 300, "test": 1_000}

_FIRST_DAY = datetime.date(1900, 1, 1).toordinal()
_LAST_DAY = datetime.date(2099, 12, 31).toordinal()
_MONTHS_EN = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"]  # fmt: skip
_MONTHS_DE = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
              "November", "Dezember"]  # fmt: skip
_DAYS_EN = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_DAYS_DE = ["Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"]


def _ordinal(day: int) -> str:
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def format_date(date: datetime.date, style: int) -> str:
    """`date` written in human style number `style` (0 <= style < NUM_STYLES)."""
    d, m, y = date.day, date.month, date.year
    month, month_de = _MONTHS_EN[m - 1], _MONTHS_DE[m - 1]
    weekday, weekday_de = _DAYS_EN[date.weekday()], _DAYS_DE[date.weekday()]
    styles = [
        f"{d} {month} {y}",
        f"{month} {d}, {y}",
        f"{weekday}, {month} {_ordinal(d)}, {y}",
        f"{weekday[:3].lower()} {d} {month[:3].lower()} {y}",
        f"{d:02d}.{m:02d}.{y}",
        f"{m}/{d}/{y}",
        f"the {_ordinal(d)} of {month} {y}",
        f"{month.upper()} {d} {y}",
        f"{d}. {month_de} {y}",
        f"{weekday_de}, {d}. {month_de} {y}",
        f"{y}, {month} {d}",
        f"{d} {month[:3]}. {y}",
    ]
    return styles[style]


NUM_STYLES = 12


def generate_pairs(count: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """`count` distinct (human date, ISO date) pairs drawn with `seed`, none of whose sources is in `exclude`."""
    rng = random.Random(seed)
    pairs: dict[str, str] = {}
    while len(pairs) < count:
        date = datetime.date.fromordinal(rng.randint(_FIRST_DAY, _LAST_DAY))
        source = format_date(date, rng.randrange(NUM_STYLES))
        if source not in exclude and source not in pairs:
            pairs[source] = date.isoformat()
    return list(pairs.items())


def build_dataset(sizes: dict[str, int] | None = None, seed: int = 0) -> DatasetDict:
    """The embedded task as a DatasetDict of {"source", "target"} strings with train/validation/test splits."""
    sizes = {**SPLIT_SIZES, **(sizes or {})}
    splits, seen = {}, set()
    # Test first, then validation, then train, so that held-out sentences never appear in training.
    for offset, split in enumerate(["test", "validation", "train"]):
        pairs = generate_pairs(sizes[split], seed * 1000 + offset, exclude=seen)
        seen.update(source for source, _ in pairs)
        splits[split] = Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    return DatasetDict({name: splits[name] for name in ["train", "validation", "test"]})
