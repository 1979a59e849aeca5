"""The run overview: one fold of the logs into rows, read again for the detail of chosen rows (the
causes of a row that did not publish are ``test_causes``'s)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import anyio

from ckpt_events.participants.cli.report.judge import PUBLISH_UNSAID, RESTORE_UNSAID
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import ErrorCode


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


def test_traces_let_go_past_the_unrooted_bound_are_said() -> None:
    """4,100 participants' traces whose root never comes, after a checkpoint and a restore: the
    fold keeps 4,096 of them waiting for a root and lets the 4 oldest go, and says so in one line
    (they were let go silently)."""
    from ckpt_events import OperationFinished
    from ckpt_events.vocab import Kind, Operation, Outcome
    from tests.participants.cli.report_events import checkpoint_and_restore

    events: list[Any] = anyio.run(checkpoint_and_restore)
    start = max(getattr(e, "end_ns", 0) for e in events) + 1_000
    rootless = [
        OperationFinished(
            kind=Kind.ENVIRONMENT,
            instance="environment-0",
            trace_id=(1 << 100) + n,
            span_id=n + 1,
            start_ns=start + n * 1_000,
            end_ns=start + n * 1_000 + 500,
            operation=Operation.PREPARE,
            checkpoint_id=f"elsewhere-{n}",
            parent_span_id=(1 << 62) + n,
            parent_remote=True,
            outcome=Outcome.OK,
        )
        for n in range(4_100)
    ]
    run = overview([*events, *rootless])
    assert run.rows  # the checkpoint and the restore
    assert run.unrooted_let_go == 4
    said = run.let_go_line()
    assert said is not None and said.startswith("4 traces with no root span were let go past 4,096")
    assert overview(events).let_go_line() is None


def _collection(trace_id: int, action: str, start: int, end: int, **fields: Any) -> list[Any]:
    """A bare collection root of checkpoint ``c1`` in ``trace_id``, started and finished."""
    from ckpt_events import CollectionFinished, CollectionStarted

    root = {
        "kind": "controller",
        "instance": "coordination",
        "trace_id": trace_id,
        "span_id": trace_id,
        "start_ns": start,
        "checkpoint_id": "c1",
        "action": action,
    }
    return [CollectionStarted(**root), CollectionFinished(**root, end_ns=end, **fields)]


def test_a_checkpoint_id_reused_by_a_later_run_keeps_each_runs_causes_on_its_own_row() -> None:
    """Two runs appended to one log both checkpoint ``c1``: the first not ready at its deadline,
    the second's lease expired, then a restore of ``c1`` that failed on its own. Each counted
    event is said on its own row only (every row said every run's causes, and the restore was
    "aborted" by the second checkpoint's lease expiry); the detail of a row holds its own."""
    from ckpt_events import LeaseExpired, PrepareNotReady
    from ckpt_events.vocab import Outcome, Phase

    error = {"outcome": Outcome.ERROR, "error_type": "CoordinationError", "error_message": "x"}
    events = [
        *_collection(1, "checkpoint", 0, 100, **error),
        *_collection(2, "checkpoint", 1_000, 1_100, **error),
        *_collection(3, "restore", 2_000, 2_100, **error),
        PrepareNotReady("environment", "environment-0", 50, 1, "c1"),
        LeaseExpired("model", "model-0", 1_050, Phase.PREPARED, "c1"),
        # Past the restore's start, but a checkpoint's phase: the second checkpoint's.
        LeaseExpired("agent", "agent-0", 2_050, Phase.COMMITTED, "c1"),
    ]
    events.sort(key=lambda e: getattr(e, "time_ns", None) or getattr(e, "end_ns", None) or e.start_ns)
    run = overview(events)
    first, second, restore = run.rows
    own = "checkpoint failed on controller (CoordinationError: x)"
    assert (first.outcome, first.causes) == (
        "aborted",
        ["not ready at its deadline: environment/environment-0 blocked by 1 episode", own],
    )
    assert (second.outcome, second.causes) == (
        "aborted",
        [
            "lease expired on model/model-0 in phase prepared",
            own,
            "lease expired on agent/agent-0 in phase committed",
        ],
    )
    assert restore.outcome == "failed"
    assert restore.causes == ["restore failed on controller (CoordinationError: x)"]
    details = run.details(run.rows)
    assert [type(e).__name__ for e in details[id(first)]].count("PrepareNotReady") == 1
    assert [type(e).__name__ for e in details[id(first)]].count("LeaseExpired") == 0
    assert [type(e).__name__ for e in details[id(restore)]].count("LeaseExpired") == 0


def test_a_restore_comes_from_the_last_checkpoint_of_its_id_that_may_have_published() -> None:
    """``c1`` published, then another run's ``c1`` failed, then a restore of ``c1``: the restore
    comes from row 1 (it said row 2, which never published); an open row may have published."""
    from ckpt_events.vocab import Outcome

    error = {"outcome": Outcome.ERROR, "error_type": "CoordinationError", "error_message": "x"}
    published = _collection(1, "checkpoint", 0, 100, published=True)
    aborted = _collection(2, "checkpoint", 200, 300, published=False, **error)
    restore = _collection(3, "restore", 1_000, 1_100, rows=0, restarts=0)  # as the controller says it
    run = overview([*published, *aborted, *restore])
    assert [r.outcome for r in run.rows] == ["published", "failed", "restored"]
    assert run.rows[2].source_row == 1
    run = overview([*published, aborted[0], *restore])  # the second is open at the end
    assert [r.outcome for r in run.rows] == ["published", "open at end of log", "restored"]
    assert run.rows[2].source_row == 2
    assert overview([*aborted, *restore]).rows[1].source_row is None


def test_a_log_that_begins_mid_checkpoint_makes_one_row_of_it() -> None:
    """The newer half of a log rotated mid-checkpoint: the collection's start is gone, so its
    coordinate spans look like roots until the collection ends. One row, not two (a
    "checkpoint" for the coordinate spans beside the collection's, with its own outcome)."""
    from ckpt_events import CollectionFinished, CoordinateFinished, CoordinateStarted
    from ckpt_events.vocab import Operation

    span = {"kind": "controller", "instance": "coordination", "trace_id": 1, "checkpoint_id": "c1"}
    events = [
        CoordinateFinished(
            **span, span_id=2, parent_span_id=1, start_ns=10, end_ns=40, operation=Operation.PREPARE
        ),
        CoordinateStarted(**span, span_id=3, parent_span_id=1, start_ns=50, operation=Operation.COMMIT),
        CoordinateFinished(
            **span, span_id=3, parent_span_id=1, start_ns=50, end_ns=80, operation=Operation.COMMIT
        ),
        CollectionFinished(**span, span_id=1, start_ns=0, end_ns=100, action="checkpoint", published=True),
    ]
    run = overview(events)
    assert [(r.what, r.outcome, r.roots) for r in run.rows] == [("checkpoint", "published", [(1, 1)])]


def test_a_pause_is_unknown_when_a_prepare_that_prepared_lacks_a_participants_prepare() -> None:
    """coordinate.prepare prepared 2 participants; with both prepares in the logs the pause runs
    from the first to the last resume; with the first one's missing (a log rotated or cut mid-
    prepare, its participant's log not given) it is unknown (it said the 70 ms from the second)."""
    from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished
    from ckpt_events.vocab import Operation

    span = {"trace_id": 1, "checkpoint_id": "c1"}
    ctl = {**span, "kind": "controller", "instance": "coordination"}

    def on(kind: str, span_id: int, operation: Operation, start: int, end: int) -> OperationFinished:
        return OperationFinished(
            **span, kind=kind, instance=f"{kind}-0", span_id=span_id, parent_span_id=2,
            start_ns=start, end_ns=end, operation=operation,
        )  # fmt: skip

    first = on("environment", 3, Operation.PREPARE, 10_000_000, 11_000_000)
    rest = [
        on("model", 4, Operation.PREPARE, 20_000_000, 21_000_000),
        CoordinateFinished(
            **ctl,
            span_id=2,
            parent_span_id=1,
            start_ns=5_000_000,
            end_ns=30_000_000,
            operation=Operation.PREPARE,
            participants=2,
            prepared=True,
        ),  # fmt: skip
        on("environment", 5, Operation.RESUME, 80_000_000, 85_000_000),
        on("model", 6, Operation.RESUME, 85_000_000, 90_000_000),
        CollectionFinished(
            **ctl, span_id=1, start_ns=0, end_ns=100_000_000, action="checkpoint", published=True
        ),
    ]
    assert overview([first, *rest]).rows[0].paused_ms == 80.0
    assert overview(rest).rows[0].paused_ms is None


def test_a_critical_path_through_a_clock_no_shift_aligns_is_unknown() -> None:
    """model-0's clock is 100 ms behind in checkpoint c1 and right in c2 (it stepped): in c1 its
    commit, truly the last to end, is stamped before agent-0's, so the walk named agent-0's
    commit as the critical path; c1's path is now unknown (its slowest still said, timed by its
    own clock), c2's is walked as before."""
    from ckpt_events import CollectionFinished, CollectionStarted, CoordinateFinished, OperationFinished
    from ckpt_events.participants.cli.report.clocks import ClockEvidence
    from ckpt_events.vocab import Operation

    def checkpoint(trace: int, at: int, model_at: int) -> list[Any]:
        ctl = {
            "kind": "controller",
            "instance": "coordination",
            "trace_id": trace,
            "checkpoint_id": f"c{trace}",
        }
        answer = {**ctl, "parent_span_id": 2, "parent_remote": True, "operation": Operation.COMMIT}
        return [
            CollectionStarted(**ctl, span_id=1, start_ns=at - 10, action="checkpoint"),
            OperationFinished(**{**answer, "kind": "agent", "instance": "agent-0"}, span_id=3,
                              start_ns=at + 10, end_ns=at + 50),
            OperationFinished(**{**answer, "kind": "model", "instance": "model-0"}, span_id=4,
                              start_ns=model_at + 20, end_ns=model_at + 90),
            CoordinateFinished(**ctl, span_id=2, parent_span_id=1, start_ns=at, end_ns=at + 100,
                               operation=Operation.COMMIT),
            CollectionFinished(**ctl, span_id=1, start_ns=at - 10, end_ns=at + 110, action="checkpoint",
                               published=True),
        ]  # fmt: skip

    events = [*checkpoint(1, 100, 100 - 100), *checkpoint(2, 1_000, 1_000)]
    clocks = ClockEvidence()
    for e in events:
        clocks.add(e)
    assert clocks.unaligned() == [("model", "model-0", None)] and clocks.outside == {1}
    first, second = overview(events, clocks=clocks).rows
    assert first.critical_path.startswith("critical path: unknown (a participant answered outside")
    assert first.critical_path.endswith("; slowest operation: model/model-0 commit 0.0 ms")
    assert second.critical_path.startswith("critical path: coordinate.commit 0.0 ms, model/model-0 commit")


def test_finished_spans_alone_give_the_rows_of_the_whole_log() -> None:
    """A collector's file holds finished spans only: a collection checkpoint and restore read so
    give the rows, critical paths and trends of the JSON lines. Each coordinate span was a root
    of its own until its collection ended (two rows per checkpoint), and took the spans below it
    with it (the collection's path was "collection.checkpoint" alone)."""
    from ckpt_events.participants.cli.report.events import event_time
    from tests.participants.cli.report_events import checkpoint_and_restore

    events: list[Any] = anyio.run(checkpoint_and_restore)
    finished = sorted((e for e in events if not type(e).__name__.endswith("Started")), key=event_time)
    whole, collector = overview(events), overview(finished)

    def said(run: Any) -> list[tuple[Any, ...]]:
        return [(r.what, r.outcome, r.critical_path, r.paused_ms) for r in run.rows]

    assert said(collector) == said(whole)
    assert whole.rows[0].critical_path.startswith("critical path: coordinate.")
    assert collector.trends.table() == whole.trends.table()


async def _two_controllers_at_once(root: Any) -> list[Any]:
    """Two bare coordinators checkpoint one fleet at once: ``ca`` publishes, ``cb`` is refused
    ``checkpoint_conflict`` at its first stage; their coordinate spans interleave in the log."""
    import time

    import pytest

    from ckpt_events import Telemetry
    from ckpt_events.participants.cli.fleet import local_fleet
    from ckpt_events.participants.controller.coordinator import CoordinationError, Coordinator, Member
    from ckpt_events.participants.faults import FaultPlan
    from ckpt_events.testing import capture_events
    from tests.participants.controller.test_coordinator import FOUR, TOKEN

    async with capture_events() as (bus, events):
        async with local_fleet(token=TOKEN, bus=bus, members=FOUR, checkpoint_root=root) as urls:
            members = [Member(name=i, kind=k, instance=i, url=urls[i]) for k, i in FOUR]
            # a waits 1 s between its prepare and its commit (the lease fault; leases last 600 s):
            # b's whole checkpoint, refused, comes in between.
            a = Coordinator(
                members,
                token=TOKEN,
                telemetry=Telemetry(bus, kind="controller", instance="ctl-a"),
                faults=FaultPlan.parse("lease:1"),
            )
            b_telemetry = Telemetry(bus, kind="controller", instance="ctl-b")
            b = Coordinator(members, token=TOKEN, telemetry=b_telemetry)
            async with a, b:
                deadline = time.time() + 10

                async def b_refused() -> None:
                    while (await a.control.status(urls["environment-0"])).phase.value != "prepared":
                        await anyio.sleep(0.01)
                    with pytest.raises(CoordinationError, match="checkpoint_conflict"):
                        await b.checkpoint("cb", str(root / "cb"), deadline_ts=deadline)

                with anyio.fail_after(20):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(b_refused)
                        await a.checkpoint("ca", str(root / "ca"), deadline_ts=deadline)
        await bus.flush()
    return list(events)


def test_two_controllers_at_once_make_one_row_each(tmp_path: Any) -> None:
    """``ca``'s prepare, then ``cb``'s (refused), then ``ca``'s commit and resume: ``ca`` was two
    rows, 'aborted' (its prepare, 'prepared, never committed') and 'published' (its commit), as
    only the row just before was looked at for its id. One row per checkpoint id and controller."""
    run = overview(anyio.run(_two_controllers_at_once, tmp_path))
    assert [(r.checkpoint_id, r.outcome) for r in run.rows] == [("ca", "published"), ("cb", "failed")]
    assert run.rows[1].causes[0] == (
        "environment/environment-0 refused: checkpoint_conflict (409): checkpoint ca is active, not cb "
        "(at prepare and resume)"
    )
    assert run.rows[0].causes == [] and run.rows[0].paused_ms is not None


def test_a_checkpoint_refused_everywhere_paused_nobody(tmp_path: Any) -> None:
    """``cb``'s prepares and resumes were all refused (``ca`` held the fleet): its row read
    "paused 43.9 ms", the stretch between its refused calls, while ``ca``'s pause held them."""
    run = overview(anyio.run(_two_controllers_at_once, tmp_path))
    ca, cb = run.rows
    assert cb.paused_ms == 0.0 and cb.paused_span is None
    assert ca.paused_ms is not None and ca.paused_ms > 0


def test_the_whole_of_a_log_without_rows_is_one_more_read() -> None:
    """Logs of participants alone (no controller, no row): ``whole`` reads the logs once more for
    the breakdown, the operations and the counted events together (was twice: a third read of a
    1,000,000-line log, 13.8 s of a 48 s report), and gives what a read for each gives."""
    from ckpt_events import PrepareNotReady, Refused
    from ckpt_events.participants.cli.report.timeline import breakdown, counts
    from ckpt_events.vocab import Kind
    from tests.participants.cli.report_events import checkpoint_and_restore

    theirs = [e for e in anyio.run(checkpoint_and_restore) if e.kind != Kind.CONTROLLER]
    last = max(getattr(e, "end_ns", 0) for e in theirs)
    counted = [
        Refused(kind=Kind.AGENT, instance="agent-0", time_ns=last + 1, code=ErrorCode.UNAUTHORIZED),
        PrepareNotReady(kind=Kind.MODEL, instance="model-0", time_ns=last + 2, blockers=3),
        Refused(kind=Kind.MODEL, instance="model-0", time_ns=last + 3, code=ErrorCode.UNAUTHORIZED),
    ]
    events = [*theirs, *counted]
    reads = 0

    def again() -> list[Any]:
        nonlocal reads
        reads += 1
        return list(events)

    run = overview(iter(events), again=again)
    assert not run.rows and reads == 0
    whole = run.whole()
    assert reads == 1
    assert whole.counts == counts(events) and whole.counts  # the refusals and the prepare
    assert whole.breakdown == breakdown(events) and whole.breakdown
    assert whole.events and all(e.trace_id == run.last_trace for e in whole.events)  # type: ignore[union-attr]


def _own_checkpoint(
    capture: EventCapture, checkpoint_id: str, *, commit_ok: bool, traceparent: str | None = None
) -> None:
    """A user's own coordinator's checkpoint, ``published`` never set: both participants
    prepare; with ``commit_ok`` both commit, else the coordinate.commit times out with their
    commits never ended (no reply came), and the coordinator goes on. ``traceparent``: the
    incoming header its collection is started with."""
    ctl = capture.telemetry("controller", "coordination")
    parts = [capture.telemetry(kind, f"{kind}-0") for kind in ("environment", "model")]
    with ctl.collection("checkpoint", checkpoint_id=checkpoint_id, traceparent=traceparent) as coll:
        with ctl.coordinate("prepare", checkpoint_id=checkpoint_id, parent=coll) as coord:
            for p in parts:
                with coord.stage(p.kind) as stage:
                    with p.operation("prepare", checkpoint_id=checkpoint_id, traceparent=stage.traceparent()):
                        pass
            coord.set(prepared=True)
        try:
            with ctl.coordinate("commit", checkpoint_id=checkpoint_id, parent=coll) as coord:
                for p in parts:
                    commit = p.operation(
                        "commit", checkpoint_id=checkpoint_id, traceparent=coord.traceparent()
                    )
                    commit.__enter__()
                    if commit_ok:
                        commit.__exit__(None, None, None)
                if not commit_ok:
                    raise TimeoutError("commit timed out")
        except TimeoutError:
            pass


def test_a_collection_that_never_said_it_published_and_never_committed_is_of_unknown_outcome() -> None:
    """A user's own coordinator that never sets ``published``: its c1 ended ok after its
    coordinate.commit failed (TimeoutError), the participants' commits never ended, and read
    "published"; now its outcome is unknown, said first. Its c2, whose coordinate.commit ended
    ok, still published, and a restore of c1 comes from the row that may have published."""
    with EventCapture() as capture:
        _own_checkpoint(capture, "c1", commit_ok=False)
        with capture.telemetry("controller", "coordination").collection("restore", checkpoint_id="c1") as r:
            r.set(rows=0, restarts=0)  # as the controller says it
        _own_checkpoint(capture, "c2", commit_ok=True)
        events = capture.events
    unsaid, restore, committed = overview(events).rows
    assert [r.outcome for r in (unsaid, restore, committed)] == ["outcome unknown", "restored", "published"]
    assert unsaid.causes[0] == PUBLISH_UNSAID, unsaid.causes
    assert any("TimeoutError" in c for c in unsaid.causes), unsaid.causes
    assert restore.source_row == 1


def _own_restore(
    capture: EventCapture,
    checkpoint_id: str,
    *replies: bool | None,
    coordinate: bool = True,
    traceparent: str | None = None,
) -> None:
    """A user's own coordinator's restore of ``checkpoint_id``, its ``rows`` never set: each
    participant's restore ends ok (``True``), in error (``False``) or never (``None``, no reply
    came). With ``coordinate`` they are called under a coordinate.restore, which fails
    (TimeoutError) unless every one ended ok; the coordinator catches that and goes on."""
    ctl = capture.telemetry("controller", "coordination")
    parts = [capture.telemetry(kind, f"{kind}-0") for kind in ("environment", "model")]
    restore_id = f"r-{checkpoint_id}"
    with ctl.collection("restore", checkpoint_id=checkpoint_id, traceparent=traceparent) as coll:
        calls: Any = (
            ctl.coordinate("restore", checkpoint_id=restore_id, parent=coll)
            if coordinate
            else nullcontext(coll)
        )
        try:
            with calls as parent:
                for p, reply in zip(parts, replies, strict=True):
                    restore = p.operation(
                        "restore", checkpoint_id=restore_id, traceparent=parent.traceparent()
                    )
                    restore.__enter__()
                    if reply is not None:
                        error = None if reply else RuntimeError("checksum mismatch")
                        restore.__exit__(None if error is None else RuntimeError, error, None)
                if coordinate and not all(replies):
                    raise TimeoutError("restore timed out")
        except TimeoutError:
            pass


def test_a_collection_that_never_said_what_it_restored_and_never_restored_is_of_unknown_outcome() -> None:
    """A user's own coordinator that never sets ``rows``: its restore of c1 ended ok after its
    coordinate.restore failed (TimeoutError) and the participants' restores never ended, and
    read "restored"; now its outcome is unknown, said first, and so is one whose restore failed
    on a participant and one with nothing restored in its logs. A restore whose
    coordinate.restore, or every participant's restore, ended ok is still restored."""
    with EventCapture() as capture:
        _own_restore(capture, "c1", None, None)
        _own_restore(capture, "c2", True, False)  # one took it, one failed: undone, or not
        with capture.telemetry("controller", "coordination").collection("restore", checkpoint_id="c3"):
            pass
        _own_restore(capture, "c4", True, True)
        _own_restore(capture, "c5", True, True, coordinate=False)
        _own_restore(capture, "c6", True, None, coordinate=False)
        events = capture.events
    rows = overview(events).rows
    assert [r.outcome for r in rows] == [*["outcome unknown"] * 3, "restored", "restored", "outcome unknown"]
    timed_out, mixed, bare, _, _, half = rows
    assert all(r.causes[0] == RESTORE_UNSAID for r in (timed_out, mixed, bare, half)), [
        r.causes for r in rows
    ]
    assert any("TimeoutError" in c for c in timed_out.causes), timed_out.causes
    assert sum("restore on " in c and "no end in the logs" in c for c in timed_out.causes) == 2
    assert any("checksum mismatch" in c for c in mixed.causes), mixed.causes


#: One incoming header a user's script passes to every collection it starts: one trace.
_ONE_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_each_row_of_one_traceparent_has_its_own_commit_and_restore_for_evidence() -> None:
    """Two collections started with one ``traceparent`` share a trace: the first one's
    coordinate.commit (coordinate.restore, participants' restores) that ended ok counted for
    the second, whose own timed out, and both read "published" ("restored"). Now each row's
    evidence is what ran under its own root."""
    with EventCapture() as capture:
        _own_checkpoint(capture, "c1", commit_ok=True, traceparent=_ONE_TRACE)
        _own_checkpoint(capture, "c2", commit_ok=False, traceparent=_ONE_TRACE)
        _own_restore(capture, "c1", True, True, traceparent=_ONE_TRACE)
        _own_restore(capture, "c2", None, None, traceparent=_ONE_TRACE)
        _own_restore(capture, "c1", True, True, coordinate=False, traceparent=_ONE_TRACE)
        _own_restore(capture, "c2", True, None, coordinate=False, traceparent=_ONE_TRACE)
        events = capture.events
    rows = overview(events).rows
    assert len({t for r in rows for t in r.trace_ids}) == 1  # one trace for all six
    assert [r.outcome for r in rows] == [
        "published",
        "outcome unknown",
        "restored",
        "outcome unknown",
        "restored",
        "outcome unknown",
    ]
    assert rows[1].causes[0].startswith(PUBLISH_UNSAID), rows[1].causes
    assert all(rows[i].causes[0].startswith(RESTORE_UNSAID) for i in (3, 5)), [r.causes for r in rows]


def test_a_later_rows_commit_under_one_traceparent_is_not_an_earlier_ones() -> None:
    """The other way round: the first checkpoint's coordinate.commit timed out, the second's
    (same traceparent) ended ok after it; the first read "published" by the second's commit."""
    with EventCapture() as capture:
        _own_checkpoint(capture, "c1", commit_ok=False, traceparent=_ONE_TRACE)
        _own_checkpoint(capture, "c2", commit_ok=True, traceparent=_ONE_TRACE)
        events = capture.events
    assert [r.outcome for r in overview(events).rows] == ["outcome unknown", "published"]
