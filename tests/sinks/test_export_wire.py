"""The export process's pipe (``wire``): span handles written as they are, read back as
the very events an in-process sink gets from the same bus."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ckpt_events import Bus, Event, OperationFinished, OperationStarted, StepFinished, StepStarted, Telemetry
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events.sinks._export.wire import (
    OperationRecord,
    StepRecord,
    WireReader,
    encoder,
    escaped_line,
    lines_within,
    wire_items,
)

pytestmark = pytest.mark.anyio


class Cooked:
    """An ordinary sink: the events the bus builds for it."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def handle(self, batch: list[Event]) -> None:
        self.events.extend(batch)


class Wire:
    """A sink taking the handles raw, as ``ExportProcess`` does: each batch written as the pipe's
    line and read back as the child reads it."""

    _takes_span_handles = True

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.lines: list[bytes] = []
        self.items: list[Any] = []
        self._encoder = encoder()
        self.reader = WireReader()

    def handle(self, batch: list[Any]) -> None:
        self.items.extend(batch)
        line = self._encoder.encode(wire_items(batch))
        self.lines.append(line)
        self.events.extend(self.reader.events(line))


def test_the_records_are_the_handles_fields_in_order() -> None:
    """The child decodes a handle by position: a field added to a handle and not to its record
    (or moved) would shift every field after it."""
    for handle, record in ((OperationSpan, OperationRecord), (StepSpan, StepRecord)):
        assert handle.__struct_fields__ == record.__struct_fields__
        assert handle.__struct_config__.tag == record.__struct_config__.tag
        assert handle.__struct_config__.array_like and record.__struct_config__.array_like


def _work(tel: Telemetry) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        op.set_attribute("gym.user", "u1")
        with op.step("export") as step:
            step.set(records=3, bytes=7)
        with op.step("upload") as step:
            step.set(calls=2)
        op.set(records=3, bytes=7, phase="committed", episodes=2, rollouts=5, received_ns=11, loop_lag_ms=0.5)
    with pytest.raises(ZeroDivisionError), tel.operation("restore", checkpoint_id="c1") as op:
        with op.step("install"):
            1 / 0  # noqa: B018
    tel.refused("stale_checkpoint", checkpoint_id="c9")  # an event that is no span handle
    with tel.operation("prepare", traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01") as op:
        pass


async def test_the_child_reads_the_events_an_in_process_sink_gets() -> None:
    cooked, wire = Cooked(), Wire()
    async with Bus() as bus:
        bus.subscribe(cooked)
        sub = bus.subscribe(wire)
        assert sub._buffer.raw
        tel = Telemetry(bus, kind="resources", instance="resources-0", worker=3)
        _work(tel)
        await bus.flush()
    assert len(cooked.events) == 13
    assert wire.events == cooked.events
    # The server built no event for its own spans on this sink's way: it got the handles, each
    # once, and each end an int naming its start (all in one batch here).
    handles = [item for item in wire.items if isinstance(item, OperationSpan | StepSpan)]
    ends = [item for item in wire.items if isinstance(item, int)]
    assert len(handles) == len(ends) == 6 and len(wire.items) == 13
    assert sorted(ends) == sorted(handle._wire for handle in handles)


async def test_alone_on_the_bus_the_request_path_builds_no_started_event() -> None:
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:
            with op.step("export"):
                buffered = list(bus._subscriptions[0]._buffer)
                assert [type(item) for item in buffered] == [OperationSpan, StepSpan]
        await bus.flush()
    assert [type(e) for e in wire.events] == [OperationStarted, StepStarted, StepFinished, OperationFinished]


async def test_a_span_open_across_batches_starts_in_one_line_and_ends_in_a_later_one() -> None:
    wire = Wire()
    async with Bus(batch_interval=0) as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:
            await bus.flush()
            assert [type(e) for e in wire.events] == [OperationStarted]
            op.set(records=1)
        await bus.flush()
    assert len(wire.lines) >= 2
    started, finished = wire.events
    assert isinstance(finished, OperationFinished) and finished.records == 1
    assert (started.span_id, started.start_ns) == (finished.span_id, finished.start_ns)


async def test_a_start_the_buffer_had_no_room_for_leaves_the_end_alone() -> None:
    """A start dropped (counted) for want of room: the handle met later is its end, never a
    second start, and the next span pairs up again."""
    wire = Wire()
    async with Bus() as bus:
        sub = bus.subscribe(wire, buffer_size=1)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:  # its start fills the buffer
            with op.step("export"):  # no room: this start is dropped
                pass  # and so is this end
            await bus.flush()
        await bus.flush()
        with tel.operation("restore"):
            await bus.flush()
        await bus.flush()
    assert [type(e) for e in wire.events] == [
        OperationStarted,
        OperationFinished,
        OperationStarted,
        OperationFinished,
    ]
    assert sub.stats().dropped == 2


async def test_one_raw_buffer_per_bus_a_second_such_sink_gets_events() -> None:
    first, second = Wire(), Wire()
    async with Bus() as bus:
        a, b = bus.subscribe(first), bus.subscribe(second)
        assert a._buffer.raw and not b._buffer.raw
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        _work(tel)
        await bus.flush()
    assert first.events == second.events and len(first.events) == 13
    assert all(isinstance(item, Event) for item in second.items)


async def test_entering_a_handle_twice_queues_one_start() -> None:
    wire, cooked = Wire(), Cooked()
    async with Bus() as bus:
        bus.subscribe(wire)
        bus.subscribe(cooked)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        op = tel.operation("commit")
        with op, op:
            pass
        await bus.flush()
    # The cooked sink keeps the handles' old behaviour (a start per enter); the wire never
    # takes a second meeting for the end: one start, one end.
    assert [type(e) for e in wire.events] == [OperationStarted, OperationFinished]


async def test_a_bridged_operation_goes_as_its_events() -> None:
    class Bridge:
        def current_parent(self) -> None:
            return None

        def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
            return object()

        def detach(self, token: object) -> None:
            pass

    wire, cooked = Wire(), Cooked()
    async with Bus() as bus:
        bus.subscribe(cooked)
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0", otel_context=Bridge())
        _work(tel)
        await bus.flush()
    assert wire.events == cooked.events and len(wire.events) == 13


async def test_a_line_cut_short_keeps_its_whole_items() -> None:
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        _work(tel)
        await bus.flush()
    (line,) = wire.lines
    whole = WireReader().events(line)
    items = msgspec.json.decode(line)
    # Only the closing bracket lost: the last item, an end mark, may have lost digits too.
    assert isinstance(items[-1], int) and WireReader().whole_events(line[:-1]) == whole[:-1]
    assert any(isinstance(item, int) for item in items)  # an end naming its start's record
    # Cut inside each item in turn: what comes back is the items before it, never an error,
    # never a half item, and never an end mark cut short ("123" to "12": another span's).
    for i in range(1, len(items)):
        whole_item = msgspec.json.encode(items[i])
        for size in (1, 2, 5):
            if size < len(whole_item):
                cut = msgspec.json.encode(items[:i])[:-1] + b"," + whole_item[:size]
                kept = WireReader().events(msgspec.json.encode(items[:i]))
                assert WireReader().whole_events(cut) == kept
    assert WireReader().whole_events(b"[") == [] and WireReader().whole_events(b"") == []


async def test_an_end_mark_cut_to_fewer_digits_names_no_other_span() -> None:
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for _ in range(12):
            with tel.operation("commit"):
                pass
        await bus.flush()
    (line,) = wire.lines
    assert line.endswith(b"]") and line[-2:-1].isdigit()  # it ends in an end mark
    reader = WireReader()
    events = reader.whole_events(line[:-2])  # that mark lost its last digit
    assert [type(e) for e in events] == [OperationStarted, OperationFinished] * 11 + [OperationStarted]
    assert reader.lost_ends == 0


def test_a_line_that_is_not_the_pipes_is_refused() -> None:
    for line in (b"[-1]", b"[0]", b"[0,0,[]]", b'["x"]', b"[[1,2]]", b"[0,{}]", b'["1"]'):
        with pytest.raises(msgspec.DecodeError):
            WireReader().events(line)


async def test_a_span_started_and_ended_in_one_line_has_its_fields_written_once() -> None:
    """Its end is an int naming its start's record, so the server encodes each such handle once,
    in one call for the batch; the child still gets both events, each in its place."""
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for _ in range(5):
            with tel.operation("commit") as op, op.step("export"):
                pass
        await bus.flush()
    (line,) = wire.lines
    assert wire_items(wire.items) is wire.items  # as it is: no copy, no loop in Python
    items = msgspec.json.decode(line)
    records = [item for item in items if isinstance(item, list)]
    ends = [item for item in items if isinstance(item, int)]
    assert len(records) == len(ends) == 10
    numbers = [record[-1] for record in records]
    for position, end in ((i, item) for i, item in enumerate(items) if isinstance(item, int)):
        start = next(i for i, item in enumerate(items) if isinstance(item, list) and item[-1] == end)
        assert start < position
    assert sorted(numbers) == sorted(ends)
    kinds = [type(e).__name__ for e in wire.events]
    assert kinds[:4] == ["OperationStarted", "StepStarted", "StepFinished", "OperationFinished"]
    assert len(wire.events) == 20


def _record(number: int) -> bytes:
    return msgspec.json.encode(
        ["step", ["resources", "r0", None], "export", None, 1, 2, 3, True, None, False]
        + [1, 2, None, "ok", None, None, None, None, None, None, None, None, number]
    )


def test_an_end_the_reader_holds_no_start_for_is_counted_lost() -> None:
    reader = WireReader()
    assert [type(e) for e in reader.events(b"[" + _record(7) + b",7]")] == [StepStarted, StepFinished]
    assert reader.events(b"[7,8]") == [] and reader.lost_ends == 2  # ended already; never started
    # A start in one line, its end in a later one, as a mark or as the record again.
    assert [type(e) for e in reader.events(b"[" + _record(9) + b"," + _record(10) + b"]")] == [
        StepStarted,
        StepStarted,
    ]
    assert [type(e) for e in reader.events(b"[9," + _record(10) + b"]")] == [StepFinished, StepFinished]
    assert reader.lost_ends == 2
    # Numbered 0: its start never queued (not wanted, no room), its end alone.
    assert [type(e) for e in reader.events(b"[" + _record(0) + b"]")] == [StepFinished]
    # A line refused changes nothing: the start it holds is not opened.
    with pytest.raises(msgspec.DecodeError):
        reader.events(b"[" + _record(11) + b',"x"]')
    assert reader.events(b"[11]") == [] and reader.lost_ends == 3


def test_a_reader_holds_at_most_its_limit_of_open_spans() -> None:
    reader = WireReader(open_limit=3)
    line = b"[" + b",".join(_record(n) for n in range(1, 6)) + b"]"
    assert len(reader.events(line)) == 5
    assert reader.events(b"[1,2]") == [] and reader.lost_ends == 2  # the oldest went first
    assert len(reader.events(b"[3,4,5]")) == 3


async def test_a_span_started_before_the_raw_buffer_was_goes_as_its_end_alone() -> None:
    first, second = Wire(), Wire()
    async with Bus() as bus:
        sub = bus.subscribe(first)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit"):
            await bus.flush()
            sub.close()
            await bus.flush()
            assert bus.subscribe(second)._buffer.raw
        await bus.flush()
    assert [type(e) for e in first.events] == [OperationStarted]
    assert [type(e) for e in second.events] == [OperationFinished]  # never a second start
    assert second.reader.lost_ends == 0 and not second.reader._open


async def test_spans_ended_on_threads_while_their_batches_are_taken_lose_no_end() -> None:
    """Emitters on threads race the delivery task that takes their starts: each span's two
    events reach the wire once each, the same as an ordinary sink gets them."""
    import threading
    import time

    import anyio

    cooked, wire = Cooked(), Wire()
    async with Bus(batch_interval=0) as bus:
        bus.subscribe(wire, batch_size=64)
        bus.subscribe(cooked)
        tel = Telemetry(bus, kind="resources", instance="resources-0")

        def work() -> None:
            for i in range(400):
                with tel.operation("commit") as op, op.step("export"):
                    if i % 3 == 0:
                        time.sleep(0)  # let the loop take the batch while this span is open

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for _ in range(10_000):
            if not any(thread.is_alive() for thread in threads):
                break
            await bus.flush()
            await anyio.sleep(0.0005)
        for thread in threads:
            thread.join()
        await bus.flush()
    assert len(wire.lines) > 4

    def key(event: Event) -> tuple[int, str]:
        return (event.span_id, type(event).__name__)  # type: ignore[attr-defined]

    assert sorted(wire.events, key=key) == sorted(cooked.events, key=key)
    # Both ways of ending were taken: a mark (its start still queued) and the record again.
    ends = [item for item in wire.items if isinstance(item, int)]
    assert 0 < len(ends) < 4 * 400 * 2
    assert len(wire.events) == 4 * 400 * 4 and wire.reader.lost_ends == 0 and not wire.reader._open


async def test_a_line_utf8_cannot_carry_is_escaped_and_read_back_as_it_was() -> None:
    """A lone surrogate in a handle's field or an attribute, and in an event sent as it is:
    msgspec cannot write the line, ``escaped_line`` can, and the child reads back the very
    events (the surrogates and an infinity kept), every other item as the usual line has it."""
    cooked, wire = Cooked(), Wire()
    lines: list[bytes] = []

    class Escaped(Wire):
        def handle(self, batch: list[Any]) -> None:
            items = wire_items(batch)
            with pytest.raises(UnicodeEncodeError):
                self._encoder.encode(items)
            lines.append(escaped_line(items))
            self.events.extend(self.reader.events(lines[-1]))

    wire = Escaped()
    async with Bus() as bus:
        bus.subscribe(cooked)
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0", worker=3)
        _work(tel)
        with tel.operation("commit", checkpoint_id="c\udcff") as op:
            op.set_attribute("name", "x\ud800y")
            op.set_attribute("ratio", float("-inf"))
        tel.refused("stale_checkpoint", checkpoint_id="\udfff")
        await bus.flush()
    assert len(cooked.events) == 16 and all(line.isascii() and b"\n" not in line for line in lines)
    assert wire.events == cooked.events
    assert cooked.events[-2].attributes == {"name": "x\ud800y", "ratio": float("-inf")}  # type: ignore[union-attr]
    assert WireReader().whole_events(lines[0][:-1]) == cooked.events  # cut: its whole items, as ever
    with pytest.raises(msgspec.DecodeError):
        WireReader().events(b"[" * 100_000 + b'"\\udcff"')  # damage: refused, not a RecursionError


async def test_a_batch_split_in_lines_within_a_limit_reads_as_its_one_line() -> None:
    """``lines_within`` at limits from the longest item's line up: each line within it, read in
    turn by one reader, the events those of the whole line in order (an end mark names its
    start's number in any earlier line); under it, the item too long is left out with its end
    mark, both counted, and no end is lost."""
    batches: list[list[Any]] = []

    class Items:
        _takes_span_handles = True

        def handle(self, batch: list[Any]) -> None:
            batches.append(wire_items(batch))

    async with Bus() as bus:
        bus.subscribe(Items())  # alone: the spans go as records, their ends as marks
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        _work(tel)
        with tel.operation("commit", checkpoint_id="c2") as op:
            op.set_attribute("large", "x" * 2000)
        await bus.flush()
    [items] = batches
    encode = encoder().encode
    whole = encode(items)
    events = WireReader().events(whole)
    assert len(events) == 15 and any(isinstance(item, int) for item in items)
    sizes = sorted(len(encode(item)) for item in items)
    longest = sizes[-1]
    assert longest > 2000 > sizes[-2]  # the large operation's record
    for limit in range(longest + 2, len(whole) + 1, 7):  # the record and its brackets
        lines, dropped = lines_within(items, encode, limit)
        assert dropped == 0 and all(len(line) <= limit for line in lines)
        reader = WireReader()
        assert [event for line in lines for event in reader.events(line)] == events
        assert reader.lost_ends == 0 and not reader._open
    lines, dropped = lines_within(items, encode, longest)  # the large operation's does not fit
    assert dropped == 2 and all(len(line) <= longest for line in lines)
    reader = WireReader()
    kept = [event for line in lines for event in reader.events(line)]
    assert kept == [e for e in events if getattr(e, "checkpoint_id", None) != "c2"]
    assert reader.lost_ends == 0
