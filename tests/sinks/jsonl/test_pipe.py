"""JsonLinesSink on a named pipe whose reader is missing or has stopped reading: the server
neither waits for it at start nor freezes mid-run; the lost batches are counted."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events

#: How long a step may take before it is taken for a hang (each takes milliseconds).
DEADLINE = 10.0


def _drain(reader: int) -> bytes:
    """What the pipe holds now (the reader is non-blocking)."""
    chunks = []
    for _ in range(10_000):  # bounded: a pipe holds 64 KiB by default, 1 MiB at most
        try:
            chunk = os.read(reader, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _open_here(path: Path) -> bool:
    """Whether this process has ``path`` open for writing (Linux's ``/proc/self/fd``)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path) and _writable(int(fd)):
                return True
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return False


def _writable(fd: int) -> bool:
    return (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) != os.O_RDONLY


def test_a_pipe_with_no_reader_fails_at_once_saying_so(tmp_path: Path) -> None:
    """Was: ``JsonLinesSink(fifo)`` waited in ``open()`` for a reader for ever, so a server given
    a named pipe as its log never started, and said nothing."""
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    outcome: list[BaseException | JsonLinesSink] = []

    def construct() -> None:
        try:
            outcome.append(JsonLinesSink(path))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=construct, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    hung = thread.is_alive()
    if hung:  # release the thread from its open() before failing
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(DEADLINE)
    assert not hung, "JsonLinesSink waited for the pipe's reader"
    (error,) = outcome
    assert isinstance(error, OSError) and error.errno == errno.ENXIO
    assert "named pipe with no reader" in str(error) and "start the process reading it" in str(error)
    assert str(path) in str(error)


def test_a_pipe_whose_reader_stopped_fails_batches_not_the_server(tmp_path: Path) -> None:
    """Was: on the event loop (the default), the write that found the pipe's 64 KiB full waited
    for the reader for ever, freezing the server with it. Now that batch fails: counted by the
    sink and the bus, every event delivered or failed, and the pipe holds only whole lines but
    for counted torn ones."""
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    results: dict[str, Any] = {}

    async def serve() -> None:
        sink = JsonLinesSink(path)
        results["sink"] = sink
        async with Bus() as bus:
            bus.subscribe(sink, name="log")
            tel = Telemetry(bus, kind="agent", instance="a0")
            started = time.monotonic()
            for n in range(3000):  # about 400 KiB of lines: the pipe fills after 500 or so
                tel.refused("admission_closed", checkpoint_id=f"checkpoint-{n}")
                if n % 100 == 0:
                    await bus.flush()
            await bus.flush()
            results["took"] = time.monotonic() - started
        results["bus"] = bus.stats().sink("log")

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    thread.join(DEADLINE)
    hung = thread.is_alive()
    data = bytearray()
    for _ in range(1000):  # release a write waiting on the pipe (before the fix), bounded
        data += _drain(reader)
        if not thread.is_alive():
            break
        thread.join(0.01)
    data += _drain(reader)
    os.close(reader)
    assert not hung, "the server froze on a write to a pipe nobody reads"

    bus, sink = results["bus"], results["sink"].stats()
    assert bus.emitted == 3000 and bus.delivered + bus.failed == 3000 and bus.pending == 0
    assert bus.failed > 0 and "pipe is full" in (bus.error or "")
    assert sink.failed > 0 and sink.write_errors > 0
    read = [event for _, event in read_events(io.BytesIO(bytes(data)))]
    corrupt = [event for event in read if isinstance(event, CorruptLine)]
    assert len(read) - len(corrupt) == sink.events
    assert len(corrupt) <= sink.torn_lines


@pytest.mark.parametrize("blocking", [False, True])
def test_a_pipe_read_as_it_is_written_loses_nothing(tmp_path: Path, blocking: bool) -> None:
    """A reader keeping up gets every line, on the loop and in a worker thread (which, alone,
    waits for a slow reader)."""
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    data = bytearray()

    async def serve() -> None:
        sink = JsonLinesSink(path, blocking=blocking)
        async with Bus() as bus:
            bus.subscribe(sink, name="log")
            tel = Telemetry(bus, kind="agent", instance="a0")
            for n in range(200):
                tel.refused("admission_closed", checkpoint_id=f"c{n}")
                await bus.flush()
                data.extend(_drain(reader))
        assert bus.stats().sink("log").delivered == 200

    try:
        anyio.run(serve)
        data += _drain(reader)
    finally:
        os.close(reader)
    assert len([event for _, event in read_events(io.BytesIO(bytes(data)))]) == 200


def test_closing_while_a_write_is_stuck_returns_and_the_write_closes_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: with ``blocking=True`` and the worker thread stuck writing to a full pipe, the bus
    closing its sinks as its owner was cancelled (a Ctrl-C, a shutdown deadline) called the
    sink's ``close()`` on the event loop, which waited for the stuck write's lock for ever: the
    server never stopped. Now ``close()`` gives up after ``CLOSE_WAIT``, says so once, and the
    write closes the file when it returns."""
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a reader that does not read, yet
    results: dict[str, Any] = {}

    async def serve() -> None:
        sink = JsonLinesSink(path, blocking=True)
        results["sink"] = sink
        with anyio.move_on_after(1):  # the owner's deadline, reached with the write stuck
            async with Bus(close_timeout=1) as bus:
                bus.subscribe(sink, name="log")
                tel = Telemetry(bus, kind="agent", instance="a0")
                for n in range(1000):  # about 140 KiB: the 64 KiB pipe fills
                    tel.refused("admission_closed", checkpoint_id=f"checkpoint-{n}")
                    if n % 100 == 0:
                        await bus.flush(timeout=0.1)
                await anyio.sleep(DEADLINE)
        started = time.monotonic()
        sink.close()  # again, by its owner: returns as well
        results["second_close"] = time.monotonic() - started

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    thread.join(DEADLINE)
    hung = thread.is_alive()
    for _ in range(1000):  # read the pipe: the stuck write returns (bounded)
        _drain(reader)
        if not thread.is_alive():
            break
        thread.join(0.01)
    for _ in range(1000):  # the write goes on once read; it closes the file when done
        _drain(reader)
        if not _open_here(path):
            break
        time.sleep(0.01)
    os.close(reader)
    assert not hung, "the event loop waited for ever in the sink's close()"
    assert results["second_close"] < DEADLINE / 2
    assert not _open_here(path)
    said = [r for r in caplog.records if "closed while a write was stuck" in r.getMessage()]
    assert len(said) == 1
