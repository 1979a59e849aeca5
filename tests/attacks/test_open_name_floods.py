"""A user's server that names a step after a rollout id: ``ckpt-events report`` of its log
(participants only, no controller log) shows the longest steps and sums the rest in one
``+N more steps`` column and row, in the terminal and on the HTML page (20,000 step names were
a 40,030-line, 2.0 MB terminal report in 19 s and a 3.0 MB page in 27 s: a row per name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio

from ckpt_events import Bus, OperationFinished, OperationStarted, StepFinished, StepStarted, Telemetry
from ckpt_events.participants.cli.report.attribution import attribute
from ckpt_events.participants.cli.report.model import checkpoint_and_restore, trace_spans
from ckpt_events.participants.cli.report.paths import on_critical_path
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.sinks.jsonl import CorruptLine, read_events
from ckpt_events.vocab import Operation
from tests.attacks.test_report_floods import _END, _PARENT, _SPAN, _START, _TRACE, _template

#: Distinct step names, one commit each; their commits 50 us long, each step 39 us.
STEPS = 2_000


def _log(path: Path) -> None:
    ident = {"kind": "judge", "instance": "judge-0", "trace_id": _TRACE, "span_id": _SPAN, "start_ns": _START}
    op = {"operation": Operation.COMMIT, "checkpoint_id": "c", "parent_span_id": _PARENT}
    step = {"step": "s", "checkpoint_id": "c", "parent_span_id": _PARENT}
    started = _template(OperationStarted(**ident, **op, parent_remote=True))
    finished = _template(OperationFinished(**ident, **op, parent_remote=True, end_ns=_END))
    step_started = _template(StepStarted(**ident, **step))
    step_finished = _template(StepFinished(**ident, **step, end_ns=_END))
    t0 = 1_700_000_000_000_000_000
    lines = []
    for i in range(STEPS):
        t = t0 + i * 100_000
        span = 2 * i + 1
        parent = (1 << 62) + i
        name = b'"step-%d"' % i
        lines.append(started % (1, span, t, parent))
        lines.append(step_started.replace(b'"s"', name) % (1, span + 1, t + 1_000, span))
        lines.append(step_finished.replace(b'"s"', name) % (1, span + 1, t + 1_000, t + 40_000, span))
        lines.append(finished % (1, span, t, t + 50_000, parent))
    path.write_bytes(b"".join(lines))


def test_a_step_per_rollout_id_is_summed_past_the_longest_in_terminal_and_page(tmp_path: Path) -> None:
    """2,000 step names: the terminal report is under 100 lines and the page under 40 kB; the
    breakdown's ``+1,988 more steps`` and the table's ``+1,961 more steps`` sum every one."""
    log = tmp_path / "judge.jsonl"
    page = tmp_path / "report.html"
    _log(log)
    run = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", "report", str(log), "--report", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) < 100, f"{len(lines):,} lines"
    assert len(page.read_bytes()) < 40_000, f"page {len(page.read_bytes()):,} bytes"
    # The breakdown: 12 steps of 0.039 ms shown, the other 1,988 summed (77.5 ms), so the
    # column total is every step's.
    more = next(line.split() for line in lines if line.split()[:3] == ["+1,988", "more", "steps"])
    assert round(float(more[3]) + 12 * 0.039, 1) == round(STEPS * 0.039, 1)
    # The table: the commit row, 39 steps, and one row for the 1,961 others, each counted.
    table = next(line.split() for line in lines if "+1,961" in line)
    assert table == ["+1,961", "more", "steps", "1,961", "0", "-", "-", "0.039"]
    assert "+1,988 more steps" in page.read_text() and "+1,961 more steps" in page.read_text()


#: Participants of one kind answering one coordinate.prepare of one checkpoint, one after the other.
INSTANCES = 5_000


async def _one_checkpoint_of_many(log: Path) -> None:
    """A collection checkpoint whose prepare calls ``INSTANCES`` judges in turn, each with a
    step: every call on the critical path, through the real emitter and sink."""
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        controller = Telemetry(bus, kind="controller", instance="coordination")
        judges = [Telemetry(bus, kind="judge", instance=f"judge-{i}") for i in range(INSTANCES)]
        with controller.collection("checkpoint", checkpoint_id="c0") as collection:
            with controller.coordinate("prepare", checkpoint_id="c0", parent=collection) as coordinate:
                for i, judge in enumerate(judges):
                    traceparent = coordinate.traceparent()
                    with judge.operation("prepare", checkpoint_id="c0", traceparent=traceparent) as op:
                        with op.step("upload"):
                            pass
                    if i % 1_000 == 0:
                        await bus.flush()


def test_a_checkpoint_of_5000_participants_is_attributed_and_walked_in_linear_time(tmp_path: Path) -> None:
    """The attribution sweep and the critical path of a checkpoint whose one prepare called
    5,000 participants take under 3 s together (34 s and 8.3 s: each cut of the sweep
    scanned every span, each return of the walk every sibling); the parts still tile the
    root's time, and the path goes through every call and its step."""
    log = tmp_path / "fleet.jsonl"
    anyio.run(_one_checkpoint_of_many, log)
    events = [event for _, event in read_events(log) if not isinstance(event, CorruptLine)]
    trace = checkpoint_and_restore(events)[0]
    assert trace is not None
    spans = trace_spans(events, trace)
    began = time.perf_counter()
    attribution = attribute(spans)
    path = on_critical_path(spans)
    took = time.perf_counter() - began
    assert took < 3, f"{took:.1f} s"
    assert attribution is not None
    summed = sum(attribution.parts.values())
    assert abs(summed - attribution.total_ms) < 1e-6 * max(1.0, attribution.total_ms)
    assert attribution.handlers_ms > 0
    on_path = sum(s.participant and s.span_id in path for s in spans)
    assert on_path == 2 * INSTANCES, f"{on_path:,} of {2 * INSTANCES:,} participants' spans on the path"
