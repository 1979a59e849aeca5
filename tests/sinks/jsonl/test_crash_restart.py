"""JsonLinesSink after a crash: a restarted writer ends the torn tail first, so no new event is
lost; rotation and several writers on one file keep whole lines (issue 29's attacks, kept)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events

# A writer process: appends `batches` batches of `size` events for `instance` (forever if
# batches < 0), reopening its sink every `reopen` batches, as a restarted process would.
_WRITER = """
import sys
from ckpt_events import Refused
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.vocab import ErrorCode

path, instance, batches, size, reopen = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
sink = JsonLinesSink(path)
print("ready", flush=True)
n = 0
while n != batches:
    sink.handle([Refused(kind="agent", instance=instance, time_ns=n * size + i, code=ErrorCode.UNAUTHORIZED)
                 for i in range(size)])
    n += 1
    if n % reopen == 0:
        sink.close()
        sink = JsonLinesSink(path)
sink.close()
"""


def _writer(
    path: Path, instance: str, batches: int, size: int, reopen: int = 1 << 30
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", _WRITER, str(path), instance, str(batches), str(size), str(reopen)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _read(path: Path) -> tuple[list[Any], list[CorruptLine]]:
    events: list[Any] = []
    corrupt: list[CorruptLine] = []
    for _, item in read_events(path):
        if isinstance(item, CorruptLine):
            corrupt.append(item)
        else:
            events.append(item)
    return events, corrupt


async def _append(path: Path, instance: str, count: int, **options: Any) -> JsonLinesSink:
    sink = JsonLinesSink(path, **options)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance=instance)
        for _ in range(count):
            tel.refused("unauthorized", checkpoint_id=f"c-{instance}")
    return sink


async def test_a_restart_after_a_torn_tail_loses_no_new_event(tmp_path: Path) -> None:
    """A file cut mid-line (a writer killed mid-write), then a new sink appends: the fragment is
    one corrupt line, every new event reads back, and the sink counts the line it ended."""
    path = tmp_path / "e.jsonl"
    await _append(path, "before", 100)
    whole = path.read_bytes()
    path.write_bytes(whole[:-30])  # the last line torn
    sink = await _append(path, "after", 10)
    events, corrupt = _read(path)
    assert [c.line for c in corrupt] == [100]
    assert [e.instance for e in events] == ["before"] * 99 + ["after"] * 10
    assert sink.stats().torn_lines == 1 and sink.stats().events == 10
    assert sink.stats().bytes == path.stat().st_size - (len(whole) - 30)  # its newline counted
    clean = await _append(path, "again", 1)  # a file that ends a line is left as it is
    assert clean.stats().torn_lines == 0 and len(_read(path)[0]) == 110


async def test_a_rotating_sink_ends_the_torn_tail_before_it_appends_or_rotates(tmp_path: Path) -> None:
    """With max_bytes, the torn line is ended in the file it is in, and rotation keeps whole lines."""
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"type":"refused","kind":"agent","inst')
    sink = await _append(path, "after", 40, max_bytes=1000, backups=20)
    assert sink.stats().rotations >= 2 and sink.stats().torn_lines == 1
    files = sorted(tmp_path.iterdir(), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    found = [_read(file) for file in files]
    assert sum(len(events) for events, _ in found) == 40
    assert [len(corrupt) for _, corrupt in found] == [1] + [0] * (len(files) - 1)  # the oldest file
    assert all(file.read_bytes().endswith(b"\n") for file in files)


def test_an_empty_file_or_a_device_gets_no_newline(tmp_path: Path) -> None:
    """Only a regular file that ends mid-line is ended: a new file and /dev/null are left alone."""
    for path in (tmp_path / "new.jsonl", Path(os.devnull)):
        sink = JsonLinesSink(path)
        sink.close()
        assert (sink.stats().torn_lines, sink.stats().bytes) == (0, 0)
    assert (tmp_path / "new.jsonl").read_bytes() == b""


@pytest.mark.slow
def test_sigkill_mid_write_then_restart_loses_no_new_event(tmp_path: Path) -> None:
    """Rounds of a writer SIGKILLed as its file grows (so mostly inside a multi-megabyte
    write()), then a restarted writer: each torn tail is one corrupt line, nothing else is, and
    every restarted event reads back."""
    path = tmp_path / "e.jsonl"
    rounds, torn = 4, 0
    for round_ in range(rounds):
        with _writer(path, f"killed{round_}", -1, 20_000) as writer:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
            size = path.stat().st_size
            deadline = time.monotonic() + 30
            while path.stat().st_size == size and time.monotonic() < deadline:
                pass  # the first write() has begun: the size moves page by page while it runs
            writer.send_signal(signal.SIGKILL)
        torn += not path.read_bytes().endswith(b"\n")
        with _writer(path, f"after{round_}", 1, 10) as restarted:
            assert restarted.wait(timeout=60) == 0
    events, corrupt = _read(path)
    assert len(corrupt) == torn
    for round_ in range(rounds):
        assert [e.time_ns for e in events if e.instance == f"after{round_}"] == list(range(10))
    print(f"torn tails left by SIGKILL: {torn} of {rounds}")


@pytest.mark.slow
def test_two_writers_on_one_file_reopening_as_they_go_tear_no_line(tmp_path: Path) -> None:
    """Two processes append to one file at once, each reopening its sink every few batches (so
    one checks the file's end while the other writes): no line is torn, no event lost or moved,
    and no blank line (the other's write in progress, whose size grows a page at a time, was taken
    for a torn line and ended with a newline)."""
    path = tmp_path / "shared.jsonl"
    with _writer(path, "w0", 40, 2_000, reopen=3) as w0, _writer(path, "w1", 40, 2_000, reopen=3) as w1:
        assert (w0.wait(timeout=120), w1.wait(timeout=120)) == (0, 0)
    events, corrupt = _read(path)
    assert corrupt == []
    assert path.read_bytes().count(b"\n\n") == 0
    for name in ("w0", "w1"):
        assert [e.time_ns for e in events if e.instance == name] == list(range(80_000))
