"""A collector's OTLP JSON file read as events (``ckpt_events.sinks.otlp._reader``): each span back
as the finished event it was exported from; a step held until its operation; bad input one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from ckpt_events import OperationFinished, StepFinished
from ckpt_events._events import FINISHED_TYPES
from ckpt_events.sinks.otlp import SpanEncoder, looks_like_otlp, read_otlp
from ckpt_events.testing import EventCapture

#: Fields a span does not carry, per event class: a controller span's instance (read back as
#: "controller") and the checkpoint id of a stage or a step.
NOT_CARRIED = {
    "StageFinished": {"instance", "checkpoint_id"},
    "StepFinished": {"checkpoint_id"},
    "CollectionFinished": {"instance"},
    # The controller's monotonic reading is for the report from a JSON-lines log; a span carries
    # its wall-clock times only (a report from OTLP reads clock steps between roots as before).
    "CoordinateFinished": {"monotonic_start_ns"},
}


def _finished() -> list[Any]:
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        ctl = capture.telemetry("controller", "coordination")
        with ctl.collection("checkpoint", checkpoint_id="c1") as collection:
            with ctl.coordinate("prepare", checkpoint_id="c1", parent=collection) as prepare:
                with prepare.stage("agent") as stage:
                    stage.set(participants=1)
            with ctl.coordinate("commit", checkpoint_id="c1", parent=collection) as coordinate:
                with agent.operation(
                    "commit", checkpoint_id="c1", traceparent=coordinate.traceparent()
                ) as op:
                    with op.step("write") as step:
                        step.set(records=2, bytes=10)
                    op.set(records=2)
                    op.set_attribute("user.a", "x")
        events = capture.events
    return [e for e in events if type(e) in FINISHED_TYPES]


def _file(tmp_path: Path, *bodies: bytes) -> Path:
    path = tmp_path / "collector.json"
    path.write_bytes(b"".join(body + b"\n" for body in bodies))
    return path


def test_each_span_reads_back_as_its_event(tmp_path: Path) -> None:
    """Every field a span carries comes back in its own place, the user's attributes too."""
    finished = _finished()
    body, count = SpanEncoder({"service.name": "t"}).json(finished)
    skipped: list[str] = []
    back = {event.span_id: event for _, event in read_otlp(_file(tmp_path, body), skipped.append)}
    assert skipped == [] and count == len(back) == len(finished) == 6
    for event in finished:
        wanted, got = msgspec.structs.asdict(event), msgspec.structs.asdict(back[event.span_id])
        differ = {k for k in wanted if wanted[k] != got[k]}
        assert differ <= NOT_CARRIED.get(type(event).__name__, set()), (type(event).__name__, differ)
    [operation] = [e for e in back.values() if isinstance(e, OperationFinished)]
    assert operation.attributes == {"user.a": "x"}


def test_a_step_waits_for_its_operation_and_an_orphan_is_one_skipped_line(tmp_path: Path) -> None:
    """A step in an earlier line than its operation takes the operation's participant; a step
    whose operation never comes is skipped with one line naming it."""
    finished = _finished()
    encoder = SpanEncoder({"service.name": "t"})
    [step] = [e for e in finished if isinstance(e, StepFinished)]
    [operation] = [e for e in finished if isinstance(e, OperationFinished)]
    orphan = msgspec.structs.replace(step, span_id=0xABAB, parent_span_id=0xCDCD)
    path = _file(tmp_path, encoder.json([step, orphan])[0], encoder.json([operation])[0], b"{not json")
    skipped: list[str] = []
    back = list(read_otlp(path, skipped.append))
    assert [(n, type(e).__name__) for n, e in back] == [(1, "StepFinished"), (2, "OperationFinished")]
    assert (back[0][1].kind, back[0][1].instance) == ("agent", "agent-0")
    assert len(skipped) == 2
    assert skipped[0].startswith(f"{path}:3: not an OTLP JSON trace request")
    assert skipped[1] == f"{path}:1: step span {0xABAB:016x}: its parent operation never came; skipped"


def test_an_otlp_file_is_told_from_a_json_lines_log() -> None:
    """A line holding resourceSpans is OTLP; an event's line is not."""
    body, _ = SpanEncoder({"service.name": "t"}).json(_finished())
    assert looks_like_otlp(json.dumps(json.loads(body)).encode())
    assert not looks_like_otlp(b'{"type":"refused","kind":"agent","instance":"a0","time_ns":1}')


def test_a_failed_span_reads_back_with_its_error_and_not_error_type_as_an_attribute(tmp_path: Path) -> None:
    """``error.type`` (the semantic conventions', on every failed span) is the exception's type,
    read back in ``error_type``, not one more user attribute."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        try:
            with agent.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.a", "x")
                raise OSError("no space left")
        except OSError:
            pass
        [failed] = [e for e in capture.events if isinstance(e, OperationFinished)]
    body, _ = SpanEncoder({"service.name": "t"}).json([failed])
    [(_, back)] = list(read_otlp(_file(tmp_path, body), print))
    assert (back.outcome, back.error_type, back.error_message) == ("error", "OSError", "no space left")
    assert back.attributes == {"user.a": "x"}
    without_exception_event = json.loads(body)
    del without_exception_event["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    path = _file(tmp_path, json.dumps(without_exception_event).encode())
    [(_, back)] = list(read_otlp(path, print))
    assert (back.error_type, back.attributes) == ("OSError", {"user.a": "x"})
    # A user's own error.type (a code of theirs) stays theirs, beside the exception's type.
    coded = msgspec.structs.replace(failed, attributes={"error.type": "disk_full"})
    [(_, back)] = list(read_otlp(_file(tmp_path, SpanEncoder({}).json([coded])[0]), print))
    assert (back.error_type, back.attributes) == ("OSError", {"error.type": "disk_full"})
    unknown = msgspec.structs.replace(failed, error_type=None, attributes={})
    [(_, back)] = list(read_otlp(_file(tmp_path, SpanEncoder({}).json([unknown])[0]), print))
    assert (back.error_type, back.attributes) == ("Exception", None)
