"""Durations per (kind, operation, step) (``participants.cli.report.durations``): every finished
span keyed once, steps under their operation; the nearest-rank percentile."""

from __future__ import annotations

import math

import pytest

from ckpt_events.participants.cli.report.durations import durations, median, percentile
from ckpt_events.testing import EventCapture


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
