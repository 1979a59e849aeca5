"""The JSON-lines reader: ``read_events`` yields each line's event, or a ``CorruptLine`` saying
why it did not decode, and goes on.

Ids are read as W3C hex strings, as ``JsonLinesSink`` writes them (``sinks._hexids``), and older
logs with decimal ids still read.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import IO, Final

import msgspec

from ckpt_events import CheckpointEvent, InvalidTypeError
from sinks._hexids import WIRE_DECODER, from_wire

__all__ = ["CorruptLine", "read_events"]

_EXCERPT: Final = 120


class CorruptLine(msgspec.Struct, frozen=True):
    """A line that did not decode as a ``CheckpointEvent``: its 1-based number and why."""

    line: int
    error: str
    excerpt: str


def read_events(
    source: str | os.PathLike[str] | IO[bytes],
) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    """Yield ``(line_number, event)`` for each line of a JSON-lines log, in order.

    A line that does not decode yields a ``CorruptLine`` instead and reading goes on; blank
    lines are skipped. Line numbers are 1-based.
    """
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as file:
            yield from _read(file)
    elif isinstance(source, io.IOBase) or hasattr(source, "readline"):
        yield from _read(source)
    else:
        raise InvalidTypeError(f"source must be a path or a binary stream, not {source!r}")


def _read(file: IO[bytes]) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    decode = WIRE_DECODER.decode
    for number, raw in enumerate(file, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            yield number, from_wire(decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            excerpt = line[:_EXCERPT].decode("utf-8", "replace")
            yield number, CorruptLine(line=number, error=str(exc), excerpt=excerpt)
