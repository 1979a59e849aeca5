"""W3C hex ids in JSON lines (``ckpt_events.sinks._hexids``): written as lowercase hex, read back as
ints, older decimal logs still read, bad hex refused."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_events import Bus, StepStarted, new_span_id, new_trace_id
from ckpt_events.sinks._hexids import with_hex_ids, with_hex_ids_all
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Kind, Step
from tests.ckpt_events.strategies import any_event
from tests.sinks.helpers import every_event_type


async def test_ids_are_w3c_hex_strings_a_json_reader_sees(tmp_path: Path) -> None:
    """json.loads (as jq would) sees trace_id as 32 lowercase hex digits, span ids as 16."""
    path = tmp_path / "events.jsonl"
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory)
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    spans = [(line, event) for line, event in zip(lines, memory.events, strict=True) if "trace_id" in line]
    assert spans and any(event.parent_span_id is not None for _, event in spans)
    for line, event in spans:
        assert line["trace_id"] == format(event.trace_id, "032x")
        assert line["span_id"] == format(event.span_id, "016x")
        parent = event.parent_span_id
        assert line["parent_span_id"] == (None if parent is None else format(parent, "016x"))


def test_reads_older_logs_with_decimal_ids_and_refuses_bad_hex(tmp_path: Path) -> None:
    """A decimal-id line (older logs) still decodes; uppercase or short hex is a corrupt line."""
    base = (
        b'{"type":"step_started","kind":"agent","instance":"a0","start_ns":1,"step":"write",'
        b'"trace_id":%s,"span_id":%s,"parent_span_id":%s}'
    )
    trace, span, parent = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 0x00F067AA0BA902B7
    path = tmp_path / "e.jsonl"
    path.write_bytes(
        b"\n".join(
            [
                base % (b"%d" % trace, b"%d" % span, b"%d" % parent),
                base % (b'"%032x"' % trace, b'"%016x"' % span, b'"%016x"' % parent),
                base % (b'"%032X"' % trace, b'"%016x"' % span, b"null"),
                base % (b'"%016x"' % span, b'"%016x"' % span, b"null"),
            ]
        )
    )
    items = [item for _, item in read_events(path)]
    assert (
        items[0]
        == items[1]
        == StepStarted(
            kind=Kind.AGENT,
            instance="a0",
            trace_id=trace,
            span_id=span,
            start_ns=1,
            step=Step.WRITE,
            parent_span_id=parent,
        )
    )
    assert [isinstance(item, CorruptLine) for item in items] == [False, False, True, True]


def test_hex_ids_stay_right_past_the_id_cache() -> None:
    """More distinct ids than the hex cache holds: every line still names its own ids."""
    events = [
        StepStarted(
            kind=Kind.AGENT,
            instance="a0",
            trace_id=new_trace_id(),
            span_id=new_span_id(),
            start_ns=n,
            step=Step.WRITE,
            parent_span_id=new_span_id() if n % 2 else None,
        )
        for n in range(10_000)
    ]
    stream = io.BytesIO()
    JsonLinesSink(stream).handle(events)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["trace_id"], x["span_id"], x["parent_span_id"]) for x in lines] == [
        (
            format(e.trace_id, "032x"),
            format(e.span_id, "016x"),
            None if e.parent_span_id is None else format(e.parent_span_id, "016x"),
        )
        for e in events
    ]
    stream.seek(0)
    assert [event for _, event in read_events(stream)] == events


@settings(max_examples=50, deadline=None)
@given(st.lists(any_event, max_size=12).map(lambda events: events + events[::-1]))
def test_a_batch_gets_the_hex_ids_each_event_gets(events: list[Any]) -> None:
    """with_hex_ids_all (the batch path, which reuses a trace's hex between neighbours) gives what
    with_hex_ids gives event by event, in order, for any mix of events and ids."""
    assert with_hex_ids_all(events) == [with_hex_ids(event) for event in events]
