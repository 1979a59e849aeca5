"""JsonLinesSink on a full disk: bounded memory, failures counted, no torn line mid-file, resume."""

from __future__ import annotations

import errno
import io
import logging
import os
import tracemalloc
from pathlib import Path
from typing import IO, Any, cast

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events
from ckpt_events.testing import MemorySink


async def _events(count: int) -> list[Any]:
    """``count`` real events, as a Telemetry emits them."""
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for n in range(count):
            tel.refused("admission_closed", checkpoint_id=f"c{n}")
        await bus.flush()
    return list(memory.events)


class _SmallDisk(io.RawIOBase):
    """A seekable in-memory file with ``space`` bytes free: writes come short, then fail with ENOSPC."""

    def __init__(self, space: int, *, chunk: int = 1000, seekable: bool = True) -> None:
        self.data = bytearray()
        self.space = space
        self.chunk = chunk
        self._seekable = seekable
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def write(self, b: Any, /) -> int:
        data = bytes(b)
        free = self.space - len(self.data)
        if free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        part = data[: min(free, self.chunk)]
        self.data[self._pos : self._pos + len(part)] = part
        self._pos += len(part)
        return len(part)

    def tell(self) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("not seekable")
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("not seekable")
        self._pos = pos
        return pos

    def truncate(self, size: int | None = None) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("not seekable")
        size = self._pos if size is None else size
        del self.data[size:]
        return size


def _lines(data: bytes | bytearray) -> list[Any]:
    return [item for _, item in read_events(io.BytesIO(bytes(data)))]


async def test_dev_full_keeps_memory_bounded_and_counts_every_event() -> None:
    """On /dev/full (ENOSPC) the buffer is cleared after each failed write; every event counts as failed."""
    events = await _events(2000)
    sink = JsonLinesSink(Path("/dev/full"))
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for _ in range(40):  # 40 batches of about 400 KB each: 16 MB if the buffer kept them
            with pytest.raises(OSError) as raised:
                sink.handle(events)
            assert raised.value.errno == errno.ENOSPC
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
        sink.close()
    assert grown < 2_000_000, f"{grown} bytes still held after 40 failed batches"
    stats = sink.stats()
    assert (stats.events, stats.bytes, stats.failed, stats.write_errors) == (0, 0, 40 * 2000, 40)
    assert stats.last_error is not None and "No space left" in stats.last_error


async def test_dev_full_through_the_bus_counts_failed_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """Through the bus, every lost event shows as failed in bus.stats() and the error is logged once."""
    sink = JsonLinesSink(Path("/dev/full"))
    with caplog.at_level(logging.WARNING):
        async with Bus(batch_size=100) as bus:
            bus.subscribe(sink, name="jsonl")
            tel = Telemetry(bus, kind="agent", instance="a0")
            for n in range(1000):
                tel.refused("admission_closed", checkpoint_id=f"c{n}")
                if n % 100 == 99:
                    await bus.flush()
            await bus.flush()
            stats = bus.stats().sink("jsonl")
    assert (stats.delivered, stats.failed, stats.dropped) == (0, 1000, 0)
    assert sink.stats().failed == 1000 and sink.stats().bytes == 0
    assert sink.stats().write_errors == stats.failed_batches >= 10
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


async def test_short_writes_are_finished_and_a_failed_batch_is_truncated_away() -> None:
    """Short writes go on; a failure after one truncates back to the last whole line, and writing resumes."""
    first, second, third = await _events(50), await _events(50), await _events(5)
    disk = _SmallDisk(space=10**9, chunk=700)  # every write short
    sink = JsonLinesSink(cast(IO[bytes], disk))  # a RawIOBase is a binary stream
    sink.handle(first)
    assert len(_lines(disk.data)) == 50 and sink.stats().bytes == len(disk.data)
    disk.space = len(disk.data) + 3000  # part of the second batch fits, then ENOSPC
    with pytest.raises(OSError):
        sink.handle(second)
    assert _lines(disk.data) == first and disk.data.endswith(b"\n")
    stats = sink.stats()
    assert (stats.events, stats.failed, stats.write_errors, stats.bytes) == (50, 50, 1, len(disk.data))
    disk.space = 10**9  # space returns
    sink.handle(third)
    assert _lines(disk.data) == first + third
    stats = sink.stats()
    assert (stats.events, stats.failed, stats.torn_lines, stats.bytes) == (55, 50, 0, len(disk.data))


async def test_unseekable_stream_gets_a_newline_after_a_torn_line() -> None:
    """Where the torn part cannot be truncated, it is ended by a newline before the next line and counted."""
    first, second, third = await _events(10), await _events(10), await _events(3)
    disk = _SmallDisk(space=10**9, chunk=300, seekable=False)
    sink = JsonLinesSink(cast(IO[bytes], disk))  # a RawIOBase is a binary stream
    sink.handle(first)
    size = len(disk.data)
    line = size // 10
    disk.space = size + 3 * line + line // 2  # three lines and a half, then ENOSPC (the newline too)
    with pytest.raises(OSError):
        sink.handle(second)
    disk.space = 10**9
    sink.handle(third)
    items = _lines(disk.data)
    assert items[:13] == first + second[:3]
    assert isinstance(items[13], CorruptLine) and items[14:] == third
    stats = sink.stats()
    assert (stats.events, stats.failed, stats.torn_lines) == (16, 7, 1)
    assert stats.bytes == len(disk.data)
