"""The embedded task: human-written dates in many formats -> ISO 8601 dates, generated with no network.

A date such as "Tuesday, March 3rd, 1987", "3. März 1987" or "03.03.1987" must become "1987-03-03". The task has
real alignment structure (day, month and year move to fixed target positions; month names map to numbers; weekday
names must be ignored) and is deterministic: the same seed gives the same sentences on every machine. The splits
are disjoint by source sentence.

The generator knows the true word alignment of every pair (`generate_aligned_pairs`, `build_dataset(...,
alignments=True)`), as Pharaoh lines `i-j` (source word i, target word j, 0-based) over the "alnum" words of
`modeling_attn.api.alignment.split_words`: runs of letters and digits, each with the punctuation around it, so that
"1987-03-03" is the three words "1987-", "03-", "03" (year, month, day) and "Tuesday, March 3rd, 1987" the four words
"Tuesday,", "March", "3rd,", "1987". Each target word is linked to the source word that writes the same field; weekday
names and the words "the" and "of" are unaligned (sure links only, Och & Ney 2003: no "possible" ones).
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
_MONTHS_EN = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_MONTHS_DE = [
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
]
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

# The field each "alnum" word of a style writes (None: no target counterpart), in the order of `format_date`'s styles.
STYLE_FIELDS = [
    ("day", "month", "year"),  # 3 March 1987
    ("month", "day", "year"),  # March 3, 1987
    (None, "month", "day", "year"),  # Tuesday, March 3rd, 1987
    (None, "day", "month", "year"),  # tue 3 mar 1987
    ("day", "month", "year"),  # 03.03.1987
    ("month", "day", "year"),  # 3/3/1987
    (None, "day", None, "month", "year"),  # the 3rd of March 1987
    ("month", "day", "year"),  # MARCH 3 1987
    ("day", "month", "year"),  # 3. März 1987
    (None, "day", "month", "year"),  # Dienstag, 3. März 1987
    ("year", "month", "day"),  # 1987, March 3
    ("day", "month", "year"),  # 3 Mar. 1987
]
TARGET_FIELDS = ("year", "month", "day")  # the words of an ISO date: "1987-", "03-", "03"


def true_alignment(style: int) -> str:
    """The word alignment of every pair written in `style`, as a Pharaoh line (source word - target word)."""
    return " ".join(
        f"{source}-{TARGET_FIELDS.index(field)}"
        for source, field in enumerate(STYLE_FIELDS[style])
        if field is not None
    )


def _draw(count: int, seed: int, exclude: set[str]) -> dict[str, tuple[str, int]]:
    """`count` distinct sources drawn with `seed` (none in `exclude`) -> (ISO date, style)."""
    rng = random.Random(seed)
    pairs: dict[str, tuple[str, int]] = {}
    while len(pairs) < count:
        date = datetime.date.fromordinal(rng.randint(_FIRST_DAY, _LAST_DAY))
        style = rng.randrange(NUM_STYLES)
        source = format_date(date, style)
        if source not in exclude and source not in pairs:
            pairs[source] = (date.isoformat(), style)
    return pairs


def generate_pairs(count: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """`count` distinct (human date, ISO date) pairs drawn with `seed`, none of whose sources is in `exclude`."""
    return [(source, target) for source, (target, _) in _draw(count, seed, exclude).items()]


def generate_aligned_pairs(count: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str, str]]:
    """`generate_pairs`' pairs, each with its true word alignment: (source, target, Pharaoh line)."""
    drawn = _draw(count, seed, exclude)
    return [(source, target, true_alignment(style)) for source, (target, style) in drawn.items()]


def build_dataset(sizes: dict[str, int] | None = None, seed: int = 0, alignments: bool = False) -> DatasetDict:
    """The embedded task as a DatasetDict of {"source", "target"} strings with train/validation/test splits; with
    `alignments`, an "alignment" column too (each pair's true word alignment, a Pharaoh line)."""
    sizes = {**SPLIT_SIZES, **(sizes or {})}
    splits, seen = {}, set()
    # Test first, then validation, then train, so that held-out sentences never appear in training.
    for offset, split in enumerate(["test", "validation", "train"]):
        triples = generate_aligned_pairs(sizes[split], seed * 1000 + offset, exclude=seen)
        seen.update(source for source, _, _ in triples)
        columns = {"source": [s for s, _, _ in triples], "target": [t for _, t, _ in triples]}
        if alignments:
            columns["alignment"] = [a for _, _, a in triples]
        splits[split] = Dataset.from_dict(columns)
    return DatasetDict({name: splits[name] for name in ["train", "validation", "test"]})
