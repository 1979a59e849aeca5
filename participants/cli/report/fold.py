"""The report's one streamed pass over the logs (``fold_events``): what each trace, root span and
counted event leaves behind for the run overview (``overview.py``), never the events themselves.

Each trace keeps its prepares, resumes and causes (``Trace``); each root span, as it ends, its
critical path and, for a restore, what dominated it; each counted event that names a
checkpoint is kept as a cause (at most ``causes.KEPT_CAUSES`` per checkpoint), one that names
none counted run-wide (``Unscoped``). Traces with no root yet are kept up to ``UNROOTED``.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    SpanEvent,
    StageFinished,
    StageStarted,
    Stalled,
    StepFinished,
    StepStarted,
)
from ckpt_events.participants.cli.report.causes import (
    CAUSE_EVENTS,
    CheckpointCauses,
    OwnOperations,
    TraceCauses,
    is_refusal,
)
from ckpt_events.participants.cli.report.events import (
    FinishedSpan,
    PointEvent,
    StartedSpan,
    UnreadEnd,
    duration_ns,
    event_start,
    event_time,
    what_of,
    who_wrote,
)
from ckpt_events.participants.cli.report.paths import (
    dominant_step_ms,
    is_restore_step,
    reads_ms,
    restore_operations,
)
from ckpt_events.participants.cli.report.paths import dominated as dominated_by
from ckpt_events.participants.cli.report.paths import path_line as path_of
from ckpt_events.participants.cli.report.roots import RootEnd, RootStart, end_of, same_row, start_of
from ckpt_events.participants.cli.report.shared import owner_by_parents
from ckpt_events.participants.cli.report.trends import Trends
from ckpt_events.participants.cli.words import counted
from ckpt_events.vocab import CollectionAction, CountedEvent, Kind, Operation, Outcome

__all__ = ["ROOT_TYPES", "UNROOTED", "Evidence", "Fold", "Trace", "Unscoped", "fold_events", "unscoped_of"]


@dataclass(slots=True)
class Trace:
    """What one trace leaves after it streamed past: never its events."""

    #: Each participant prepare's start, by span id, but a refused one's (a refusal paused
    #: nothing: a second controller's checkpoint refused ``checkpoint_conflict`` read "paused
    #: 43.9 ms", the time the other one held the fleet).
    prepare_starts: dict[int, int] = field(default_factory=dict)
    #: Prepares refused (``ProtocolRefusal``): with none else, the trace paused nothing.
    refused_prepares: int = 0
    last_resume_ns: int | None = None
    #: A resume of unknown duration (its clock went back during it): its end is unknown.
    resume_unknown: bool = False
    #: The participants a coordinate.prepare that prepared called: with fewer prepares in the
    #: logs (a log rotated or cut mid-prepare, a participant's log not given) the first is unknown.
    members: int | None = None
    #: A ``coordinate.commit`` or a collection's ``publish`` ended ok in it: what says a
    #: collection's checkpoint that ended without saying ``published`` did its work.
    committed: bool = False
    #: A ``coordinate.restore`` ended ok in it (the coordinator's word), and a participant's
    #: ``restore`` did; a restore of either ended in error: with ``committed``, what says a
    #: collection's restore that ended without saying ``rows`` did its work (``judge``).
    restore_ok: bool = False
    installed: bool = False
    restore_failed: bool = False
    #: Its prepares, errors and stops, for its row's causes.
    causes: TraceCauses = field(default_factory=TraceCauses)

    @property
    def first_prepare_ns(self) -> int | None:
        """The first participant prepare's start (a refused one's left out), if any."""
        return min(self.prepare_starts.values(), default=None)


class Evidence(NamedTuple):
    """What ran under one root span by its end: its commits and restores (as ``Trace``'s
    flags) and its spans still open then."""

    committed: bool
    restore_ok: bool
    installed: bool
    restore_failed: bool
    left: tuple[StartedSpan, ...]


#: Evidence with nothing left open, one of each (a root's is one of these: a few bytes each).
_EVIDENCE: dict[tuple[bool, bool, bool, bool], Evidence] = {}


#: The spans that can be a row (``events.RootSpan``).
ROOT_TYPES = (CollectionStarted, CollectionFinished, CoordinateStarted, CoordinateFinished)
#: Traces with no root seen yet whose spans are kept (a collector's file holds no started
#: events: a root is known when it ends, after its spans); past this many the longest idle is
#: let go. Participants' logs without the controller's make one such trace per checkpoint, and
#: every span was kept (1.2M lines: 531 MB).
UNROOTED: Final = 4096
#: Spans whose skipped end (another version's event) was read before their start that are kept
#: waiting for it, the latest ones: a file of such ends alone is memory bounded. The others are
#: counted (``Fold.ended_let_go``): such a span whose start comes later is shown open.
ENDED_WAITING: Final = 65_536


class Unscoped(NamedTuple):
    """Counted events that name no checkpoint, as the overview counts them run-wide: the event,
    its detail (a refusal's code, a lease's phase, a cut's disposition, a stalled operation;
    ``""`` for a prepare not ready) and the participant."""

    event: CountedEvent
    detail: str
    who: str


def unscoped_of(e: PointEvent) -> Unscoped:
    match e:
        case Refused(code=code):
            return Unscoped(CountedEvent.REFUSED, str(code), who_wrote(e))
        case LeaseExpired(phase=phase):
            return Unscoped(CountedEvent.LEASE_EXPIRED, str(phase), who_wrote(e))
        case GenerationCut(disposition=disposition):
            return Unscoped(CountedEvent.GENERATION_CUT, str(disposition), who_wrote(e))
        case Stalled(operation=operation):
            return Unscoped(CountedEvent.STALLED, str(operation), who_wrote(e))
        case PrepareNotReady():
            return Unscoped(CountedEvent.PREPARE_NOT_READY, "", who_wrote(e))


@dataclass
class Fold:
    """What the streamed pass over the logs keeps (``fold_events``): never the events themselves."""

    traces: dict[int, Trace]
    #: Spans started and never finished, by (trace id, span id).
    started: dict[tuple[int, int], StartedSpan]
    #: Root spans by (trace id, span id): each row's fields as it started (in the order read:
    #: its place among rows that started at once), and its end. A root that ended as it started
    #: is one record in both.
    root_started: dict[tuple[int, int], RootStart]
    root_finished: dict[tuple[int, int], RootEnd]
    #: Per root: its critical path in words, and for a restore what dominated it and its
    #: longest read or install step (ms).
    critical: dict[tuple[int, int], str]
    dominated: dict[tuple[int, int], str]
    dominant_ms: dict[tuple[int, int], float | None]
    #: Per restore root: each participant's longest read, in ms (``paths.reads_ms``; empty when
    #: a read or install had not finished).
    reads_ms: dict[tuple[int, int], dict[str, float]]
    #: The counted events that name a checkpoint (at most ``causes.KEPT_CAUSES`` each).
    causes: CheckpointCauses
    unscoped: Counter[Unscoped]
    trends: Trends
    last_trace: int | None
    first_ns: int | None
    last_ns: int
    controller_first: int | None
    controller_last: int
    count: int
    let_go: int
    #: Spans that ended with an event this version could not read (another version's type or
    #: value: ``LogProblems.ended``), by (trace id, span id): each its start and why its outcome
    #: is unknown. Never in ``started``: they ended.
    ended_unknown: dict[tuple[int, int], tuple[StartedSpan, UnreadEnd]] = field(default_factory=dict)
    #: Such spans whose end was read before their start and let go past ``ENDED_WAITING``
    #: waiting for it: one whose start came after is in ``started``, shown open.
    ended_let_go: int = 0
    #: Per collection root that ended without saying what it did (``published``, ``rows``
    #: unset), the evidence under it by its end (``Evidence``): a row's own where its trace is
    #: shared with other rows' roots, whose commits and restores are theirs.
    own_evidence: dict[tuple[int, int], Evidence] = field(default_factory=dict)


# One step over 60 lines, kept flat for speed: the span half as a helper called per event cost
# 2-3% (0.14 of 5.6 us/event over bench_report's 64,000 lines).
def fold_events(
    events: Iterable[CheckpointEvent], ended: dict[tuple[int, int], UnreadEnd] | None = None
) -> Fold:
    """Fold ``events`` in one streamed pass: each trace's summary, each root's critical path as
    it ends, the counted events that name a cause (at most ``causes.KEPT_CAUSES`` per checkpoint).

    ``ended`` (``LogProblems.ended``, filled as ``events`` are read): spans whose end was an
    event this version could not read; drained as the pass goes, each is ended, never open."""
    ended = {} if ended is None else ended
    #: Spans ended so, whose start was not read yet (another file's, later in the merge), oldest
    #: first. An OrderedDict lets its oldest go in O(1): a dict's ``del d[next(iter(d))]`` walks
    #: past every entry deleted before it (1,000,000 lines, 980,000 such ends: 116 s).
    ended_later: OrderedDict[tuple[int, int], UnreadEnd] = OrderedDict()
    ended_unknown: dict[tuple[int, int], tuple[StartedSpan, UnreadEnd]] = {}
    traces: dict[int, Trace] = {}
    #: Spans started and not yet finished, by (trace id, span id).
    started: dict[tuple[int, int], StartedSpan] = {}
    #: Finished spans of each trace since its last root ended: the critical path's input.
    pending: dict[int, list[FinishedSpan]] = {}
    root_started: dict[tuple[int, int], RootStart] = {}
    root_finished: dict[tuple[int, int], RootEnd] = {}
    own_evidence: dict[tuple[int, int], Evidence] = {}
    critical: dict[tuple[int, int], str] = {}
    dominated: dict[tuple[int, int], str] = {}
    dominant_ms: dict[tuple[int, int], float | None] = {}
    reads: dict[tuple[int, int], dict[str, float]] = {}
    causes = CheckpointCauses()
    #: The trace each participant's counted event belongs to, by its own clock.
    own = OwnOperations()
    #: The start of the latest root span read naming each checkpoint id (a flood's row).
    root_since: dict[str, int] = {}
    unscoped: Counter[Unscoped] = Counter()
    #: Traces with a root, and those with none yet, longest idle first (``UNROOTED``); the
    #: longest idle let go in O(1), as ``ended_later``'s oldest (1,000,000 traces past 4,096:
    #: 1.6 s with a dict, 0.2 with an OrderedDict, measured here).
    rooted: set[int] = set()
    unrooted: OrderedDict[int, None] = OrderedDict()
    last_trace: int | None = None
    trends = Trends()
    first_ns: int | None = None
    last_ns = 0
    # The controller's own first and last stamps: the logs' time when a participant's clock
    # fits no one shift (its stamps would stretch it).
    controller_first: int | None = None
    controller_last = 0
    count = 0
    let_go = 0  # unrooted traces let go past UNROOTED (said in the overview, never silent)
    let_go_ended = 0  # ends let go past ENDED_WAITING waiting for their start (said too)
    #: Per trace, the last root that ended whose parent in its process may still come.
    provisional: dict[int, CollectionFinished | CoordinateFinished] = {}
    for e in events:
        if ended:  # a skipped end was read: its span ended (checked before anything it decides)
            let_go_ended += _drain(ended, started, ended_later, ended_unknown)
        count += 1
        t, begin = event_time(e), event_start(e)
        last_ns = max(last_ns, t)
        first_ns = begin if first_ns is None else min(first_ns, begin)
        if e.kind == Kind.CONTROLLER:
            controller_last = max(controller_last, t)
            controller_first = begin if controller_first is None else min(controller_first, begin)
        if not isinstance(e, SpanEvent):  # a counted event: no trace, it names a checkpoint
            if e.checkpoint_id:
                if isinstance(e, CAUSE_EVENTS):
                    causes.add(e.checkpoint_id, e, root_since.get(e.checkpoint_id), own.trace_of(e))
            else:  # a cause of no row: counted run-wide, never kept (2M of them took 382 MiB)
                unscoped[unscoped_of(e)] += 1
            continue
        trace_id = e.trace_id
        key = (trace_id, e.span_id)
        trace = traces.get(trace_id)
        if trace is None:
            trace = traces[trace_id] = Trace()
        buffer = pending.setdefault(trace_id, [])
        if trace_id not in rooted:
            unrooted.pop(trace_id, None)
            unrooted[trace_id] = None
            if len(unrooted) > UNROOTED:
                idle, _ = unrooted.popitem(last=False)
                del traces[idle], pending[idle]
                let_go += 1
        candidate = isinstance(e, ROOT_TYPES)
        # A span named its own parent (a broken writer) has a parent unread: its end is a root
        # for now whose spans are kept (``provisional``), never a flush of its trace's spans.
        parent_seen = (
            (trace_id, e.parent_span_id) in started or any(f.span_id == e.parent_span_id for f in buffer)
            if candidate and e.parent_span_id is not None and e.parent_span_id != e.span_id
            else False
        )
        # A started span is an instant (t == begin): a span that ended later skips the five
        # class tests below (each that fails costs ~0.1 us: the overview was 4% slower).
        if t == begin:
            match e:
                case (
                    OperationStarted()
                    | StepStarted()
                    | CoordinateStarted()
                    | StageStarted()
                    | CollectionStarted()
                ):
                    started[key] = e
                    if ended_later and key in ended_later:
                        ended_unknown[key] = (started.pop(key), ended_later.pop(key))
                    if isinstance(e, OperationStarted):
                        own.started(e)
                    if isinstance(e, OperationStarted) and e.operation == Operation.PREPARE:
                        # One string per participant, not one per trace: kept in every trace's
                        # prepares (4 participants: 260 of about 4,250 bytes a checkpoint at the peak).
                        writer = sys.intern(who_wrote(e))
                        trace.causes.prepares.setdefault(writer, e.start_ns)
                        trace.prepare_starts[e.span_id] = e.start_ns
                    if candidate and isinstance(e, ROOT_TYPES) and not parent_seen:
                        root_started[key] = start_of(e)
                        if e.checkpoint_id:
                            root_since[e.checkpoint_id] = max(e.start_ns, root_since.get(e.checkpoint_id, 0))
                        rooted.add(trace_id)
                        unrooted.pop(trace_id, None)
                    continue
        match e:
            case (
                OperationFinished()
                | StepFinished()
                | CoordinateFinished()
                | StageFinished()
                | CollectionFinished()
            ):
                pass  # a span ended: folded below
            case _:  # never: every started span went on above
                continue
        started.pop(key, None)
        last_trace = trace_id
        match e:
            case OperationFinished(operation=Operation.PREPARE):
                # Also from the finished span: an OTLP file holds no started events.
                writer = sys.intern(who_wrote(e))  # kept per trace: one string per participant
                prepares = trace.causes.prepares
                prepares[writer] = min(e.start_ns, prepares.get(writer, e.start_ns))
                trace.causes.prepare_finished(e)
                if is_refusal(e):
                    trace.prepare_starts.pop(e.span_id, None)
                    trace.refused_prepares += 1
                else:
                    trace.prepare_starts.setdefault(e.span_id, e.start_ns)
            case OperationFinished(operation=Operation.RESUME) if not is_refusal(e):  # resumed nothing
                # Its end by its own clock: its start plus its duration.
                length = duration_ns(e)
                trace.resume_unknown |= length is None
                end = e.start_ns + (length or 0)
                if trace.last_resume_ns is None or end > trace.last_resume_ns:
                    trace.last_resume_ns = end
            case CoordinateFinished(operation=Operation.PREPARE, prepared=True, participants=int(members)):
                trace.members = max(members, trace.members or 0)
            case (
                CoordinateFinished(operation=Operation.COMMIT | Operation.RESTORE)
                | CollectionFinished(action=CollectionAction.PUBLISH)
                | OperationFinished(operation=Operation.RESTORE)
            ):
                _evidence(trace, e)
        # Ended in error, or a coordinate.prepare not prepared: only a failed span pays the call.
        if e.outcome == Outcome.ERROR or (isinstance(e, CoordinateFinished) and e.prepared is False):
            trace.causes.span_failed(e, t)
        buffer.append(e)
        if candidate and isinstance(e, ROOT_TYPES) and (key in root_started or not parent_seen):
            # A root ended: its trace's spans so far are its tree; fold and let them go.
            start = root_started.get(key)
            kept = end_of(e, start)
            if start is not None and same_row(start, kept):
                # Its end says what its start did: kept once, in its start's place, and its
                # ids are its start's (the end's own copies let go: 80 bytes a root).
                root_started[key] = kept
                key = (kept.trace_id, kept.span_id)
            root_finished[key] = kept
            unsaid = (kept.action == CollectionAction.CHECKPOINT and kept.published is None) or (
                kept.action == CollectionAction.RESTORE and kept.rows is None
            )
            # Its trace's spans still open: read once, for its evidence and a restore's steps.
            opened = (
                [s for (tid, _), s in started.items() if tid == trace_id]
                if unsaid or kept.what == "restore"
                else []
            )
            if unsaid:
                # Ended without saying what it did: what ran under it is its evidence, its
                # own in a trace shared with other rows (one traceparent given to each).
                own_evidence[key] = _own_evidence(buffer, opened, key, e.end_ns)
            rooted.add(trace_id)
            unrooted.pop(trace_id, None)
            critical[key] = _unknown_path(ended_unknown, trace_id, e.end_ns) or path_of(
                buffer,
                trace_id,
                (s for (tid, _), s in started.items() if tid == trace_id and s.start_ns <= e.end_ns),
            )
            if kept.what == "restore":
                # A restore's step still open when the restore ended (its process killed, or
                # slower than the controller waited) may be the longest: then none is named.
                unknown = [(s, end) for (tid, _), (s, end) in ended_unknown.items() if tid == trace_id]
                restores = restore_operations([*buffer, *opened, *(s for s, _ in unknown)])
                unfinished = [
                    s for s in opened if isinstance(s, StepStarted) and is_restore_step(s, restores)
                ]
                unread = [
                    (s, end)
                    for s, end in unknown
                    if isinstance(s, StepStarted) and is_restore_step(s, restores)
                ]
                if unread and not unfinished:
                    # Its end skipped (another version's): not among the steps weighed, so the
                    # longest is unknown; was "had not finished", or the next longest named.
                    first, skipped = min(unread, key=lambda u: u[0].start_ns)
                    dominated[key] = (
                        f"longest read or install unknown: {first.step} on {who_wrote(first)}: {skipped.why}"
                    )
                    dominant_ms[key] = None
                    reads[key] = {}
                elif unfinished:
                    first = min(unfinished, key=lambda s: s.start_ns)
                    dominated[key] = (
                        f"longest read or install unknown: {first.step} on {who_wrote(first)} "
                        "had not finished when the restore ended"
                    )
                    dominant_ms[key] = None
                    reads[key] = {}
                else:
                    dominated[key] = dominated_by(buffer)
                    dominant_ms[key] = dominant_step_ms(buffer)
                    reads[key] = reads_ms(buffer)
            if e.parent_span_id is not None and not e.parent_remote and not parent_seen:
                # Its parent in its own process was not read (a collector's file holds no
                # started events, a rotated log lost it): a root for now, whose spans are kept
                # for that parent, which would have had only what ends after this.
                provisional[trace_id] = e
                continue
            provisional.pop(trace_id, None)
            trends.add_trace(buffer, e)
            del pending[trace_id]
    if ended:  # skipped ends read after the last event
        let_go_ended += _drain(ended, started, ended_later, ended_unknown)
    for trace_id, root in provisional.items():  # their parent never came: roots after all
        trends.add_trace(pending[trace_id], root)
    return Fold(
        traces,
        started,
        root_started,
        root_finished,
        critical,
        dominated,
        dominant_ms,
        reads,
        causes,
        unscoped,
        trends,
        last_trace,
        first_ns,
        last_ns,
        controller_first,
        controller_last,
        count,
        let_go,
        ended_unknown,
        let_go_ended,
        own_evidence,
    )


def _drain(
    ended: dict[tuple[int, int], UnreadEnd],
    started: dict[tuple[int, int], StartedSpan],
    ended_later: OrderedDict[tuple[int, int], UnreadEnd],
    ended_unknown: dict[tuple[int, int], tuple[StartedSpan, UnreadEnd]],
) -> int:
    """Move the spans of ``ended`` (read, not yet folded) out of ``started`` into
    ``ended_unknown``; those not started yet wait in ``ended_later`` for their start, the latest
    ``ENDED_WAITING``. Returns how many waiting were let go."""
    let_go = 0
    for key, why in ended.items():
        span = started.pop(key, None)
        if span is not None:
            ended_unknown[key] = (span, why)
        else:
            ended_later[key] = why
            if len(ended_later) > ENDED_WAITING:
                ended_later.popitem(last=False)
                let_go += 1
    ended.clear()
    return let_go


def _unknown_path(
    ended_unknown: dict[tuple[int, int], tuple[StartedSpan, UnreadEnd]], trace_id: int, end_ns: int
) -> str:
    """The critical path in words when a span of the trace, started by ``end_ns``, ended with an
    event this version could not read (not among the spans the path is drawn from, its outcome
    unknown: any of them could be on the path), else ``""``. Operations are named first, oldest first."""
    left = sorted(
        (
            (s, end)
            for (tid, _), (s, end) in ended_unknown.items()
            if tid == trace_id and s.start_ns <= end_ns
        ),
        key=lambda u: (not isinstance(u[0], OperationStarted), u[0].start_ns),
    )
    if not left:
        return ""
    first, end = left[0]
    others = f" (and {counted(len(left) - 1, 'more span')} ended so)" if len(left) > 1 else ""
    return (
        f"critical path: unknown ({what_of(first)} on {who_wrote(first)}: {end.why}{others}); "
        "slowest operation: unknown too"
    )


def _evidence(trace: Trace, e: CoordinateFinished | CollectionFinished | OperationFinished) -> None:
    """Note in ``trace`` what ``e`` (a commit, publish or restore that ended) says of its root:
    a ``coordinate.commit`` or ``publish`` ended ok, a ``coordinate.restore`` or participant's
    ``restore`` ended ok or in error."""
    match e:
        case (
            CoordinateFinished(operation=Operation.COMMIT, outcome=Outcome.OK)
            | CollectionFinished(action=CollectionAction.PUBLISH, outcome=Outcome.OK)
        ):
            trace.committed = True
        case CoordinateFinished(operation=Operation.RESTORE, outcome=outcome):
            trace.restore_ok |= outcome == Outcome.OK
            trace.restore_failed |= outcome == Outcome.ERROR
        case OperationFinished(operation=Operation.RESTORE, outcome=outcome):
            trace.installed |= outcome == Outcome.OK
            trace.restore_failed |= outcome == Outcome.ERROR


def _own_evidence(
    buffer: list[FinishedSpan], opened: list[StartedSpan], root: tuple[int, int], end_ns: int
) -> Evidence:
    """The evidence under ``root`` (trace id, span id) as it ended at ``end_ns``: its trace's
    spans finished since its last root (``buffer``) and still open (``opened``) that descend
    from it by parent ids (``shared.owner_by_parents``)."""
    span_id = root[1]
    parents = {s.span_id: s.parent_span_id for s in [*buffer, *opened]}
    owners: dict[int, bool | None] = {}
    roots = {span_id: True}
    evidence = Trace()  # its flags only
    for f in buffer:
        if (
            isinstance(f, CoordinateFinished | CollectionFinished | OperationFinished)
            and f.span_id != span_id
            and owner_by_parents(f.span_id, parents, roots, owners)
        ):
            _evidence(evidence, f)
    left = tuple(
        s for s in opened if s.start_ns <= end_ns and owner_by_parents(s.span_id, parents, roots, owners)
    )
    flags = (evidence.committed, evidence.restore_ok, evidence.installed, evidence.restore_failed)
    if left:
        return Evidence(*flags, left)
    if (kept := _EVIDENCE.get(flags)) is None:
        kept = _EVIDENCE[flags] = Evidence(*flags, ())
    return kept
