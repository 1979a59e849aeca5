"""``rotated_name`` reads both of logrotate's naming schemes (numbers, ``dateext``) and nothing
that merely ends like a date; ``oldest_first`` puts each log after its rotations, oldest first."""

from __future__ import annotations

import random

import pytest

from ckpt_events.sinks.jsonl import RotatedName, oldest_first, rotated_name
from ckpt_events.sinks.replay import is_rotated


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("d/run.jsonl.1", RotatedName("d/run.jsonl", 1, None, False)),
        ("run.jsonl.12.gz", RotatedName("run.jsonl", 12, None, True)),
        # dateext's default -%Y%m%d, hourly's -%Y%m%d%H, a dateformat of -%Y-%m-%d-%s, and .%Y.%m.%d
        ("d/run.jsonl-20261203", RotatedName("d/run.jsonl", None, "20261203", False)),
        ("run.jsonl-20261203.gz", RotatedName("run.jsonl", None, "20261203", True)),
        ("run.jsonl-2026120317", RotatedName("run.jsonl", None, "2026120317", False)),
        ("run.jsonl-2026-12-03-1700000000", RotatedName("run.jsonl", None, "2026-12-03-1700000000", False)),
        ("run.jsonl.2026.12.03", RotatedName("run.jsonl", None, "2026.12.03", False)),
        ("run.jsonl.20261203", RotatedName("run.jsonl", None, "20261203", False)),
        # a log whose own name holds a date keeps it; a dated log's numbered rotation is numbered
        ("app-2026-12-01-20261203", RotatedName("app-2026-12-01", None, "20261203", False)),
        ("x-20261203.1", RotatedName("x-20261203", 1, None, False)),
    ],
)
def test_both_schemes_are_read(name: str, expected: RotatedName) -> None:
    """Numbered and dated rotations, gzipped or not, give the log they were rotated from."""
    assert rotated_name(name) == expected
    assert is_rotated(name)


@pytest.mark.parametrize(
    "name",
    [
        "run.jsonl",
        "run-20261203.jsonl",  # a log named by its date, not a rotation of one
        "run.jsonl-20261399",  # no 99th day
        "run.jsonl-2026-notes",
        "run.jsonl-20261203-copy",
        "run.jsonl.1234567",  # not a number logrotate reaches, not a date
        "a.jsonl.\u00b2",
        ".1",
        "run.jsonl-1700000000",  # %s alone: not told from a number, so not read as either
    ],
)
def test_a_name_that_only_looks_rotated_is_not(name: str) -> None:
    """A name ending in something date-like or numeric that is not a rotation's suffix is a log of
    its own: never merged into another."""
    assert rotated_name(name) is None
    assert not is_rotated(name)


def test_oldest_first_for_each_scheme() -> None:
    """For numbers, the higher is older; for dates, the earlier (as logrotate sorts its stamps);
    each log comes after its own rotations, and logs do not mix."""
    expected = [
        "d/a.jsonl.2.gz",
        "d/a.jsonl.1",
        "d/a.jsonl",
        "d/run.jsonl.10",
        "d/run.jsonl.9.gz",
        "d/run.jsonl-20261130.gz",
        "d/run.jsonl-20261202",
        "d/run.jsonl-20261203.gz",
        "d/run.jsonl-2026120317",
        "d/run.jsonl",
    ]
    for seed in range(5):
        shuffled = expected[:]
        random.Random(seed).shuffle(shuffled)
        assert sorted(shuffled, key=oldest_first) == expected
