"""The names of rotated logs, as ``JsonLinesSink(max_bytes=...)`` and logrotate(8) give them.

Two schemes, each after the whole name of the log (``run.jsonl``), gzipped (``compress``, and
``delaycompress`` for all but the newest) or not:

- numbered: ``run.jsonl.1``, ``run.jsonl.2.gz``; the higher the number, the older the file;
- dated (logrotate's ``dateext``): ``run.jsonl-20261203``, or with a ``dateformat`` such as
  ``-%Y-%m-%d-%s`` ``run.jsonl-2026-12-03-1700000000``. logrotate requires its stamps to sort as
  strings in time order and ranks them that way itself, so they are ranked so here.

A dated stamp is a real calendar date (year, month 01-12, day 01-31, each optionally separated by
``-``, ``_`` or ``.``), after one of those separators, then only digits, ``-``, ``_`` and ``+``
(hour, minute, second, ``%s``, ``%z``): ``run.jsonl-20261399``, ``run.jsonl-2026-notes`` or
``run.jsonl-20261203-copy`` are not rotations. Not recognised (read as logs of their own, never
merged into another): logrotate's ``extension`` (``run.1.jsonl``), a stamp of ``%s`` or ``%V``
alone, and compressors other than gzip, which the reader cannot read anyway.
"""

from __future__ import annotations

import os
import re
from typing import Final, NamedTuple

from ckpt_events._public_home import publish

__all__ = ["RotatedName", "oldest_first", "rotated_name"]

#: ``.N``: the sink's own ``max_bytes`` rotation and logrotate's default (6 digits: a
#: ``.%Y%m%d`` stamp has 8, and is a date, not the 20-millionth rotation).
_NUMBERED: Final = re.compile(r"(?P<log>.+)\.(?P<n>[0-9]{1,6})")
#: ``<sep><date>[<sep>?<digits>...]``, the log's name as long as it can be (``app-2026-12-01``
#: rotated is ``app-2026-12-01-20261203``). After the date, one digit (and at most one ``-``,
#: ``_`` or ``+``) a step: no ``.``, so ``x-20261203.1`` is ``x-20261203``'s first rotation.
_DATED: Final = re.compile(
    r"(?P<log>.+)[-_.]"
    r"(?P<stamp>(?:19|2[0-9])[0-9]{2}[-_.]?(?:0[1-9]|1[0-2])[-_.]?(?:0[1-9]|[12][0-9]|3[01])"
    r"(?:[-_+]?[0-9])*)"
)


class RotatedName(NamedTuple):
    """A rotated log's name, read: the log it was rotated from (its path, as given), where it
    ranks among that log's rotations, and whether it is gzipped."""

    #: The path of the log it was rotated from: ``dir/run.jsonl`` for ``dir/run.jsonl.2.gz``.
    log: str
    #: The number (``2``) of a numbered rotation, ``None`` for a dated one.
    number: int | None
    #: The stamp (``20261203``) of a dated rotation, ``None`` for a numbered one.
    stamp: str | None
    #: Gzipped (logrotate's ``compress``): ``.gz`` follows the rotated name.
    compressed: bool


def rotated_name(path: str | os.PathLike[str]) -> RotatedName | None:
    """``path`` read as a rotated log's name (numbered or dated, gzipped or not), or ``None``
    when it is not one. The name alone decides: whether the log it names exists is not looked at."""
    full = os.fspath(path)
    head, name = os.path.split(full)
    compressed = name.endswith(".gz")
    bare = name.removesuffix(".gz")
    # Dated first: ``x.2026.12.03`` is ``x`` on 3 December, not ``x.2026.12``'s third rotation.
    if (dated := _DATED.fullmatch(bare)) is not None:
        return RotatedName(os.path.join(head, dated["log"]), None, dated["stamp"], compressed)
    if (numbered := _NUMBERED.fullmatch(bare)) is not None:
        return RotatedName(os.path.join(head, numbered["log"]), int(numbered["n"]), None, compressed)
    return None


def oldest_first(path: str | os.PathLike[str]) -> tuple[str, int, int, str]:
    """Sort key: each log after its rotations, which come oldest first (``.3``, ``.2``, ``.1``;
    dated ones by their stamps), logs by name. A log rotated under both schemes (its ``dateext``
    set or unset midway) has its numbered rotations first: which are older is not in the names."""
    full = os.fspath(path)
    rotated = rotated_name(full)
    if rotated is None:
        return (full, 2, 0, "")
    if rotated.number is not None:
        return (rotated.log, 0, -rotated.number, "")
    return (rotated.log, 1, 0, rotated.stamp or "")


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.jsonl", RotatedName, oldest_first, rotated_name)
