"""The overview's causes: the participant that failed and how, never a consequence blamed on the
controller, in words (the error's name and message, cut at a word)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    PrepareNotReady,
    Refused,
    StageFinished,
)
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.controller.types import FAILURES_ATTRIBUTE, Member, failures_value
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import CollectionAction, ErrorCode, Operation, Outcome
from tests.participants.controller.test_failures import run_refused_checkpoint

_NOT_PREPARED = (
    "ckpt_events.participants.errors.CheckpointNotPrepared",
    "checkpoint c1 not prepared: stopped at stage environment with 1 blocker",
)


async def test_report_names_the_participant_that_refused_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One participant started with another token: ``report`` on the run's log names it, its
    code and its status as the cause, and blames nothing on the controller. It said: "#1
    checkpoint failed: resume failed on controller (ckpt_events.participants.errors.
    CoordinationError: resume failed: agent-0: http://127.0.0.1:41571/ng-control/v…)"."""
    events = await run_refused_checkpoint(tmp_path)
    log = tmp_path / "run.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(events)
    sink.close()
    assert await anyio.to_thread.run_sync(main, ["report", str(log)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    cause = re.search(r"#1 checkpoint failed: (.*?) checkpoint c1", out)
    assert cause is not None, out
    assert cause.group(1) == (
        "agent/agent-0 refused: unauthorized (401): missing or wrong bearer token (at prepare and resume)"
    )
    assert "on controller" not in out and "CoordinationError" not in out


def _span(cls: Any, span_id: int, parent: int | None, start: int, end: int | None, **fields: Any) -> Any:
    """A controller span's event (``end=None``: its start)."""
    ends = {} if end is None else {"end_ns": end}
    return cls(
        kind="controller",
        instance="coordination",
        trace_id=7,
        span_id=span_id,
        start_ns=start,
        checkpoint_id="c1",
        parent_span_id=parent,
        **ends,
        **fields,
    )


def _not_prepared(*, reported: bool) -> list[Any]:
    """A collection checkpoint whose prepare stopped at a participant not ready at its deadline
    (``reported``: the participant's own log is in)."""
    error = {"outcome": Outcome.ERROR, "error_type": _NOT_PREPARED[0], "error_message": _NOT_PREPARED[1]}
    events: list[Any] = [
        _span(CollectionStarted, 1, None, 0, None, action=CollectionAction.CHECKPOINT),
        _span(CoordinateStarted, 2, 1, 5, None, operation=Operation.PREPARE),
        _span(StageFinished, 3, 2, 10, 40, stage="environment"),
        _span(
            CoordinateFinished,
            2,
            1,
            5,
            45,
            operation=Operation.PREPARE,
            prepared=False,
            stopped_at="environment",
        ),
        _span(CollectionFinished, 1, None, 0, 60, action=CollectionAction.CHECKPOINT, **error),
    ]
    if reported:
        events.insert(2, PrepareNotReady("environment", "environment-0", 38, 1, "c1"))
    return events


def test_a_controller_error_that_follows_from_a_failure_below_is_no_cause() -> None:
    """The collection's ``CheckpointNotPrepared`` follows from the prepare that stopped: the
    participant not ready is the cause, said once."""
    (row,) = overview(_not_prepared(reported=True)).rows
    assert row.outcome == "aborted"
    assert row.causes == ["not ready at its deadline: environment/environment-0 blocked by 1 episode"]


def test_without_the_participant_log_the_controller_error_is_said_by_its_name() -> None:
    """With nothing else to name, the controller's error is the cause: its name and message, not
    its module path (it said "ckpt_events.participants.errors.CheckpointNotPrepared: ... stop…")."""
    (row,) = overview(_not_prepared(reported=False)).rows
    assert row.causes == [
        "checkpoint failed on controller (CheckpointNotPrepared: checkpoint c1 not prepared: "
        "stopped at stage environment with 1 blocker)"
    ]


def test_a_long_error_message_is_cut_at_a_word() -> None:
    """A participant's long error is cut at a word boundary with an ellipsis; a refusal counted by
    the participant is named with its code and HTTP status."""
    words = " ".join(f"word{i}" for i in range(80))
    failed = OperationFinished(
        kind="environment",
        instance="environment-0",
        trace_id=7,
        span_id=2,
        start_ns=0,
        end_ns=20,
        operation=Operation.COMMIT,
        checkpoint_id="c1",
        parent_span_id=1,
        outcome=Outcome.ERROR,
        error_type="ckpt_events.participants.errors.CheckpointWriteError",
        error_message=words,
    )
    error = {"outcome": Outcome.ERROR, "error_type": "CoordinationError", "error_message": "commit failed"}
    started = _span(CoordinateStarted, 1, None, 0, None, operation=Operation.COMMIT)
    root = _span(CoordinateFinished, 1, None, 0, 30, operation=Operation.COMMIT, **error)
    refused = Refused("model", "model-0", 25, ErrorCode.STALE_CHECKPOINT, "c1")
    (row,) = overview([started, failed, refused, root]).rows
    cut, said = row.causes
    assert cut.startswith("commit failed on environment/environment-0 (CheckpointWriteError: word0 word1 ")
    assert cut.endswith("…)") and re.search(r" word\d+…\)$", cut), cut
    assert words.startswith(
        cut.removeprefix("commit failed on environment/environment-0 (CheckpointWriteError: ")[:-2]
    )
    assert said == "model/model-0 refused: stale_checkpoint (409)"


def test_a_failure_the_controller_recorded_is_said_once_with_its_code() -> None:
    """A participant's failed commit, its ``refused`` and the controller's record of the same
    refusal are one cause: the record, with the code, the HTTP status and the operation."""
    detail = "no space left on device"
    failed = OperationFinished(
        kind="environment",
        instance="environment-0",
        trace_id=7,
        span_id=2,
        start_ns=0,
        end_ns=20,
        operation=Operation.COMMIT,
        checkpoint_id="c1",
        parent_span_id=1,
        outcome=Outcome.ERROR,
        error_type="ckpt_events.participants.errors.ProtocolRefusal",
        error_message=f"checkpoint_error: {detail}",
    )
    refused = Refused("environment", "environment-0", 21, ErrorCode.CHECKPOINT_ERROR, "c1")
    record = failures_value(
        [Member("environment-0", "environment", "environment-0", "u")],
        {"environment-0": f"refused: checkpoint_error (409): {detail}"},
    )
    error = {"outcome": Outcome.ERROR, "error_type": "CoordinationError", "error_message": "commit failed"}
    started = _span(CoordinateStarted, 1, None, 0, None, operation=Operation.COMMIT)
    root = _span(
        CoordinateFinished,
        1,
        None,
        0,
        30,
        operation=Operation.COMMIT,
        attributes={FAILURES_ATTRIBUTE: record},
        **error,
    )
    (row,) = overview([started, failed, refused, root]).rows
    assert row.outcome == "failed"
    assert row.causes == [
        "environment/environment-0 refused: checkpoint_error (409): no space left on device (at commit)"
    ]


def test_a_prepare_that_stopped_says_where_when_nothing_else_does() -> None:
    """A bare coordinator's prepare not prepared, without the participants' logs: the stage it
    stopped at (it said nothing)."""
    started = _span(CoordinateStarted, 2, None, 5, None, operation=Operation.PREPARE)
    stopped = _span(
        CoordinateFinished, 2, None, 5, 45, operation=Operation.PREPARE, prepared=False, stopped_at="model"
    )
    (row,) = overview([started, stopped]).rows
    assert (row.outcome, row.causes) == ("aborted", ["prepare stopped at stage model, not prepared"])


def test_a_list_of_events_is_read_again_whole_after_a_cause_names_a_checkpoint() -> None:
    """``overview(list)`` keeps the list as its own ``again``: a later read of the run gives every
    event back (a local name reused for a checkpoint's causes once made it give those instead)."""
    from tests.participants.cli.report_events import checkpoint_and_restore

    events = anyio.run(checkpoint_and_restore)
    telemetry_events: list[Any] = []

    async def refused() -> None:
        from ckpt_events import Telemetry
        from ckpt_events.testing import capture_events

        async with capture_events() as (bus, got):
            Telemetry(bus, kind="agent", instance="agent-0").refused(
                ErrorCode.UNAUTHORIZED, checkpoint_id="c1"
            )
        telemetry_events.extend(got)

    anyio.run(refused)
    run = overview([*events, *telemetry_events])
    assert len(run.all_events()) == len(events) + len(telemetry_events)
