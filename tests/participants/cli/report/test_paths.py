"""The critical path walked as Jaeger's UI walks it (the last-ending child, then the child that
ended last before the current point, repeatedly; children cut to their parent), and the slowest
operation named as the longest one, on the path or not."""

from __future__ import annotations

from typing import Any

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.report.model import trace_spans
from ckpt_events.participants.cli.report.paths import (
    critical_path,
    dominated,
    on_critical_path,
    path_line,
    unknown_on_path,
)
from ckpt_events.vocab import CollectionAction, Kind, Operation, Step

MS = 1_000_000
T = 7


def _coordinate(span: int, operation: Operation, start: float, end: float, parent: int = 1) -> Any:
    return CoordinateFinished(
        Kind.CONTROLLER, "c", T, span, int(start * MS), int(end * MS), operation, "k", parent
    )


def _operation(span: int, parent: int, kind: Kind, operation: Operation, start: float, end: float) -> Any:
    return OperationFinished(
        kind, f"{kind.value}-0", T, span, int(start * MS), int(end * MS), operation, "k", parent
    )


def _walk(spans: list[Any]) -> list[tuple[int, float, float]]:
    """(span id, start ms, end ms) of each section, latest first."""
    return [(s.span.span_id, s.start_ns / MS, s.end_ns / MS) for s in critical_path(spans)]


def _tiles(spans: list[Any], root: Any) -> None:
    sections = critical_path(spans)
    assert sections[0].end_ns == root.end_ns and sections[-1].start_ns == root.start_ns
    for later, earlier in zip(sections, sections[1:], strict=False):
        assert earlier.end_ns == later.start_ns


def test_overlapping_parallel_children_only_the_last_ending_is_on_the_path() -> None:
    """A 10-90 and B 20-95 under P 0-100: B ends last; A overlapped B's start, so it did not hold
    P up and P's own time runs back from B's start to its own."""
    p = _coordinate(1, Operation.PREPARE, 0, 100, parent=0)
    a = _operation(2, 1, Kind.MODEL, Operation.PREPARE, 10, 90)
    b = _operation(3, 1, Kind.AGENT, Operation.PREPARE, 20, 95)
    assert _walk([p, a, b]) == [(1, 95, 100), (3, 20, 95), (1, 0, 20)]
    assert on_critical_path([p, a, b]) == {1, 3}
    _tiles([p, a, b], p)


def test_staggered_parallel_children_chain_only_through_those_that_ended_before() -> None:
    """A 10-30, B 25-60, C 55-80 (each call sent a little after the last): C ends last; before C
    started only A had ended (B was still running), so the path is C then A, never B."""
    p = _coordinate(1, Operation.COMMIT, 0, 100, parent=0)
    a = _operation(2, 1, Kind.MODEL, Operation.COMMIT, 10, 30)
    b = _operation(3, 1, Kind.AGENT, Operation.COMMIT, 25, 60)
    c = _operation(4, 1, Kind.ENVIRONMENT, Operation.COMMIT, 55, 80)
    assert _walk([p, a, b, c]) == [(1, 80, 100), (4, 55, 80), (1, 30, 55), (2, 10, 30), (1, 0, 10)]
    _tiles([p, a, b, c], p)


def test_children_that_end_after_their_parent_are_cut_to_it_and_late_ones_dropped() -> None:
    """X 50-130 under P 0-100 counts as 50-100 (it is P's last-ending child); Z starting at 110,
    after P ended, is not on the path; Y 10-40 ended before X started (jaeger-ui #1532's cases)."""
    p = _coordinate(1, Operation.RESUME, 0, 100, parent=0)
    x = _operation(2, 1, Kind.MODEL, Operation.RESUME, 50, 130)
    y = _operation(3, 1, Kind.AGENT, Operation.RESUME, 10, 40)
    z = _operation(4, 1, Kind.ENVIRONMENT, Operation.RESUME, 110, 120)
    assert _walk([p, x, y, z]) == [(2, 50, 100), (1, 40, 50), (3, 10, 40), (1, 0, 10)]
    _tiles([p, x, y, z], p)
    # A grandchild is cut to its (already cut) parent too.
    g = StepFinished(Kind.MODEL, "model-0", T, 5, 90 * MS, 125 * MS, Step.WRITE, "k", 2)
    assert _walk([p, x, y, z, g])[:2] == [(5, 90, 100), (2, 50, 90)]
    assert critical_path([]) == [] and path_line([], T) == ""


def test_a_long_stage_before_a_short_last_one_is_named() -> None:
    """Prepare 0-100 (the model's prepare 10-90, its generation cut 20-80), commit 100-130,
    resume 130-135 ends last: the path walks back through every stage; prepare is its longest
    stage and the model's prepare its longest operation, also the trace's slowest."""
    spans = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 135 * MS, CollectionAction.CHECKPOINT, "k"),
        _coordinate(2, Operation.PREPARE, 0, 100),
        _operation(10, 2, Kind.MODEL, Operation.PREPARE, 10, 90),
        StepFinished(Kind.MODEL, "model-0", T, 11, 20 * MS, 80 * MS, Step.GENERATION_CUT, "k", 10),
        _operation(12, 2, Kind.AGENT, Operation.PREPARE, 92, 99),
        _coordinate(3, Operation.COMMIT, 100, 130),
        _operation(13, 3, Kind.ENVIRONMENT, Operation.COMMIT, 101, 129),
        _coordinate(4, Operation.RENEW, 95, 120),
        _coordinate(5, Operation.RESUME, 130, 135),
        _operation(14, 5, Kind.AGENT, Operation.RESUME, 131, 134),
    ]
    assert path_line(spans, T) == (
        "critical path: coordinate.prepare 100.0 ms, model/model-0 prepare 80.0 ms "
        "(generation_cut 60.0 ms), the slowest operation"
    )
    # Without the long prepare, the commit is the longest stage and its environment operation.
    assert path_line([spans[0], *spans[5:]], T) == (
        "critical path: coordinate.commit 30.0 ms, environment/environment-0 commit 28.0 ms, "
        "the slowest operation"
    )


def test_slowest_names_the_longest_operation_even_off_the_path() -> None:
    """The measured contradiction: a restore whose agent call (4.9 ms) ended last, and whose
    model call (5.6 ms, read 5.4 ms) overlapped it: the path names the agent, "slowest" the
    model, and names the model's read as the longest: 27% of the restore, so it did not
    dominate it (it was said to)."""
    spans = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 20 * MS, CollectionAction.RESTORE, "k"),
        _coordinate(2, Operation.RESTORE, 0, 15),
        _operation(10, 2, Kind.MODEL, Operation.RESTORE, 3.5, 9.1),
        StepFinished(Kind.MODEL, "model-0", T, 11, int(3.6 * MS), int(9.0 * MS), Step.READ, "k", 10),
        _operation(12, 2, Kind.AGENT, Operation.RESTORE, 9.0, 13.9),
        StepFinished(Kind.AGENT, "agent-0", T, 13, int(9.1 * MS), int(12.7 * MS), Step.READ, "k", 12),
        _coordinate(3, Operation.RESUME, 15, 20),
    ]
    said = path_line(spans, T)
    assert said == (
        "critical path: coordinate.restore 15.0 ms, agent/agent-0 restore 4.9 ms (read 3.6 ms); "
        "slowest operation: model/model-0 restore 5.6 ms (read 5.4 ms)"
    )
    assert dominated(spans) == "longest read: on model/model-0 5.4 ms, 27% of the restore"
    # The same read over most of a shorter restore dominated it.
    short = [
        *spans[2:4],
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 9 * MS, CollectionAction.RESTORE, "k"),
    ]
    assert dominated(short) == "read on model/model-0 5.4 ms dominated"


def test_two_participants_reads_over_half_a_restore_are_both_named() -> None:
    """model-0 (415.6 ms) and model-1 (410.2 ms) read in parallel through a 446 ms restore: both
    dominated it, so both are named (model-0's alone was said to, though a faster model-0 would
    have saved nothing); model-0's workers' reads inside its own are not another's, nor is a
    short read elsewhere."""

    def read(span: int, instance: str, start: float, end: float, worker: int | None = None) -> Any:
        return StepFinished(
            Kind.MODEL, instance, T, span, int(start * MS), int(end * MS), Step.READ, "k", 2, worker=worker
        )

    root = CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 446 * MS, CollectionAction.RESTORE, "k")
    spans = [
        root,
        read(10, "model-0", 10, 425.6),
        read(11, "model-0", 12, 420, worker=0),
        read(12, "model-1", 11, 421.2),
        StepFinished(Kind.AGENT, "agent-0", T, 13, 10 * MS, 30 * MS, Step.READ, "k", 2),
    ]
    both = "read on model/model-0 415.6 ms dominated; so did read on model/model-1 410.2 ms"
    assert dominated(spans) == both
    # One participant's read alone (its worker's inside it) is said as before.
    assert dominated(spans[:3]) == "read on model/model-0 415.6 ms dominated"


def test_a_users_own_restore_step_is_what_dominated_the_restore() -> None:
    """A judge's restore spent 15.0 of its 18 ms in its own step ``download``: the line named its
    1.0 ms ``install`` instead ("longest install: ..., 6% of the restore"), the one step of the
    original system's names in it. Any step of a restore operation is weighed; a user's step of
    another operation (``notify`` under resume, longer still) is not."""
    spans = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 18 * MS, CollectionAction.RESTORE, "k"),
        OperationFinished("judge", "judge-0", T, 10, 1 * MS, 17 * MS, Operation.RESTORE, "k", 1),
        StepFinished("judge", "judge-0", T, 11, 1 * MS, 16 * MS, "download", "k", 10, bytes=3_000_000),
        StepFinished("judge", "judge-0", T, 12, 16 * MS, 17 * MS, Step.INSTALL, "k", 10),
        OperationFinished("judge", "judge-1", T, 20, 0, 18 * MS, Operation.RESUME, "k", 1),
        StepFinished("judge", "judge-1", T, 21, 0, 17 * MS, "notify", "k", 20),
    ]
    assert dominated(spans) == "download on judge/judge-0 15.0 ms dominated, 3.0 MB at 200 MB/s"


def test_a_child_of_unknown_duration_makes_the_path_unknown_from_its_parent() -> None:
    """The agent's clock went back during its prepare (end stamped before start): it may have
    ended as late as P did, so the path is unknown from P down and the model, which ended last
    by the stamps, is never named."""
    p = _coordinate(1, Operation.PREPARE, 0, 100, parent=0)
    a = _operation(2, 1, Kind.MODEL, Operation.PREPARE, 10, 90)
    b = _operation(3, 1, Kind.AGENT, Operation.PREPARE, 20, 5)
    assert critical_path([p, a, b]) == [] and unknown_on_path([p, a, b]) is b
    assert on_critical_path([p, a, b]) == {1}
    assert path_line([p, a, b], T) == (
        "critical path: unknown (the clock of agent/agent-0 went back during its prepare); "
        "slowest operation: unknown too"
    )
    # Drawn from the report's spans (an instant, ``known`` false) the walk stops there too.
    spans = trace_spans([p, a, b], T)
    unknown = unknown_on_path(spans)
    assert unknown is not None and unknown.span_id == 3 and not unknown.known


def test_a_span_of_unknown_duration_off_the_path_leaves_it_named() -> None:
    """A renew under a stage that ended before the path reached it: the path is walked and named
    as without it; the slowest operation is unknown (the renew could have been the longest)."""
    spans = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 135 * MS, CollectionAction.CHECKPOINT, "k"),
        _coordinate(2, Operation.PREPARE, 0, 100),
        _operation(10, 2, Kind.MODEL, Operation.PREPARE, 10, 90),
        _coordinate(3, Operation.COMMIT, 100, 130),
        _operation(13, 3, Kind.ENVIRONMENT, Operation.COMMIT, 101, 129),
        _coordinate(4, Operation.RENEW, 95, 120),
        _operation(15, 4, Kind.AGENT, Operation.RENEW, 96, 90),
        _coordinate(5, Operation.RESUME, 130, 135),
    ]
    assert unknown_on_path(spans) is None
    assert {section.span.span_id for section in critical_path(spans)} == {5, 3, 13, 2, 10}
    _tiles(spans, spans[0])
    assert path_line(spans, T) == (
        "critical path: coordinate.prepare 100.0 ms, model/model-0 prepare 80.0 ms; "
        "slowest operation: unknown (the clock of agent/agent-0 went back during its renew)"
    )
