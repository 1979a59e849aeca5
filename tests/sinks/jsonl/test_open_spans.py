"""Open spans at the end of a log (a process killed mid-operation) replayed as truncated spans of
their checkpoint's trace: ended at the process's last event, status ERROR, marked truncated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ckpt_events import Bus, OperationFinished, OperationStarted, StepFinished, Telemetry
from ckpt_events.sinks.jsonl import (
    JsonLinesSink,
    OpenSpans,
    emit_truncated_spans,
    read_events,
    truncated_spans,
)
from ckpt_events.sinks.otel import SpanSink
from ckpt_events.sinks.replay import is_rotated, replay
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Attr, Outcome

TRACE_HEX = "0af7651916cd43dd8448eb211c80319c"
PARENT_HEX = "b7ad6b7169203331"


async def write_log_with_an_open_commit(path: Path) -> dict[str, Any]:
    """A participant's log as a SIGKILL mid-commit leaves it: a finished prepare, then a commit
    and its write step started and never finished, then one more event (its last). Returns the
    commit's and the step's span ids and that last event's time."""
    header = f"00-{TRACE_HEX}-{PARENT_HEX}-01"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("prepare", checkpoint_id="c-crash", traceparent=header):
            pass
        op = tel.operation("commit", checkpoint_id="c-crash", traceparent=header).__enter__()
        step = op.step("write").__enter__()
        tel.refused("admission_closed", checkpoint_id="c-crash")
        await bus.flush()
    last: Any = [event for _, event in read_events(path)][-1]
    return {"commit": op.span_id, "write": step.span_id, "last_ns": last.time_ns}


async def test_replay_closes_an_open_commit_as_a_truncated_span_of_its_trace(tmp_path: Path) -> None:
    """The open commit and its write step reach the exporter: in the checkpoint's trace, under the
    controller's span, ended at the process's last event, ERROR, truncated=true; the finished
    prepare is as it was."""
    log = tmp_path / "resources-0.jsonl"
    ids = await write_log_with_an_open_commit(log)
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter)
    result = await replay(log, sink)
    sink.shutdown()
    assert result.truncated == 2
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"gym.checkpoint.prepare", "gym.checkpoint.commit", "gym.checkpoint.write"}
    commit, write = spans["gym.checkpoint.commit"], spans["gym.checkpoint.write"]
    assert {f"{s.context.trace_id:032x}" for s in spans.values()} == {TRACE_HEX}
    assert commit.context.span_id == ids["commit"] and commit.parent is not None
    assert (f"{commit.parent.span_id:016x}", commit.parent.is_remote) == (PARENT_HEX, True)
    assert write.parent is not None and write.parent.span_id == ids["commit"]
    for span in (commit, write):
        assert span.end_time == ids["last_ns"] and span.start_time is not None
        assert span.start_time <= ids["last_ns"]
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description is not None and span.status.description.startswith("Truncated")
        assert span.attributes is not None and span.attributes[Attr.TRUNCATED] is True
    assert commit.attributes is not None and commit.attributes[Attr.OUTCOME] == "error"
    prepare = spans["gym.checkpoint.prepare"]
    assert prepare.status.status_code is StatusCode.UNSET
    assert prepare.attributes is not None and Attr.TRUNCATED not in prepare.attributes


async def test_replay_can_leave_open_spans_out(tmp_path: Path) -> None:
    """``close_open=False`` replays only what the log holds."""
    log = tmp_path / "resources-0.jsonl"
    await write_log_with_an_open_commit(log)
    exporter = InMemorySpanExporter()
    result = await replay(log, SpanSink(exporter), close_open=False)
    assert result.truncated == 0
    assert [s.name for s in exporter.get_finished_spans()] == ["gym.checkpoint.prepare"]


async def write_a_rotation_with_a_commit_across_it(log: Path) -> int:
    """A real ``JsonLinesSink(max_bytes=...)`` rotation: a commit started in the file rotated to
    ``<log>.1`` and finished in ``log``, renews around it; the commit's span id."""
    sink = JsonLinesSink(log, max_bytes=3000, backups=3)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        commit = tel.operation(
            "commit", checkpoint_id="c-long", traceparent=f"00-{TRACE_HEX}-{PARENT_HEX}-01"
        )
        commit.__enter__()
        n = 0
        while sink.stats().rotations < 1:  # bounded: each renew adds a line to the 3000 bytes
            with tel.operation("renew", checkpoint_id=f"r{n}"):
                pass
            n += 1
            await bus.flush()
        with tel.operation("renew", checkpoint_id=f"r{n}"):
            pass
        commit.__exit__(None, None, None)
    return commit.span_id


@pytest.mark.parametrize("given", ["path", "open file"])
@pytest.mark.parametrize("name", ["env.jsonl.1", "env.jsonl-20261203", "env.jsonl.2026-12-03-1700000000"])
async def test_a_rotated_file_alone_cuts_its_open_spans_and_exports_none_as_left_open(
    tmp_path: Path, given: str, name: str
) -> None:
    """``replay`` of ``env.jsonl.1`` alone, whose commit ends in ``env.jsonl``: the commit was
    exported as a truncated ERROR span (a failure it never had); it is counted in ``cut`` and
    not exported. So too under logrotate's ``dateext`` names (``-20261203``, or a ``dateformat``
    of ``.%Y-%m-%d-%s``), which were taken for a log of their own. The newest file's own open
    work is still closed as truncated."""
    log = tmp_path / "env.jsonl"
    commit_id = await write_a_rotation_with_a_commit_across_it(log)
    rotated = (tmp_path / "env.jsonl.1").rename(tmp_path / name)
    assert [e.span_id for _, e in read_events(rotated) if isinstance(e, OperationStarted)][0] == commit_id
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter)
    if given == "path":
        result = await replay(rotated, sink)
    else:
        with open(rotated, "rb") as file:
            result = await replay(file, sink)
    sink.shutdown()
    assert (result.truncated, result.cut) == (0, 1)
    assert not [s for s in exporter.get_finished_spans() if s.context.span_id == commit_id]
    assert all(s.status.status_code is not StatusCode.ERROR for s in exporter.get_finished_spans())
    # the newest file: the commit's end is there, nothing is cut; a crash there is still truncated
    assert (await replay(log, MemorySink())).cut == 0
    crashed = tmp_path / "resources-0.jsonl"
    await write_log_with_an_open_commit(crashed)
    assert ((await replay(crashed, MemorySink())).truncated, is_rotated(crashed)) == (2, False)
    assert [is_rotated(n) for n in ("a.jsonl.12", "a.jsonl", "a.jsonl.\u00b2", ".1", "x.1")] == [
        True,
        False,
        False,
        False,
        True,
    ]


async def test_truncated_spans_reads_the_tail_and_a_missing_log_has_none(tmp_path: Path) -> None:
    """``truncated_spans`` finds the open commit and step from the log's last bytes alone (the
    seek's cut line is skipped); a log that does not exist yet has nothing open."""
    log = tmp_path / "resources-0.jsonl"
    ids = await write_log_with_an_open_commit(log)
    closed = truncated_spans(log)
    # Children before their parents, as a process ends them.
    assert [type(e) for e in closed] == [StepFinished, OperationFinished]
    assert [e.span_id for e in closed] == [ids["write"], ids["commit"]]
    assert all(e.outcome == Outcome.ERROR and e.end_ns == ids["last_ns"] for e in closed)
    lines = log.read_bytes().splitlines(keepends=True)
    tail = len(b"".join(lines[-4:])) - 5  # cuts into the fourth line from the end
    assert [e.span_id for e in truncated_spans(log, tail_bytes=tail)] == [ids["write"], ids["commit"]]
    assert truncated_spans(tmp_path / "none.jsonl") == []
    with pytest.raises(ValueError, match="tail_bytes"):
        truncated_spans(log, tail_bytes=0)


async def test_each_process_is_closed_at_its_own_last_event(tmp_path: Path) -> None:
    """Two processes in one stream: each open span ends at its own process's last event, a
    finished span is not closed again, and a finish with no start seen is ignored."""
    log = tmp_path / "resources-0.jsonl"
    ids = await write_log_with_an_open_commit(log)
    events: list[Any] = [event for _, event in read_events(log)]
    other = tmp_path / "agent-0.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(other))
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        tel.operation("commit", checkpoint_id="c-crash").__enter__()
        with tel.operation("retire", checkpoint_id="c-crash"):
            pass
        await bus.flush()
    others: list[Any] = [event for _, event in read_events(other)]
    spans = OpenSpans()
    spans.add_all([*events, *others[:1], others[-1]])  # the retire's start is not seen
    closed = spans.close()
    assert len(spans) == 0 and spans.close() == []
    by_instance = {(e.instance, e.span_id): e.end_ns for e in closed}
    assert by_instance == {
        ("resources-0", ids["write"]): ids["last_ns"],
        ("resources-0", ids["commit"]): ids["last_ns"],
        ("agent-0", others[0].span_id): others[-1].end_ns,
    }


async def test_a_process_started_again_on_the_log_ends_its_predecessors_spans(tmp_path: Path) -> None:
    """``emit_truncated_spans`` puts the ends on the new process's bus, and its JSON-lines sink on
    the same path appends them: the log reads as finished, so a later replay closes nothing."""
    log = tmp_path / "resources-0.jsonl"
    ids = await write_log_with_an_open_commit(log)
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        bus.subscribe(memory)
        assert emit_truncated_spans(bus, log) == 2
        await bus.flush()
    assert [(type(e), e.span_id) for e in memory.events] == [
        (StepFinished, ids["write"]),
        (OperationFinished, ids["commit"]),
    ]
    assert truncated_spans(log) == []
    result = await replay(log, SpanSink(InMemorySpanExporter()))
    assert result.truncated == 0
