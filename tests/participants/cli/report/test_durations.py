"""Durations per (kind, operation, step) (``participants.cli.report.durations``): every finished
span keyed once, steps under their operation; the nearest-rank percentile."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Iterator

import pytest

from ckpt_events import OperationFinished, StepFinished
from ckpt_events.participants.cli.report.durations import DurationsFold, durations, median, percentile
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import Kind, Operation, Outcome


def test_every_finished_span_is_keyed_and_a_step_under_its_operation() -> None:
    """Operations and steps by participant kind, controller spans under "controller"; each value in ms."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        ctl = capture.telemetry("controller", "coordination")
        with ctl.collection("checkpoint", checkpoint_id="c1") as collection:
            with ctl.coordinate("prepare", parent=collection) as coordinate, coordinate.stage("agent"):
                for _ in range(2):
                    with agent.operation("commit", checkpoint_id="c1") as op, op.step("write"):
                        pass
        events = capture.events
    found = durations(events).ok
    assert durations(events).failed == {}
    assert sorted(found) == [
        ("agent", "commit", ""),
        ("agent", "commit", "write"),
        ("controller", "collection.checkpoint", ""),
        ("controller", "coordinate.prepare", ""),
        ("controller", "stage", "agent"),
    ]
    assert len(found[("agent", "commit", "write")]) == 2
    assert all(value > 0 for values in found.values() for value in values)
    # The TickingClock reads 1 ms later each time: a step is one tick, its operation three.
    assert found[("agent", "commit", "write")] == [1.0, 1.0]
    assert found[("agent", "commit", "")] == [3.0, 3.0]


def test_a_step_without_its_operation_is_keyed_with_a_question_mark() -> None:
    """A step whose operation is not in the events (a cut log) is kept under "?"."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        with agent.operation("restore") as op, op.step("read"):
            pass
        steps_only = [e for e in capture.events if type(e).__name__ == "StepFinished"]
    assert list(durations(steps_only).ok) == [("agent", "?", "read")]


def test_percentile_ends_and_median() -> None:
    """Share 0 is the smallest value, 1 the largest, whatever the order; median is the middle."""
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 5.0
    assert percentile([7.0], 0.95) == 7.0
    assert median(values) == 3.0


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_percentile_is_the_nearest_rank(share: float) -> None:
    """The nearest-rank percentile of n values is the ceil(share * n)-th smallest."""
    values = [float(n) for n in range(1, 11)]
    assert percentile(values, share) == values[math.ceil(share * len(values)) - 1]


def test_a_step_read_after_its_operation_is_keyed_under_it() -> None:
    """Logs merged out of order: a step read after its operation finished is still its
    operation's, not "?"."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        with agent.operation("restore") as op, op.step("read"):
            pass
        finished = [e for e in capture.events if type(e).__name__ in ("StepFinished", "OperationFinished")]
    assert [type(e).__name__ for e in finished] == ["StepFinished", "OperationFinished"]
    assert sorted(durations(finished[::-1]).ok) == [("agent", "restore", ""), ("agent", "restore", "read")]


def _operations(count: int) -> Iterator[OperationFinished]:
    """``count`` failed operations, made as they are read (a failed span is counted, not timed:
    what the fold keeps of it is a count)."""
    for n in range(count):
        yield OperationFinished(
            Kind.AGENT,
            "agent-0",
            trace_id=(1 << 100) + n,
            span_id=(1 << 62) + n,
            start_ns=n * 1000,
            end_ns=n * 1000 + 500,
            operation=Operation.COMMIT,
            outcome=Outcome.ERROR,
        )


def test_the_fold_keeps_no_memory_per_operation_read() -> None:
    """The fold of 80,000 operations holds what that of 20,000 does, give or take 256 KiB: it
    kept every operation's span id and name until the end (+7.9 MiB from 50,000 to 200,000
    lines of a user's own server's logs), for steps that finish before their operation."""
    held = []
    for count in (20_000, 80_000):
        tracemalloc.start()
        try:
            fold = DurationsFold()
            for e in _operations(count):
                fold.add(e)
            held.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
        assert fold.result().failed == {("agent", "commit", ""): count}
    assert held[1] - held[0] < 256 * 1024, f"{held[0] / 1024:.0f} -> {held[1] / 1024:.0f} KiB"


def test_a_step_is_keyed_under_its_own_traces_operation_of_its_span_id() -> None:
    """Two processes' operations of one span id, in two traces (a span id is unique in its trace
    only): the agent's ``upload`` step is its commit's in every order the merged log reads them
    in; it was keyed under the model's restore in all three."""
    step = StepFinished(
        Kind.AGENT, "agent-0", trace_id=1, span_id=8, start_ns=10, end_ns=20, step="upload", parent_span_id=7
    )
    commit = OperationFinished(
        Kind.AGENT, "agent-0", trace_id=1, span_id=7, start_ns=0, end_ns=30, operation=Operation.COMMIT
    )
    restore = OperationFinished(
        Kind.MODEL, "model-0", trace_id=2, span_id=7, start_ns=5, end_ns=25, operation=Operation.RESTORE
    )
    for order in ([step, restore, commit], [restore, step, commit], [commit, restore, step]):
        assert sorted(durations(order).ok) == [
            ("agent", "commit", ""),
            ("agent", "commit", "upload"),
            ("model", "restore", ""),
        ], [type(e).__name__ for e in order]
