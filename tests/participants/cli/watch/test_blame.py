"""``FleetView``: STALLED only for the party that holds the work. The controller's open operation
waiting on a participant's call says whom it waits on; it is STALLED only when nothing of it is in
flight, and of unknown holder when its calls are not in the logs read."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from ckpt_events import (
    CoordinateStarted,
    Event,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
)
from ckpt_events.participants.cli.watch.follow import LogFollower
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Operation, Outcome

NOW = 1_800_000_000.0
NS = 1_000_000_000
START = int((NOW - 45.0) * NS)
TRACE = 7
#: The controller's prepare (span 1) and its environment stage (span 2), as the coordinator
#: writes them: a participant's prepare is a call of the stage (its parent).
PREPARE = CoordinateStarted(
    kind=Kind.CONTROLLER,
    instance=CONTROLLER_INSTANCE,
    trace_id=TRACE,
    span_id=1,
    start_ns=START,
    operation=Operation.PREPARE,
    checkpoint_id="c1",
)
STAGE = StageStarted(
    kind=Kind.CONTROLLER,
    instance=CONTROLLER_INSTANCE,
    trace_id=TRACE,
    span_id=2,
    start_ns=START,
    stage="environment",
    checkpoint_id="c1",
    parent_span_id=1,
)
STAGE_END = StageFinished(
    kind=Kind.CONTROLLER,
    instance=CONTROLLER_INSTANCE,
    trace_id=TRACE,
    span_id=2,
    start_ns=START,
    end_ns=START + NS,
    stage="environment",
    checkpoint_id="c1",
    parent_span_id=1,
)


def _call(instance: str, span_id: int, *, parent: int = 2, operation: str = "prepare") -> OperationStarted:
    return OperationStarted(
        kind=Kind.ENVIRONMENT,
        instance=instance,
        trace_id=TRACE,
        span_id=span_id,
        start_ns=START + NS // 10,
        operation=operation,
        checkpoint_id="c1",
        parent_span_id=parent,
        parent_remote=True,
    )


def _answered(call: OperationStarted) -> OperationFinished:
    return OperationFinished(
        kind=call.kind,
        instance=call.instance,
        trace_id=TRACE,
        span_id=call.span_id,
        start_ns=call.start_ns,
        end_ns=call.start_ns + NS // 2,
        operation=call.operation,
        checkpoint_id="c1",
        parent_span_id=call.parent_span_id,
        parent_remote=True,
        outcome=Outcome.OK,
    )


def _shown(events: list[Event], *, rows: bool) -> str:
    view = FleetView([], stall_after=30.0, rows=rows)
    view.add_events(events, NOW - 40.0)  # read 40 s ago: at least 40 s open now
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW))
    return out.export_text()


@pytest.mark.parametrize("rows", [False, True], ids=["blocks", "rows"])
def test_the_controller_waiting_on_a_stalled_participant_is_not_stalled(rows: bool) -> None:
    """Its prepare open 45 s on environment-0's stuck call (the demo's ``--fault stall``): was
    "open prepare >=40.0 s STALLED" on both; environment-0's prepare is STALLED, the controller's
    says whom it waits on, and it is no problem of its own."""
    text = _shown([PREPARE, STAGE, _call("environment-0", 3)], rows=rows)
    assert text.count("STALLED") == 1, text
    if rows:
        assert "environment-0  (logs only)  open prepare >=40.0 s STALLED" in text, text
        assert "controller     open prepare >=40.0 s waiting on environment-0 (stalled)" in text, text
        assert text.startswith("2 participants: none polled; 1 with a problem"), text
    else:
        env = "environment environment-0\n  (from logs only)\n  open prepare c1 >=40.0 s STALLED"
        waits = "open prepare c1 >=40.0 s, waiting on environment/environment-0 (stalled)"
        assert env in text and f"controller coordination\n  {waits}" in text, text


def test_whom_it_waits_on_counts_them_and_names_the_stalled_first() -> None:
    """Four calls open (commit: no stages, its calls are its own children), one not yet stalled:
    three named, the stalled first, and the rest counted."""
    calls = [_call(f"environment-{i}", 10 + i, parent=1, operation="commit") for i in range(4)]
    late = msgspec.structs.replace(
        calls[0], instance="environment-9", span_id=30, start_ns=int((NOW - 1) * NS)
    )
    text = _shown([PREPARE, *calls, late], rows=False)
    assert (
        "waiting on environment/environment-0 (stalled), environment/environment-1 (stalled), "
        "environment/environment-2 (stalled) and 2 more"
    ) in text, text


@pytest.mark.parametrize("rows", [False, True], ids=["blocks", "rows"])
def test_the_controller_holding_its_own_work_is_stalled(rows: bool) -> None:
    """Its environment stage ended (environment-0 answered), nothing of it in flight, and its
    prepare still open 45 s: the controller holds it, STALLED."""
    call = _call("environment-0", 3)
    text = _shown([PREPARE, STAGE, call, _answered(call), STAGE_END], rows=rows)
    assert text.count("STALLED") == 1 and "waiting" not in text, text
    assert (
        "controller     open prepare >=40.0 s STALLED" if rows else "open prepare c1 >=40.0 s STALLED"
    ) in text


def test_a_fan_out_every_participant_answered_is_the_controllers_own_stall() -> None:
    """A commit (no stages) whose calls every participant known answered, still open: STALLED.
    One participant known (from another trace) that never answered: whether it holds a call of
    it, not yet logged, is unknown."""
    calls = [_call(f"environment-{i}", 10 + i, parent=1, operation="commit") for i in range(2)]
    done = [_answered(c) for c in calls]
    text = _shown([PREPARE, *calls, *done], rows=False)
    assert "open prepare c1 >=40.0 s STALLED" in text, text
    other = msgspec.structs.replace(done[0], instance="environment-5", trace_id=99, span_id=50)
    text = _shown([PREPARE, *calls, *done, other], rows=False)
    assert "STALLED" not in text, text


@pytest.mark.parametrize("rows", [False, True], ids=["blocks", "rows"])
def test_calls_not_in_the_logs_read_make_its_holder_unknown(rows: bool) -> None:
    """The controller's log alone (the participants' not readable): its prepare open 45 s in its
    environment stage is waiting on calls not seen, or stalled: unknown, never STALLED."""
    text = _shown([PREPARE, STAGE], rows=rows)
    assert "STALLED" not in text, text
    if rows:
        assert "controller  open prepare >=40.0 s holder unknown" in text, text
    else:
        assert (
            "open prepare c1 >=40.0 s, stalled or waiting: unknown (its environment calls are in none of "
            "the logs read)"
        ) in text, text
    text = _shown([PREPARE], rows=False)  # not even a stage: nothing known of its calls
    assert "stalled or waiting: unknown (none of its calls in flight is in the logs read)" in text, text


def test_its_stages_and_calls_are_read_from_logs_folded_as_a_backlog(tmp_path: Path) -> None:
    """Folded from real logs (the backlog at ``watch --follow``'s start), the controller's stage
    and environment-0's call are kept: the controller waits on environment-0, not STALLED."""
    sink = JsonLinesSink(tmp_path / "controller.jsonl")
    sink.handle([PREPARE, STAGE])
    sink.close()
    sink = JsonLinesSink(tmp_path / "environment-0.jsonl")
    sink.handle([_call("environment-0", 3)])
    sink.close()
    view = FleetView([], stall_after=30.0)
    with LogFollower(
        [str(tmp_path / "controller.jsonl"), str(tmp_path / "environment-0.jsonl")], budget=None
    ) as follower:
        view.add_events(follower.read(), NOW - 40.0)
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW))
    text = out.export_text()
    assert "open prepare c1 >=40.0 s, waiting on environment/environment-0 (stalled)" in text, text
    assert text.count("STALLED") == 1, text
