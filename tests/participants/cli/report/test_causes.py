"""A checkpoint's causes: the participant that failed and how, never a consequence blamed on the
controller, in words (the error's name and message, cut at a word); gathered per trace and per
checkpoint as the overview folds the logs, and said by ``overview`` as ``report`` prints them."""

from __future__ import annotations

import contextlib
import errno
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    Event,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StepFinished,
    StepStarted,
    Telemetry,
)
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.fleet import local_fleet, serving
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.causes import (
    CAUSES_SHOWN,
    KEPT_CAUSES,
    CheckpointCauses,
    SpanError,
    TraceCauses,
    causes_of,
    open_causes,
    shown,
)
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.events import event_time
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.controller.types import (
    FAILURES_ATTRIBUTE,
    Member,
    MemberFailure,
    failures_value,
)
from ckpt_events.participants.errors import CoordinationError
from ckpt_events.participants.faults import FaultPlan
from ckpt_events.participants.protocol import NOT_READY_WORKER_BLOCKERS, NOT_READY_WORKERS
from ckpt_events.participants.server.app import make_workload
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events
from ckpt_events.vocab import CollectionAction, ErrorCode, Operation, Outcome, Phase
from tests.participants.controller.test_failures import run_refused_checkpoint
from tests.participants.helpers import TOKEN, running

_NOT_PREPARED = (
    "ckpt_events.participants.errors.CheckpointNotPrepared",
    "checkpoint c1 not prepared: stopped at stage environment with 1 blocker",
)


async def _reported(events: Sequence[Event], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``report`` on ``events`` written as a run's JSON-lines log: its output on one line (the
    terminal wraps long lines)."""
    log = tmp_path / "run.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(list(events))
    sink.close()
    assert await anyio.to_thread.run_sync(main, ["report", str(log)]) == 0
    return " ".join(capsys.readouterr().out.split())


async def test_report_names_the_participant_that_refused_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One participant started with another token: ``report`` on the run's log names it, its
    code and its status as the cause, and blames nothing on the controller. It said: "#1
    checkpoint failed: resume failed on controller (ckpt_events.participants.errors.
    CoordinationError: resume failed: agent-0: http://127.0.0.1:41571/ng-control/v…)"."""
    events = await run_refused_checkpoint(tmp_path)
    out = await _reported(events, tmp_path, capsys)
    cause = re.search(r"#1 checkpoint failed: (.*?) checkpoint c1", out)
    assert cause is not None, out
    assert cause.group(1) == (
        "agent/agent-0 refused: unauthorized (401): missing or wrong bearer token (at prepare and resume)"
    )
    # The overview, before the detail: its waterfall's controller rows say what they recorded
    # (``coordinate.prepare ✗ ...CoordinationError``, and the message under it).
    overview = out.split(" waterfall (", 1)[0]
    assert "on controller" not in out and "CoordinationError" not in overview


@pytest.mark.parametrize("slow_step", ["link_manifest", "fsync_dir_manifest"])
async def test_report_names_the_lease_a_commit_outlived_not_a_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slow_step: str
) -> None:
    """A commit whose write ran past its lease (a real app, a real coordinator): the controller's
    error and the report's cause name the lease and the participant, not a resume and not the
    controller. Both said "checkpoint c1 was resumed during commit", when nobody resumed it.
    Its manifest, linked before the lease was found ended, is withdrawn, and both say so (it
    stayed, restorable, under an aborted checkpoint)."""

    # The deadline leaves the prepare time on a loaded machine (at 0.2 s, a loaded suite run's
    # prepare was refused "deadline_ts has passed"); the slow step then runs until the lease
    # (the deadline and its 0.1 s grace) has run out, however long the prepare took.
    deadline = time.time() + 1.0

    def slow(step: str) -> None:
        if step == slow_step:
            time.sleep(max(0.0, deadline + 0.1 - time.time()) + 0.3)  # the lease runs out meanwhile

    async with capture_events() as (bus, events):
        app = create_app(
            "resources",
            instance="resources-0",
            token=TOKEN,
            checkpoint_root=tmp_path,
            bus=bus,
            lease_grace_seconds=0.1,
            faults=FaultPlan(on_step=slow),
        )
        async with running(app) as client:
            await client.post("/work/start", json={"rollout_id": "r1", "attempt": 0, "steps": 3})
            tel = Telemetry(bus, kind="controller", instance="coordination")
            member = Member(name="resources-0", kind="resources", instance="resources-0", url="http://test")
            async with Coordinator([member], token=TOKEN, telemetry=tel, client=client) as co:
                with pytest.raises(CoordinationError) as info:
                    await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=deadline)
    said = info.value.failures["resources-0"]
    assert said.startswith("refused: stale_checkpoint (409): checkpoint c1 outlived its lease during commit")
    out = await _reported(events, tmp_path, capsys)
    cause = re.search(r"#1 checkpoint aborted: (.*?) checkpoint c1 \(aborted\)", out)
    assert cause is not None, out
    assert cause.group(1).startswith(
        "resources/resources-0 refused: stale_checkpoint (409): checkpoint c1 outlived its lease"
    )
    assert "lease expired on resources/resources-0 in phase prepared" in cause.group(1)
    assert "resumed during" not in out and "on controller" not in out
    assert "during commit, its manifest withdrawn" in said and "its manifest withdrawn" in cause.group(1)
    assert not list((tmp_path / "ck").glob("gym/*/*/manifest.json"))


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


def _failed_commit(error_type: str, message: str) -> OperationFinished:
    """environment-0's commit, under the controller's span 1, failed with ``error_type``."""
    return OperationFinished(
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
        error_type=error_type,
        error_message=message,
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
    failed = _failed_commit("ckpt_events.participants.errors.CheckpointWriteError", words)
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
    failed = _failed_commit("ckpt_events.participants.errors.ProtocolRefusal", f"checkpoint_error: {detail}")
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


# -- the module's own functions, on real events ----------------------------------------------


def _participant(cls: Any, who: str, span_id: int, start: int, end: int | None = None, **fields: Any) -> Any:
    """A span's event of ``who`` (``kind-N``) in trace 7 of checkpoint c1 (``end=None``: its start)."""
    ends = {} if end is None else {"end_ns": end}
    kind = who.rsplit("-", 1)[0]
    return cls(
        kind=kind,
        instance=who,
        trace_id=7,
        span_id=span_id,
        start_ns=start,
        checkpoint_id="c1",
        **ends,
        **fields,
    )


def test_a_span_that_failed_keeps_its_error_in_words_and_marks_its_parent() -> None:
    """An operation that ended in error keeps when, where, who and its words (the error's name,
    not its module path) and marks its parent as failed below; a span that ended well keeps nothing."""
    causes = TraceCauses()
    ok = _participant(OperationFinished, "model-0", 3, 0, 10, operation=Operation.COMMIT, parent_span_id=1)
    causes.span_failed(ok, 10)
    assert causes == TraceCauses()
    failed = _participant(
        OperationFinished,
        "agent-0",
        2,
        0,
        20,
        operation=Operation.PREPARE,
        parent_span_id=1,
        outcome=Outcome.ERROR,
        error_type="ckpt_events.participants.errors.WorkError",
        error_message="upstream went away",
    )
    causes.span_failed(failed, 20)
    said = "prepare failed on agent/agent-0 (WorkError: upstream went away)"
    error = "WorkError: upstream went away"
    assert causes.errors == [
        SpanError(20, 0, 2, "agent/agent-0", "prepare", said, [], 1, None, "WorkError", error)
    ]
    assert set(causes.first_failed_below) == {1}
    assert not causes.stops


def test_a_prepare_not_prepared_is_a_stop_and_a_failure_below_its_parent() -> None:
    """A coordinate.prepare that was not prepared keeps where it stopped; with no ``stopped_at``
    it says ``?``; its parent is failed below."""
    causes = TraceCauses()
    stopped = _span(CoordinateFinished, 2, 1, 5, 45, operation=Operation.PREPARE, prepared=False)
    causes.span_failed(stopped, 45)
    assert causes.stops == ["prepare stopped at stage ?, not prepared"]
    assert set(causes.first_failed_below) == {1}
    assert not causes.errors


def test_a_stage_error_counts_as_the_prepare_it_belongs_to() -> None:
    """A stage of coordinate.prepare that failed is a prepare failure: the controller's record of
    the same member at prepare says it once, with every operation it was said at, first in time."""
    record = failures_value(
        [Member("agent-0", "agent", "agent-0", "u")], {"agent-0": "refused: unauthorized (401): wrong token"}
    )
    recorded = {"attributes": {FAILURES_ATTRIBUTE: record}, "outcome": Outcome.ERROR}
    causes = TraceCauses()
    causes.span_failed(_span(StageFinished, 3, 2, 10, 40, stage="agent", **recorded), 40)
    causes.span_failed(_span(CoordinateFinished, 4, None, 50, 90, operation=Operation.RESUME, **recorded), 90)
    assert [e.operation for e in causes.errors] == ["prepare", "resume"]
    assert causes.errors[0].members == [
        MemberFailure("agent", "agent-0", "refused: unauthorized (401): wrong token")
    ]
    said, aborted = causes_of([causes], [])
    assert said == ["agent/agent-0 refused: unauthorized (401): wrong token (at prepare and resume)"]
    assert not aborted


def test_a_participant_frozen_through_its_prepare_comes_before_a_lease_that_ran_out_meanwhile() -> None:
    """model-0 stopped (SIGSTOP) before its prepare: the controller's call went unanswered for its
    8 s timeout, and environment-0's short lease ran out 5 s after its prepare while it waited.
    The frozen participant, whose call was made first, leads; the expiry follows from it."""
    members = [Member("model-0", "model", "model-0", "u")]
    timed_out = "no whole reply from u/prepare: ReadTimeout: no answer within 8.0 s"
    record = failures_value(members, {"model-0": timed_out})
    trace = TraceCauses(prepares={"environment/environment-0": 1_000_000_000})
    stage = _span(
        StageFinished,
        3,
        2,
        1_010_000_000,
        9_010_000_000,
        stage="model",
        attributes={FAILURES_ATTRIBUTE: record},
        outcome=Outcome.ERROR,
    )
    trace.span_failed(stage, stage.end_ns)
    expired = LeaseExpired("environment", "environment-0", 6_000_000_000, Phase.PREPARED, "c1")
    said, aborted = causes_of([trace], [expired])
    assert said == [
        "model/model-0 no whole reply from u/prepare: ReadTimeout: no answer within 8.0 s (at prepare)",
        "lease expired on environment/environment-0 in phase prepared, 5.0 s after its prepare",
    ]
    assert aborted


def test_a_prepare_blocked_by_a_silent_worker_names_the_worker_not_an_episode() -> None:
    """A ``--workers`` server whose worker 1 was frozen through the prepare: its not-ready count
    is that worker, which its prepare's span names; with an episode blocking too, both are said."""
    trace = TraceCauses()
    words = "worker 1 unreported (connected, no answer)"
    attributes = {NOT_READY_WORKERS: words, NOT_READY_WORKER_BLOCKERS: 1}
    trace.prepare_finished(
        _participant(
            OperationFinished,
            "environment-0",
            3,
            10,
            3_000,
            operation=Operation.PREPARE,
            attributes=attributes,
        )
    )
    alone = PrepareNotReady("environment", "environment-0", 3_000, 1, "c1")
    assert causes_of([trace], [alone]) == (
        [f"not ready at its deadline: environment/environment-0 blocked by {words}"],
        True,
    )
    both = PrepareNotReady("environment", "environment-0", 3_000, 2, "c1")
    assert causes_of([trace], [both])[0] == [
        f"not ready at its deadline: environment/environment-0 blocked by {words} and 1 episode"
    ]
    other = PrepareNotReady("environment", "environment-1", 3_000, 1, "c1")
    assert causes_of([trace], [other])[0] == [
        "not ready at its deadline: environment/environment-1 blocked by 1 episode"
    ]


def test_a_lease_expiry_is_timed_from_the_participants_first_prepare_and_aborts() -> None:
    """A lease expiry says its phase and how long after that participant's first prepare it came
    (over every trace of the row); a prepare not ready says its blockers; both abort, in time order."""
    first, second = TraceCauses(prepares={"agent/agent-0": 2_000_000_000}), TraceCauses()
    second.prepares["agent/agent-0"] = 1_000_000_000
    expired = LeaseExpired("agent", "agent-0", 3_500_000_000, Phase.PREPARED, "c1")
    not_ready = PrepareNotReady("environment", "environment-0", 1_500_000_000, 3, "c1")
    said, aborted = causes_of([first, second], [expired, not_ready])
    assert said == [
        "not ready at its deadline: environment/environment-0 blocked by 3 episodes",
        "lease expired on agent/agent-0 in phase prepared, 2.5 s after its prepare",
    ]
    assert aborted
    lone = LeaseExpired("model", "model-0", 5, Phase.PREPARING, "c1")
    assert causes_of([first], [lone]) == (["lease expired on model/model-0 in phase preparing"], True)


def test_with_clocks_that_disagree_the_causes_that_aborted_come_first() -> None:
    """environment-1's clock stepped 5 s ahead: its lease expiry is stamped after the refusals at
    the commit that followed from it. Their order by stamps is unknown, so with
    ``clocks_agree=False`` the expiry leads (it was fifth, cut from the row as '... and 1 more');
    with clocks that agree, time order stands."""
    trace = TraceCauses(prepares={"environment/environment-1": 1_000_000_000})
    expired = LeaseExpired("environment", "environment-1", 8_500_000_000, Phase.PREPARED, "c1")
    refusals = [
        Refused("agent", f"agent-{i}", 4_000_000_000 + i, ErrorCode.DEADLINE_EXCEEDED, "c1") for i in range(4)
    ]
    said, aborted = causes_of([trace], [*refusals, expired], clocks_agree=False)
    assert said[0] == "lease expired on environment/environment-1 in phase prepared, 7.5 s after its prepare"
    assert said[1:] == [f"agent/agent-{i} refused: deadline_exceeded (409)" for i in range(4)]
    assert aborted
    in_time, _ = causes_of([trace], [*refusals, expired])
    assert in_time == [*said[1:], said[0]]


def test_the_overview_leads_with_the_abort_when_a_clock_is_not_aligned() -> None:
    """End to end: a prepare that answered outside the controller's call (a clock no shift
    aligns) makes the overview row lead with the lease expiry, not the refusals after it."""
    call = StageFinished(
        "controller", "coordination", 7, 2, 1_000_000_000, 1_100_000_000, "environment", "c1", 1
    )
    # Stamped 5 s late by its clock: outside the call that it answered.
    prepare = OperationFinished(
        "environment", "environment-1", 7, 3, 6_010_000_000, 6_020_000_000, Operation.PREPARE, "c1", 2, True
    )
    expired = LeaseExpired("environment", "environment-1", 8_600_000_000, Phase.PREPARED, "c1")
    refusals = [
        Refused("agent", f"agent-{i}", 4_000_000_000 + i, ErrorCode.DEADLINE_EXCEEDED, "c1") for i in range(4)
    ]
    root = _span(
        CollectionFinished,
        1,
        None,
        900_000_000,
        4_100_000_000,
        action=CollectionAction.CHECKPOINT,
        outcome=Outcome.ERROR,
        published=False,
    )
    events: list[Any] = sorted([call, prepare, expired, *refusals, root], key=event_time)
    clocks = ClockEvidence()
    for e in events:
        clocks.add(e)
    assert clocks.outside == {7}
    (row,) = overview(events, clocks=clocks).rows
    assert row.outcome == "aborted"
    lead = "lease expired on environment/environment-1 in phase prepared"
    assert row.causes[0].startswith(lead), row.causes
    # The same logs with clocks taken to agree: the expiry, last in time, was cut.
    (timed,) = overview(events).rows
    assert not any(c.startswith("lease expired") for c in timed.causes), timed.causes


def test_a_refusal_is_said_with_its_status_and_never_aborts() -> None:
    """A refusal names the participant, its code and HTTP status; it is a cause, not an abort."""
    refused = Refused("agent", "agent-0", 7, ErrorCode.UNAUTHORIZED, "c1")
    assert causes_of([TraceCauses()], [refused]) == (["agent/agent-0 refused: unauthorized (401)"], False)


def test_a_controller_error_that_follows_is_said_only_when_nothing_else_is() -> None:
    """A controller span whose child failed is said when no other cause is; a participant's
    failure, or a counted event, takes its place; with neither, the stops are said."""
    error = {"outcome": Outcome.ERROR, "error_type": "CoordinationError", "error_message": "commit failed"}
    causes = TraceCauses()
    causes.span_failed(
        _span(CoordinateFinished, 2, 1, 5, 45, operation=Operation.PREPARE, prepared=False), 45
    )
    causes.span_failed(
        _span(CollectionFinished, 1, None, 0, 60, action=CollectionAction.CHECKPOINT, **error), 60
    )
    following = "checkpoint failed on controller (CoordinationError: commit failed)"
    assert causes_of([causes], []) == ([following], False)
    refused = Refused("model", "model-0", 50, ErrorCode.STALE_CHECKPOINT, "c1")
    assert causes_of([causes], [refused]) == (["model/model-0 refused: stale_checkpoint (409)"], False)
    stopped = TraceCauses(stops=["prepare stopped at stage model, not prepared"])
    assert causes_of([stopped], []) == (["prepare stopped at stage model, not prepared"], False)


def test_past_kept_causes_a_checkpoints_counted_events_are_only_counted() -> None:
    """The first ``KEPT_CAUSES`` events naming a checkpoint are kept in the order read, the rest
    counted; other checkpoints are apart, and no checkpoint id has none."""
    causes = CheckpointCauses()
    flood = [Refused("agent", "agent-0", t, ErrorCode.STALE_ATTEMPT, "c1") for t in range(KEPT_CAUSES + 5)]
    for e in flood:
        causes.add("c1", e)
    causes.add("c2", flood[0])
    assert causes.of("c1") == flood[:KEPT_CAUSES]
    assert causes.over == {"c1": 5}
    assert causes.of("c2") == [flood[0]]
    assert causes.of(None) == [] and causes.of("") == [] and causes.of("c3") == []


def test_copies_of_a_kept_cause_are_counted_beside_it_wherever_they_come() -> None:
    """An event equal in every field to one kept (of the same trace) takes no place of its own,
    before ``KEPT_CAUSES`` or past it: a log joined to itself kept 64 copies of one refusal and
    counted the rest as more causes. One of another trace, or stamped apart, is its own."""
    causes = CheckpointCauses()
    copy = Refused("agent", "agent-0", 5, ErrorCode.STALE_ATTEMPT, "c1")
    flood = [
        Refused("agent", "agent-0", t, ErrorCode.STALE_ATTEMPT, "c1") for t in range(100, 100 + KEPT_CAUSES)
    ]
    causes.add("c1", copy, trace=7)
    for e in flood:
        causes.add("c1", e, trace=7)
        causes.add("c1", copy, trace=7)
    causes.add("c1", copy, trace=8)
    assert causes.of("c1") == [copy, *flood[: KEPT_CAUSES - 1]]
    assert causes.traced("c1")[0] == (copy, 7, KEPT_CAUSES + 1)
    assert [n for _, _, n in causes.traced("c1")[1:]] == [1] * (KEPT_CAUSES - 1)
    assert causes.over == {"c1": 2}  # flood's last, and the copy of trace 8


def test_a_cause_said_more_than_once_is_said_once_with_its_count() -> None:
    """The same clause from copies (``counts``) or from events alike stamped apart is said once,
    at its first time, with how many times the logs said it; distinct causes keep their order."""
    trace = TraceCauses(prepares={"environment/environment-0": 0})
    stalled = PrepareNotReady("environment", "environment-0", 3_000, 1, "c1")
    again = PrepareNotReady("environment", "environment-0", 9_000, 1, "c1")
    refused = Refused("agent", "agent-0", 5_000, ErrorCode.STALE_ATTEMPT, "c1")
    said, aborted = causes_of([trace], [stalled, refused, again], counts=[999, 1, 1])
    assert aborted
    assert said == [
        "not ready at its deadline: environment/environment-0 blocked by 1 episode "
        "(x1,000 in the logs: copies, or events alike)",
        "agent/agent-0 refused: stale_attempt (409)",
    ]
    assert causes_of([trace], [stalled, refused])[0] == [
        "not ready at its deadline: environment/environment-0 blocked by 1 episode",
        "agent/agent-0 refused: stale_attempt (409)",
    ]


def test_shown_keeps_the_first_causes_and_counts_the_rest_and_those_over() -> None:
    """At most ``CAUSES_SHOWN`` causes, then ``... and N more`` counting the rest and those past
    ``KEPT_CAUSES``."""
    causes = [f"cause {i}" for i in range(CAUSES_SHOWN + 2)]
    assert shown(causes[:CAUSES_SHOWN], 0) == causes[:CAUSES_SHOWN]
    assert shown(causes, 0) == [*causes[:CAUSES_SHOWN], "... and 2 more"]
    assert shown(causes[:1], 1_000) == ["cause 0", "... and 1,000 more"]
    assert shown(causes, 1_000) == [*causes[:CAUSES_SHOWN], "... and 1,002 more"]
    assert shown([], 0) == []


def test_an_open_row_names_its_oldest_open_spans_and_who_never_answered() -> None:
    """The oldest open spans with their age when the logs end, a count of the rest, and the
    participants with an operation still open, sorted."""
    spans = [
        _participant(OperationStarted, f"environment-{i}", 10 + i, 1_000_000 * i, operation=Operation.PREPARE)
        for i in range(CAUSES_SHOWN + 1)
    ]
    step = _participant(StepStarted, "agent-0", 30, 500_000, step="write", parent_span_id=10)
    causes = open_causes(reversed([*spans, step]), 10_000_000)
    assert causes == [
        "prepare on environment/environment-0 still open, 10.0 ms",
        "write on agent/agent-0 still open, 9.5 ms",
        "prepare on environment/environment-1 still open, 9.0 ms",
        "prepare on environment/environment-2 still open, 8.0 ms",
        "... 2 more open spans",
        "never answered: " + ", ".join(f"environment/environment-{i}" for i in range(CAUSES_SHOWN + 1)),
    ]
    assert open_causes([], 0) == []


def test_a_controller_error_before_the_failure_below_it_is_the_cause() -> None:
    """The controller's own deadline cancels its prepare stage at 50 while environment-0 waits to
    be ready; the resume that follows makes environment-0's prepare fail at 60 (stale_checkpoint,
    resumed while preparing). The controller's cancel is the first cause (it was "following" the
    participant's failure, so the participant alone was blamed); the participant's is said after."""
    cancelled = {
        "outcome": Outcome.ERROR,
        "error_type": "asyncio.exceptions.CancelledError",
        "error_message": "Cancelled via cancel scope 7f; reason: deadline exceeded",
    }
    causes = TraceCauses()
    causes.span_failed(_span(StageFinished, 3, 2, 10, 50, stage="environment", **cancelled), 50)
    causes.span_failed(
        _span(CoordinateFinished, 2, None, 5, 51, operation=Operation.PREPARE, **cancelled), 51
    )
    resumed = _participant(
        OperationFinished,
        "environment-0",
        4,
        12,
        60,
        operation=Operation.PREPARE,
        parent_span_id=3,
        outcome=Outcome.ERROR,
        error_type="ckpt_events.participants.errors.ProtocolRefusal",
        error_message="stale_checkpoint: checkpoint c1 was resumed while preparing",
    )
    causes.span_failed(resumed, 60)
    said, aborted = causes_of([causes], [])
    assert said == [
        "prepare stage environment cancelled on controller (CancelledError: Cancelled via cancel scope 7f; "
        "reason: deadline exceeded)",
        "prepare failed on environment/environment-0 (stale_checkpoint: checkpoint c1 was resumed "
        "while preparing)",
    ]
    assert not aborted


async def _restore_killed_then_retried() -> list[Any]:
    """A bare coordinator's restore of c1 whose model server is killed mid-read (its restore and
    read started, never finished; the controller's call fails on the reset connection), then
    the same restore run again, which restores."""
    from ckpt_events import Telemetry
    from ckpt_events.testing import capture_events

    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        environment = Telemetry(bus, kind="environment", instance="environment-0")
        model = Telemetry(bus, kind="model", instance="model-0")
        with pytest.raises(ConnectionResetError), ctl.coordinate("restore", checkpoint_id="c1") as call:
            with environment.operation("restore", checkpoint_id="c1", traceparent=call.traceparent()) as op:
                with op.step("read"):
                    pass
            killed = model.operation("restore", checkpoint_id="c1", traceparent=call.traceparent())
            killed.__enter__()  # killed mid-read: neither span ever ends
            killed.step("read").__enter__()
            raise ConnectionResetError("model-0: connection reset by peer")
        with ctl.coordinate("restore", checkpoint_id="c1") as call:
            for tel in (environment, model):
                with tel.operation("restore", checkpoint_id="c1", traceparent=call.traceparent()) as op:
                    with op.step("read"):
                        pass
    return events


def test_a_restore_retried_after_a_killed_participant_is_two_rows_the_first_naming_it() -> None:
    """The retry is a row of its own, restored; the first failed, its cause the model's restore
    that never finished before the controller's reset connection, and its longest read unknown
    (the model's never ended). Merged, the run said one restore, failed, blaming the controller,
    with the environment's read as the longest."""
    events = anyio.run(_restore_killed_then_retried)
    first, retry = overview(events).rows
    assert (first.what, first.outcome) == ("restore", "failed")
    assert (retry.what, retry.outcome) == ("restore", "restored")
    assert (
        first.causes[0] == "restore on model/model-0 has no end in the logs (its process killed mid-call?)"
    ), first.causes
    assert first.causes[1].startswith("restore failed on controller (ConnectionResetError"), first.causes
    assert first.dominated == (
        "longest read or install unknown: read on model/model-0 had not finished when the restore ended"
    )
    assert first.dominant_ms is None
    assert retry.causes == [] and retry.dominated.startswith(("read on", "longest read"))


async def _judge_killed_mid_download() -> list[Any]:
    """A restore of a user's judges: judge-0's ``download`` done in 1 tick, judge-1 killed mid-way
    through its own (neither its restore nor its step ever ends)."""
    from ckpt_events.testing import capture_events

    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        judges = [Telemetry(bus, kind="judge", instance=f"judge-{i}") for i in (0, 1)]
        with pytest.raises(ConnectionResetError), ctl.coordinate("restore", checkpoint_id="c1") as call:
            with judges[0].operation("restore", checkpoint_id="c1", traceparent=call.traceparent()) as op:
                with op.step("download"):
                    pass
            killed = judges[1].operation("restore", checkpoint_id="c1", traceparent=call.traceparent())
            killed.__enter__()
            killed.step("download").__enter__()
            raise ConnectionResetError("judge-1: connection reset by peer")
    return events


def test_a_users_restore_step_unfinished_leaves_the_longest_unknown() -> None:
    """Once a user's restore steps are weighed, one still open when the restore ended may be the
    longest: said unknown, naming it, never judge-0's finished ``download`` as the longest."""
    events = anyio.run(_judge_killed_mid_download)
    (row,) = overview(events).rows
    assert row.dominated == (
        "longest read or install unknown: download on judge/judge-1 had not finished when the restore ended"
    )
    assert row.dominant_ms is None


async def _two_failed_restores(skew_s: int, refusals: int = 1) -> list[Any]:
    """Two restores of c1, 5 s apart, both failed (the controller's calls ended in error): the
    first on agent-0's refusal (counted ``refusals`` times), the second on model-0's; agent-0's
    clock ``skew_s`` ahead."""
    from ckpt_events import Telemetry
    from ckpt_events.testing import TickingClock, capture_events

    world = TickingClock()
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination", clock=world)
        agent = Telemetry(bus, kind="agent", instance="agent-0", clock=lambda: world() + skew_s * 10**9)
        model = Telemetry(bus, kind="model", instance="model-0", clock=world)
        failing = ((agent, ErrorCode.INVALID_CHECKPOINT_STATE), (model, ErrorCode.CHECKPOINT_ERROR))
        for refusing, code in failing:
            with pytest.raises(RuntimeError), ctl.coordinate("restore", checkpoint_id="c1") as call:
                for tel in (agent, model):
                    with pytest.raises(ValueError) if tel is refusing else contextlib.nullcontext():
                        with tel.operation("restore", checkpoint_id="c1", traceparent=call.traceparent()):
                            if tel is refusing:
                                raise ValueError(f"{tel.instance} refused")
                    if tel is refusing:  # as a server counts it: once its operation ended in error
                        for _ in range(refusals if tel is agent else 1):
                            tel.refused(code, checkpoint_id="c1")
                raise RuntimeError(f"restore failed: {refusing.instance}")
            world.now_ns += 5 * 10**9
    return events


@pytest.mark.parametrize("skew_s", [0, 120])
def test_a_refusal_is_said_on_its_own_restore_whatever_its_participants_clock(
    skew_s: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """agent-0's clock 2 minutes ahead and both restores' calls failed (so no call bounds its
    clock from above and nothing is shifted): its refusal, stamped after the second restore
    started, was said as the second restore's cause, and the first's was lost. A counted event
    belongs to its participant's operation, by that participant's own clock, on every clock."""
    monkeypatch.setenv("COLUMNS", "400")
    events = anyio.run(_two_failed_restores, skew_s)
    for process in ("agent-0", "model-0", "coordination"):
        sink = JsonLinesSink(tmp_path / f"{process}.jsonl")
        sink.handle([e for e in events if e.instance == process])
        sink.close()
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("#1 restore failed: "))
    second = next(line for line in out.splitlines() if line.startswith("#2 restore failed: "))
    assert "agent/agent-0 refused: invalid_checkpoint_state" in first, out
    assert "agent/agent-0 refused" not in second, out
    assert "model/model-0 refused: checkpoint_error" in second, out
    # The detail of the second restore holds no refusal of the first.
    problems = LogProblems()
    run = overview(list(merged_events(sorted(tmp_path.glob("*.jsonl")), problems)))
    details = run.details(run.rows)
    refusals = [[e.instance for e in details[id(row)] if isinstance(e, Refused)] for row in run.rows]
    assert refusals == [["agent-0"], ["model-0"]]


def test_a_flood_of_refusals_is_counted_on_its_own_restore_whatever_its_participants_clock() -> None:
    """Past ``KEPT_CAUSES``, agent-0's refusals of the first restore, stamped 2 minutes ahead,
    were counted as '... and N more' on the second restore's row; they are the first's. The
    kept ones (c1's first 64 events: model-0's refusal, then 63 of agent-0's, each stamped apart)
    are one cause said with its count, the rest counted after it."""
    events = anyio.run(_two_failed_restores, 120, KEPT_CAUSES + 10)
    first, second = overview(sorted(events, key=event_time)).rows
    kept = KEPT_CAUSES - 1
    assert first.causes[2:] == [
        "agent/agent-0 refused: invalid_checkpoint_state (422) "
        f"(x{kept} in the logs: copies, or events alike)",
        f"... and {KEPT_CAUSES + 10 - kept:,} more",
    ], first.causes
    assert not any(c.startswith("...") for c in second.causes), second.causes


async def _refused_without_an_operation(skew_s: int) -> list[Any]:
    """Two failed restores of c1, 5 s apart: agent-0 (clock ``skew_s`` ahead) counts a refusal
    during the first without an operation of its own (a server of the user's that refuses
    before opening one), model-0 answers both and fails the second."""
    from ckpt_events import Telemetry
    from ckpt_events.testing import TickingClock, capture_events

    world = TickingClock()
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination", clock=world)
        agent = Telemetry(bus, kind="agent", instance="agent-0", clock=lambda: world() + skew_s * 10**9)
        model = Telemetry(bus, kind="model", instance="model-0", clock=world)
        for fails in (False, True):
            with pytest.raises(RuntimeError), ctl.coordinate("restore", checkpoint_id="c1") as call:
                if not fails:
                    agent.refused(ErrorCode.INVALID_CHECKPOINT_STATE, checkpoint_id="c1")
                with contextlib.suppress(OSError):
                    with model.operation("restore", checkpoint_id="c1", traceparent=call.traceparent()):
                        if fails:
                            raise OSError("disk gone")
                raise RuntimeError("restore failed")
            world.now_ns += 5 * 10**9
    return events


def test_a_refusal_no_clock_places_is_said_as_of_either_restore_never_of_one() -> None:
    """agent-0's refusal names c1 and no operation, and no call bounds agent-0's clock (2
    minutes ahead): by its stamp it was said as the second restore's cause, plainly. Which
    restore it was is unknown, so each row says it as of this one or another, and neither
    row's detail counts it (the second's did)."""
    events = sorted(anyio.run(_refused_without_an_operation, 120), key=event_time)
    clocks = ClockEvidence()
    for e in events:
        clocks.add(e)
    first, second = overview(events, clocks=clocks).rows
    plain = "agent/agent-0 refused: invalid_checkpoint_state (422)"
    for row in (first, second):
        assert plain not in row.causes, row.causes
        assert any(c.startswith(f"{plain}, of this restore or another of c1") for c in row.causes), row.causes
    # Its copy (the log joined to itself) is the same cause in doubt: said once, counted.
    copied = overview(
        sorted([*events, *(e for e in events if isinstance(e, Refused))], key=event_time), clocks=clocks
    )
    for row in copied.rows:
        in_doubt = [c for c in row.causes if c.startswith(f"{plain}, of this restore or another of c1")]
        assert len(in_doubt) == 1 and in_doubt[0].endswith(" (x2 in the logs: copies, or events alike)"), (
            row.causes
        )
    # Nor is it counted in either row's detail as that row's.
    run = overview(events, clocks=clocks)
    details = run.details(run.rows)
    assert not any(isinstance(e, Refused) for row in run.rows for e in details[id(row)])


async def _two_failed_commits(skew_s: int) -> list[Any]:
    """A bare coordinator's two checkpoints with id c1, 5 s apart (each a prepare root and a
    commit root): agent-0 (clock ``skew_s`` ahead) refuses the first's commit, model-0 the
    second's, each after its operation ended in error, as a server counts it."""
    from ckpt_events import Telemetry
    from ckpt_events.testing import TickingClock, capture_events

    world = TickingClock()
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination", clock=world)
        agent = Telemetry(bus, kind="agent", instance="agent-0", clock=lambda: world() + skew_s * 10**9)
        model = Telemetry(bus, kind="model", instance="model-0", clock=world)
        for refusing in (agent, model):
            with ctl.coordinate("prepare", checkpoint_id="c1") as call:
                for tel in (agent, model):
                    with tel.operation("prepare", checkpoint_id="c1", traceparent=call.traceparent()):
                        pass
            with pytest.raises(RuntimeError), ctl.coordinate("commit", checkpoint_id="c1") as call:
                for tel in (agent, model):
                    with contextlib.suppress(ValueError):
                        with tel.operation("commit", checkpoint_id="c1", traceparent=call.traceparent()):
                            if tel is refusing:
                                raise ValueError("refused")
                    if tel is refusing:
                        tel.refused(ErrorCode.INVALID_PHASE, checkpoint_id="c1")
                raise RuntimeError("commit failed")
            world.now_ns += 5 * 10**9
    return events


def test_a_commit_refusal_is_said_on_its_own_checkpoint_whatever_its_participants_clock() -> None:
    """The commit rows too: agent-0 2 minutes ahead, its commit refusal of the first c1 was said
    on the second c1 (the first lost it); it belongs to the row of its own operation's trace."""
    events = sorted(anyio.run(_two_failed_commits, 120), key=event_time)
    clocks = ClockEvidence()
    for e in events:
        clocks.add(e)
    first, second = overview(events, clocks=clocks).rows
    assert "agent/agent-0 refused: invalid_phase (409)" in first.causes, first.causes
    assert not any(c.startswith("agent/agent-0") for c in second.causes), second.causes
    assert "model/model-0 refused: invalid_phase (409)" in second.causes, second.causes


def test_a_refusal_in_a_trace_two_rows_of_its_id_share_goes_by_time_among_them() -> None:
    """A checkpoint of c1 and its restore given one traceparent: the model's refusal during the
    restore names that shared trace, so the trace alone does not tell the row; among the rows
    that share it, time does (the trace's first row, the checkpoint, took it, and the failed
    restore said no cause of its own), and where no call bounds the clock, it is in doubt."""
    trace = 0xAB

    def root(cls: Any, span: int, start: int, action: CollectionAction, **fields: Any) -> Any:
        ends = {"end_ns": fields.pop("end")} if "end" in fields else {}
        return cls(
            "controller",
            "coordination",
            trace,
            span,
            start,
            checkpoint_id="c1",
            action=action,
            **ends,
            **fields,
        )

    def op(cls: Any, span: int, parent: int, start: int, operation: Operation, **fields: Any) -> Any:
        return cls(
            "model",
            "model-0",
            trace,
            span,
            start,
            operation=operation,
            checkpoint_id="c1",
            parent_span_id=parent,
            parent_remote=True,
            **fields,
        )

    events: list[Any] = [
        root(CollectionStarted, 10, 0, CollectionAction.CHECKPOINT),
        op(OperationStarted, 11, 10, 10, Operation.COMMIT),
        op(OperationFinished, 11, 10, 10, Operation.COMMIT, end_ns=20),
        root(CollectionFinished, 10, 0, CollectionAction.CHECKPOINT, end=30, published=True),
        root(CollectionStarted, 20, 100, CollectionAction.RESTORE),
        op(OperationStarted, 21, 20, 110, Operation.RESTORE),
        op(OperationFinished, 21, 20, 110, Operation.RESTORE, end_ns=120, outcome=Outcome.ERROR),
        Refused("model", "model-0", 121, ErrorCode.INVALID_PHASE, "c1"),
        root(CollectionFinished, 20, 100, CollectionAction.RESTORE, end=130, outcome=Outcome.ERROR),
    ]
    checkpoint, restore = overview(events).rows
    assert (checkpoint.what, restore.what) == ("checkpoint", "restore")
    assert "model/model-0 refused: invalid_phase (409)" in restore.causes, restore.causes
    # No call bounds model-0's clock (a collection's root is no call): which row is unknown.
    clocks = ClockEvidence()
    for e in events:
        clocks.add(e)
    _, restore = overview(events, clocks=clocks).rows
    assert restore.causes[-1].startswith(
        "model/model-0 refused: invalid_phase (409), of this restore or another of c1"
    ), restore.causes


def _bad_rows(step: str) -> None:
    """A store step hook: the records a commit writes are refused as bad."""
    if step == "write_records":
        raise ValueError("bad rows in shard 3")


def _disk_full(step: str) -> None:
    """A store step hook: the disk is full as the records are written."""
    if step == "write_records":
        raise OSError(errno.ENOSPC, "No space left on device")


async def _failed_writes(root: Path, instances: Sequence[str], on_step: Any) -> list[Any]:
    """A checkpoint of c1 by real resources participants ``instances`` (uvicorn on 127.0.0.1)
    under a real ``Coordinator``, each commit's write failing at ``on_step``; its events."""
    members = [("resources", i) for i in instances]
    async with capture_events() as (bus, events):
        async with local_fleet(
            token=TOKEN, bus=bus, members=members, checkpoint_root=root, faults=FaultPlan(on_step=on_step)
        ) as urls:
            fleet = [Member(name=i, kind=k, instance=i, url=urls[i]) for k, i in members]
            tel = Telemetry(bus, kind="controller", instance="coordination")
            async with Coordinator(fleet, token=TOKEN, telemetry=tel) as co:
                with pytest.raises(CoordinationError):
                    await co.checkpoint("c1", str(root / "ck"), deadline_ts=time.time() + 10)
        await bus.flush()
    return events


@pytest.mark.parametrize(
    ("on_step", "said"),
    [
        (_bad_rows, "bad rows in shard 3 (at commit step write, raising ValueError)"),
        # A refusal's name is not said: the code the controller got is.
        (_disk_full, "cannot write records in {ck}/gym/resources/"),
    ],
)
async def test_a_failed_step_the_controller_recorded_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], on_step: Any, said: str
) -> None:
    """A real participant's commit fails at its write step: the controller's record and the
    step are one failure, said once with the facts of both (the code the controller got, the
    step, the error's name). It said it twice: "resources/resources-0 refused: checkpoint_error
    (409): bad rows in shard 3 (at commit); write failed on resources/resources-0 (ValueError:
    bad rows in shard 3)"."""
    events = await _failed_writes(tmp_path, ["resources-0"], on_step)
    out = await _reported(events, tmp_path, capsys)
    cause = re.search(r"#1 checkpoint failed: (.*?) checkpoint c1", out)
    assert cause is not None, out
    refused = "resources/resources-0 refused: checkpoint_error (409): "
    assert cause.group(1).startswith(refused + said.format(ck=tmp_path / "ck")), out
    assert cause.group(1).endswith(
        " (at commit step write" + (", raising ValueError)" if on_step is _bad_rows else ")")
    )
    assert "; " not in cause.group(1).removeprefix(refused) and "write failed" not in out, out


async def test_two_participants_whose_steps_failed_are_both_said(tmp_path: Path) -> None:
    """Two real participants fail their commit's write: each is said once, by its own record
    with its step, neither lost to the other."""
    events = await _failed_writes(tmp_path, ["resources-0", "resources-1"], _bad_rows)
    (row,) = overview(sorted(events, key=event_time)).rows
    assert sorted(row.causes) == [
        f"resources/resources-{i} refused: checkpoint_error (409): bad rows in shard 3 "
        "(at commit step write, raising ValueError)"
        for i in (0, 1)
    ], row.causes


async def _step_and_operation_failing_differently() -> list[Any]:
    """model-0's commit: its write step fails (ValueError), the commit goes on and fails
    otherwise (OSError); the controller records the commit's failure."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        model = Telemetry(bus, kind="model", instance="model-0")
        member = Member("model-0", "model", "model-0", "u")
        record = failures_value([member], {"model-0": "refused: checkpoint_error (409): disk gone"})
        with pytest.raises(RuntimeError), ctl.coordinate("commit", checkpoint_id="c1") as call:
            with pytest.raises(OSError):
                with model.operation("commit", checkpoint_id="c1", traceparent=call.traceparent()) as op:
                    with contextlib.suppress(ValueError), op.step("write"):
                        raise ValueError("bad rows in shard 3")
                    raise OSError("disk gone")
            call.set_attribute(FAILURES_ATTRIBUTE, record)
            raise RuntimeError("commit failed: model-0: refused: checkpoint_error (409): disk gone")
    return events


def test_a_participant_failing_twice_differently_keeps_both() -> None:
    """A step that failed otherwise than the operation the controller recorded is a failure of
    its own: both are said."""
    events = anyio.run(_step_and_operation_failing_differently)
    (row,) = overview(events).rows
    assert row.causes == [
        "model/model-0 refused: checkpoint_error (409): disk gone (at commit)",
        "write failed on model/model-0 (ValueError: bad rows in shard 3)",
    ], row.causes


async def test_a_workers_failed_share_the_controller_recorded_is_said_once(tmp_path: Path) -> None:
    """A real two-worker participant (its workers behind its real Unix socket, served by uvicorn
    on 127.0.0.1) whose workers' writes fail: the controller's record, each worker's share and
    step are one failure, said once with the step, the error's name and the workers. It said
    five: "resources/resources-0 refused: checkpoint_error (409): bad rows in shard 3 (at commit
    step write)", "write failed on resources/resources-0/w1 (ValueError: ...)", "commit failed on
    resources/resources-0/w1 (...)", "write failed on resources/resources-0/w0 (...)", "... and 1
    more": a worker's spans name ``kind/instance/wN``, the record ``kind/instance``."""
    async with capture_events() as (bus, events):

        def worker(index: int) -> Any:
            tel = Telemetry(bus, kind="resources", instance="resources-0", worker=index)
            return make_workload("resources", tel)

        app = create_app(
            "resources", instance="resources-0", token=TOKEN, bus=bus, checkpoint_root=tmp_path,
            faults=FaultPlan(on_step=_bad_rows), workers=2, worker_factory=worker,
        )  # fmt: skip
        async with serving(app) as url:
            tel = Telemetry(bus, kind="controller", instance="coordination")
            fleet = [Member("resources-0", "resources", "resources-0", url)]
            async with Coordinator(fleet, token=TOKEN, telemetry=tel) as co:
                with pytest.raises(CoordinationError):
                    await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 10)
        await bus.flush()
    assert {e.worker for e in events if isinstance(e, StepFinished) and e.step == "write"} == {None, 0, 1}
    (row,) = overview(sorted(events, key=event_time)).rows
    assert row.causes == [
        "resources/resources-0 refused: checkpoint_error (409): bad rows in shard 3 "
        "(at commit step write, raising ValueError, in workers w0, w1)"
    ], row.causes


async def _operation_failing_after_its_call_timed_out() -> list[Any]:
    """model-0's commit outlives the controller's call (recorded as no reply), then fails at
    its write step (ValueError)."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        model = Telemetry(bus, kind="model", instance="model-0")
        member = Member("model-0", "model", "model-0", "u")
        no_reply = "no whole reply from http://127.0.0.1:9/c: ReadTimeout: no answer within 5.4 s"
        record = failures_value([member], {"model-0": no_reply})
        with pytest.raises(RuntimeError), ctl.coordinate("commit", checkpoint_id="c1") as call:
            with pytest.raises(ValueError):
                with model.operation("commit", checkpoint_id="c1", traceparent=call.traceparent()) as op:
                    with op.step("write"):
                        raise ValueError("bad rows in shard 3")
            call.set_attribute(FAILURES_ATTRIBUTE, record)
            raise RuntimeError(f"commit failed: model-0: {no_reply}")
    return events


def test_an_operation_that_failed_after_its_call_timed_out_is_said_on_its_own() -> None:
    """The controller's call timed out, then the participant's operation failed otherwise: two
    failures, each said once (the operation with the step that failed it). The record took the
    step as its own: "model/model-0 no whole reply from ...: ReadTimeout: no answer within 5.4 s
    (at commit step write, raising ValueError)", and the operation's failure was dropped."""
    events = anyio.run(_operation_failing_after_its_call_timed_out)
    (row,) = overview(events).rows
    assert row.causes == [
        "model/model-0 no whole reply from http://127.0.0.1:9/c: ReadTimeout: no answer within 5.4 s "
        "(at commit)",
        "commit failed on model/model-0 at step write (ValueError: bad rows in shard 3)",
    ], row.causes
