"""JsonLinesSink: round trip through read_events, whole lines, rotation, bad arguments.

Reading corrupt and long lines: ``test_reader.py``; hex ids: ``tests/sinks/test_hexids.py``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_events import (
    Bus,
    CheckpointEvent,
    InvalidArgumentError,
    OperationFinished,
    Redactor,
    Telemetry,
)
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import REDACTED, Kind
from tests.ckpt_events.strategies import any_event
from tests.sinks.helpers import every_event_type


async def test_round_trip_of_every_event_type(tmp_path: Path) -> None:
    """Each line decodes back into the same typed event, for every event type."""
    path = tmp_path / "events.jsonl"
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory)
        sink = JsonLinesSink(path)
        bus.subscribe(sink)
        await every_event_type(bus)
        await bus.flush()
    assert {type(e) for e in memory.events} == set(get_args(CheckpointEvent))
    lines = path.read_bytes().splitlines()
    assert [event for _, event in read_events(path)] == memory.events
    assert [n for n, _ in read_events(path)] == list(range(1, len(lines) + 1))
    assert sink.stats().events == len(lines) and sink.stats().bytes == path.stat().st_size
    first = msgspec.json.decode(lines[0])
    assert {"type", "trace_id", "span_id", "start_ns", "kind", "instance"} <= set(first)


async def test_stream_target_is_flushed_not_closed() -> None:
    """A binary stream gets whole lines and stays open after aclose()."""
    stream = io.BytesIO()
    sink = JsonLinesSink(stream)
    async with Bus() as bus:
        bus.subscribe(sink)
        Telemetry(bus, kind="agent", instance="a0").refused("unauthorized")
        await bus.flush()
    assert not stream.closed
    assert stream.getvalue().endswith(b"\n") and stream.getvalue().count(b"\n") == 1
    sink.handle([])  # after close: ignored
    assert stream.getvalue().count(b"\n") == 1


async def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    """A second sink on the same path appends."""
    path = tmp_path / "e.jsonl"
    for _ in range(2):
        async with Bus() as bus:
            bus.subscribe(JsonLinesSink(path))
            Telemetry(bus, kind="agent", instance="a0").refused("unauthorized")
    assert len(list(read_events(path))) == 2


async def test_rotation_keeps_whole_lines_and_backups(tmp_path: Path) -> None:
    """Rotated files hold only whole lines, stay under max_bytes, and keep `backups` files."""
    path = tmp_path / "e.jsonl"
    sink = JsonLinesSink(path, max_bytes=1000, backups=50)
    async with Bus(batch_size=7) as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(100):
            tel.refused("admission_closed", checkpoint_id="c1")
        await bus.flush()
    files = sorted(tmp_path.iterdir())
    assert len(files) > 3 and sink.stats().rotations == len(files) - 1
    total = 0
    for file in files:
        data = file.read_bytes()
        assert len(data) <= 1000 and data.endswith(b"\n")
        items = [e for _, e in read_events(file)]
        assert not any(isinstance(e, CorruptLine) for e in items)
        total += len(items)
    assert total == 100


async def _forty_refusals(path: Path, backups: int) -> JsonLinesSink:
    """40 refusals written to ``path``, rotated past 300 bytes with ``backups`` kept; the sink."""
    sink = JsonLinesSink(path, max_bytes=300, backups=backups)
    async with Bus(batch_size=3) as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(40):
            tel.refused("admission_closed")
        await bus.flush()
    return sink


async def test_rotation_drops_beyond_backups(tmp_path: Path) -> None:
    """Only `backups` rotated files are kept; backups=0 keeps none."""
    for backups in (0, 2):
        path = tmp_path / f"b{backups}.jsonl"
        await _forty_refusals(path, backups)
        kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name))
        assert kept == [path.name] + [f"{path.name}.{n}" for n in range(1, backups + 1)]


async def test_files_deleted_by_rotation_are_counted_and_backups_0_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: a rotation deleted the oldest file (with ``backups=0``, the whole log at each
    rotation, where ``logging.RotatingFileHandler(backupCount=0)`` never rotates) and nothing
    counted or said it. Now ``stats().deleted`` counts the files deleted, and ``backups=0``
    says once that the log is deleted at each rotation."""
    counts = {}
    for backups in (0, 2):
        path = tmp_path / f"b{backups}.jsonl"
        sink = await _forty_refusals(path, backups)
        stats = sink.stats()
        kept = sum(1 for p in tmp_path.iterdir() if p.name.startswith(path.name))
        # Every rotation made one file; what is not there now was deleted.
        assert stats.rotations + 1 - kept == stats.deleted > 0
        counts[backups] = stats.deleted
    assert counts[0] > counts[2]
    said = [r.getMessage() for r in caplog.records if "backups=0" in r.getMessage()]
    assert len(said) == 1 and "b0.jsonl" in said[0] and "stats().deleted" in said[0]


async def test_a_line_longer_than_max_bytes_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: ``max_bytes`` smaller than one line (``max_bytes=10`` meant as 10 MB) wrote each line
    to a file of its own, past ``max_bytes``, and with ``backups=3`` kept the last four lines,
    without a word. Now the first such line is logged once, with its size and ``max_bytes``."""
    path = tmp_path / "e.jsonl"
    sink = JsonLinesSink(path, max_bytes=10, backups=3)
    async with Bus(batch_size=3) as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(20):
            tel.refused("admission_closed")
        await bus.flush()
    assert sink.stats().events == 20
    said = [r.getMessage() for r in caplog.records if "longer than max_bytes" in r.getMessage()]
    assert len(said) == 1 and "max_bytes=10 bytes" in said[0] and "e.jsonl" in said[0]


async def test_a_rotation_refused_goes_on_in_the_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: a rename refused (here ``e.jsonl.1`` is a folder; a read-only folder or a log
    bind-mounted as one file do the same) left the file closed, and every batch from then on
    failed, lost, though the file still took lines. Now the lines go on past ``max_bytes``, the
    refusal counted and logged once, and rotation resumes once it can."""
    path = tmp_path / "e.jsonl"
    blocker = tmp_path / "e.jsonl.1"
    blocker.mkdir()
    (blocker / "keep").write_bytes(b"")
    sink = JsonLinesSink(path, max_bytes=1000, backups=1)
    async with Bus(batch_size=7) as bus:
        bus.subscribe(sink, name="log")
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(10):
            for _ in range(10):
                tel.refused("admission_closed", checkpoint_id="c1")
            await bus.flush()
        blocked = sink.stats()
        (blocker / "keep").unlink()
        blocker.rmdir()
        tel.refused("admission_closed", checkpoint_id="c1")
        await bus.flush()
    log = bus.stats().sink("log")
    assert log.delivered == 101 and log.failed == 0
    assert blocked.events == 100 and blocked.failed == 0 and blocked.rotations == 0
    assert blocked.rotation_errors >= 1 and blocked.reopened == 0
    assert "e.jsonl.1" in (blocked.last_error or "")
    assert sink.stats().rotations == 1
    lines = [e for file in (path, blocker) for _, e in read_events(file)]
    assert len(lines) == 101 and not any(isinstance(e, CorruptLine) for e in lines)
    said = [r for r in caplog.records if "cannot rotate" in r.getMessage()]
    assert len(said) == 1 and "max_bytes=1,000" in said[0].getMessage()


def test_bad_arguments() -> None:
    """Bad sizes, rotation of a stream, and non-targets raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        JsonLinesSink(io.BytesIO(), max_bytes=10)
    with pytest.raises(InvalidArgumentError):
        JsonLinesSink(io.BytesIO(), backups=-1)
    with pytest.raises(InvalidArgumentError):
        JsonLinesSink(io.BytesIO(), max_bytes=0)
    with pytest.raises(InvalidArgumentError):
        JsonLinesSink(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        list(read_events(42))  # type: ignore[arg-type]


async def test_closing_the_bus_mid_stream_leaves_only_whole_lines(tmp_path: Path) -> None:
    """Closing with events pending writes whole lines only; the counts add up."""
    path = tmp_path / "e.jsonl"
    sink = JsonLinesSink(path)
    async with Bus(batch_size=512) as bus:
        sub = bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(20_000):
            tel.refused("admission_closed", checkpoint_id="c1")
    items = [item for _, item in read_events(path)]
    assert not any(isinstance(item, CorruptLine) for item in items)
    assert path.read_bytes().endswith(b"\n")
    assert len(items) == sink.stats().events == sub.stats().delivered


def test_each_batch_reaches_the_file_without_a_flush(tmp_path: Path) -> None:
    """After handle() returns, its lines are in the file: a SIGKILL then loses nothing handled."""
    from ckpt_events import Refused
    from ckpt_events.vocab import ErrorCode

    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path)
    batch = [
        Refused(kind=Kind.MODEL, instance="m0", time_ns=i, code=ErrorCode.STALE_ATTEMPT) for i in range(3)
    ]
    sink.handle(batch)
    assert path.read_bytes().count(b"\n") == 3  # read by another handle, before any flush or close
    sink.close()


def test_a_named_pipe_path_is_written_as_a_stream(tmp_path: Path) -> None:
    """A path naming a pipe (a FIFO, or /dev/stdout piped to a container's log collector) takes
    the lines, read back whole (was: the sink failed to open, "OSError: Illegal seek")."""
    from ckpt_events import Refused
    from ckpt_events.vocab import ErrorCode

    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a reader first: opening to write needs one
    try:
        sink = JsonLinesSink(path)
        batch = [
            Refused(kind=Kind.MODEL, instance="m0", time_ns=i, code=ErrorCode.STALE_ATTEMPT) for i in range(3)
        ]
        sink.handle(batch)
        sink.close()
        data = os.read(reader, 1 << 16)  # a few hundred bytes: well within the pipe's buffer
    finally:
        os.close(reader)
    assert [event for _, event in read_events(io.BytesIO(data))] == batch
    assert sink.stats().events == 3


async def test_lines_reach_disk_when_the_bus_delivers(tmp_path: Path) -> None:
    """By default the sink writes on the loop as each batch is delivered: no linger, no thread,
    so a process killed right after a checkpoint leaves its events on disk."""
    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path)
    assert not sink.blocking and sink.linger == 0
    async with Bus() as bus:
        sub = bus.subscribe(sink)
        assert sub.linger == 0
        tel = Telemetry(bus, kind="agent", instance="a0")
        tel.refused("stale_attempt")
        await bus.flush()
        assert path.read_bytes().count(b"\n") == 1
    threaded = JsonLinesSink(tmp_path / "threaded.jsonl", blocking=True)
    assert threaded.blocking and threaded.linger > 0
    threaded.close()


@given(st.lists(any_event, min_size=1, max_size=20))
@settings(max_examples=200, deadline=None)
def test_any_events_read_back_field_by_field(events: list[Any]) -> None:
    """The generated per-class readers put every field back in its own place (hypothesis
    draws each field independently, so two fields swapped would show), ids as ints."""
    buffer = io.BytesIO()
    sink = JsonLinesSink(buffer)
    sink.handle(events)
    read = [item for _, item in read_events(io.BytesIO(buffer.getvalue()))]
    assert read == events


@pytest.mark.parametrize("max_bytes", [None, 64 << 20])
async def test_a_line_too_long_to_read_back_is_cut_or_left_out_and_counted(
    tmp_path: Path, max_bytes: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A 2 MB attribute made a line read_events skips (1 MiB bound): the sink counted it as
    written and the operation was gone (open for ever in the log). Its long strings are cut so
    the span still ends; what is still too long (a million short attributes) is left out. Both
    are counted and the first is logged; every other line of the batch reads back."""
    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path, max_bytes=max_bytes)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind=Kind.AGENT, instance="a0")
        for blob in ("x" * (2 << 20), "y" * (3 << 20)):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("blob", blob)
                with op.step("write"):
                    pass
        with tel.operation("commit", checkpoint_id="c2") as op:
            for n in range(100_000):
                op.set_attribute(f"a{n}", n)
    read = [event for _, event in read_events(path)]
    assert not [event for event in read if isinstance(event, CorruptLine)]
    names = [type(event).__name__ for event in read]
    assert names == ["OperationStarted", "StepStarted", "StepFinished", "OperationFinished"] * 2 + [
        "OperationStarted"
    ]
    cut = [event for event in read if type(event).__name__ == "OperationFinished"]
    assert [event.attributes for event in cut] == [{"blob": "x" * 1024}, {"blob": "y" * 1024}]
    stats = sink.stats()
    assert (stats.events, stats.shortened, stats.too_long) == (9, 2, 1)
    said = [r.getMessage() for r in caplog.records if "read_events skips a line" in r.getMessage()]
    assert len(said) == 1 and "OperationFinished" in said[0] and "written with 1 string(s) cut" in said[0]


@pytest.mark.parametrize(
    ("lines", "fits"),
    [
        ([10, 10], True),
        ([16], True),  # exactly the bound
        ([17], False),
        ([3, 16, 2], True),
        ([3, 5, 17, 2], False),
        ([1] * 40, True),
        ([1] * 40 + [17], False),
    ],
)
def test_lines_fit_finds_one_line_past_the_bound(lines: list[int], fits: bool) -> None:
    from ckpt_events.sinks.jsonl._line_fit import lines_fit

    data = b"".join(b"a" * n + b"\n" for n in lines)
    assert lines_fit(data, 16) is fits
    assert lines_fit(bytearray(data), 16) is fits


async def test_user_attributes_are_redacted_by_the_rule(tmp_path: Path) -> None:
    """A string under a name the rule matches is written as [REDACTED], as the span sinks export
    it (the log held the secret the spans hid); other values, and the event other sinks get, stay."""
    path = tmp_path / "events.jsonl"
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory)
        bus.subscribe(JsonLinesSink(path, max_bytes=1 << 20))
        bus.subscribe(JsonLinesSink(tmp_path / "mine.jsonl", redactor=Redactor({"ssn"})))
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit") as op:
            op.set_attribute("user.token", "s3cret")
            op.set_attribute("user.ssn", "123")
            op.set_attribute("token_count", "7")
            op.set_attribute("key", 3)
    [finished] = [event for _, event in read_events(path) if isinstance(event, OperationFinished)]
    assert finished.attributes == {"user.token": REDACTED, "user.ssn": "123", "token_count": "7", "key": 3}
    [mine] = [e for _, e in read_events(tmp_path / "mine.jsonl") if isinstance(e, OperationFinished)]
    assert mine.attributes == {"user.token": "s3cret", "user.ssn": REDACTED, "token_count": "7", "key": 3}
    assert b"s3cret" not in path.read_bytes()
    assert memory.of_type(OperationFinished)[0].attributes["user.token"] == "s3cret"


def test_a_text_stream_is_refused_naming_its_buffer(tmp_path: Path) -> None:
    """``JsonLinesSink(sys.stdout)`` and ``read_events(open(path))`` (text streams) are refused in
    one line naming ``.buffer``: the sink was built and then failed every batch, and the reader
    raised a bare "must be str, not bytes"."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    with open(path, "a") as text, pytest.raises(InvalidArgumentError, match=r"\.buffer"):
        JsonLinesSink(text)  # type: ignore[arg-type]
    with open(path) as text, pytest.raises(InvalidArgumentError, match=r"'rb' mode"):
        list(read_events(text))  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", ["", Path("")], ids=["str", "Path"])
def test_an_empty_path_is_refused_naming_what_to_give(empty: str | Path) -> None:
    """``JsonLinesSink("")`` (an unset variable passed on) said "Is a directory: '<cwd>'", the
    working folder ``abspath("")`` made of it; it is refused naming the empty path. ``Path("")``
    is ``"."``, the working folder, and says so as any folder does."""
    if isinstance(empty, str):
        with pytest.raises(InvalidArgumentError, match="empty path"):
            JsonLinesSink(empty)
    else:
        with pytest.raises(IsADirectoryError):
            JsonLinesSink(empty)


async def test_events_handed_after_close_are_counted_failed_not_delivered(
    tmp_path: Path,
) -> None:
    """Was: a sink closed by its owner while still subscribed took every later batch without a
    word, and the bus counted it delivered, written nowhere. Now each such batch fails, counted by
    the sink and the bus, the error saying what to do; an empty one is still ignored."""
    path = tmp_path / "events.jsonl"
    sink = JsonLinesSink(path)
    async with Bus() as bus:
        bus.subscribe(sink, name="log")
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(10):
            tel.refused("admission_closed")
        await bus.flush()
        sink.close()
        for _ in range(10):
            tel.refused("admission_closed")
        await bus.flush()
    log = bus.stats().sink("log")
    assert (log.delivered, log.failed) == (10, 10)
    assert "closed JsonLinesSink" in (log.error or "") and "unsubscribe it before closing" in (
        log.error or ""
    )
    assert sink.stats().failed == 10 and sink.stats().events == 10
    assert len(list(read_events(path))) == 10
    sink.handle([])  # nothing lost: ignored
