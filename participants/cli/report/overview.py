"""The run overview: one row per checkpoint and per restore, its outcome and, when it did not
publish, its cause in words naming the participant.

A row is a root span (a span whose parent is not in the logs): a collection checkpoint or
restore, or a coordinate operation run on its own. What a failure leaves in the log, and how
it becomes a row's causes, is ``causes``'s. Any counted event that names no checkpoint (a
refusal before the body is read) is no row's cause: it is counted run-wide by event, detail
and participant (``Run.unscoped``) and said in one line per event, never kept (2M of them
were 382 MiB, and shown nowhere).

A restore names the checkpoint it restored: the collection restore carries that
checkpoint's id as its ``checkpoint_id``.

A counted event names a checkpoint id, not a row: when several rows carry one id (a restore
and its checkpoint, or a second run that reused the id, appended to the same log), it belongs
to the latest of them that started at or before it and could have caused it (a prepare not
ready, or a lease that expired in a checkpoint's phase, is a checkpoint's; one in phase
``restored`` a restore's), so one run's cause is never said of another (``row_of``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
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
    CAUSES_SHOWN,
    CauseEvent,
    CheckpointCauses,
    TraceCauses,
    causes_of,
    open_causes,
    shown,
)
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.events import (
    FinishedSpan,
    PointEvent,
    RootSpan,
    StartedSpan,
    duration_ns,
    event_start,
    event_time,
    trace_of,
    who_wrote,
)
from ckpt_events.participants.cli.report.paths import dominant_step_ms
from ckpt_events.participants.cli.report.paths import dominated as dominated_by
from ckpt_events.participants.cli.report.paths import path_line as path_of
from ckpt_events.participants.cli.report.paths import path_unknown_line as path_unknown_of
from ckpt_events.participants.cli.report.runs import Fleet, RunLinks, fleets
from ckpt_events.participants.cli.report.timeline import Breakdown, breakdown, counts
from ckpt_events.participants.cli.report.trends import Trends
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import HTTP_STATUS
from ckpt_events.vocab import CollectionAction, CountedEvent, Kind, Operation, Outcome, Phase

__all__ = ["Run", "RunRow", "Unscoped", "Whole", "episodes_text", "overview", "row_of"]

PUBLISHED: Final = "published"
RESTORED: Final = "restored"
ABORTED: Final = "aborted"
FAILED: Final = "failed"
OPEN: Final = "open at end of log"


@dataclass
class RunRow:
    """One checkpoint or restore of the run."""

    what: str
    checkpoint_id: str | None
    start_ns: int
    end_ns: int | None = None
    outcome: str = OPEN
    causes: list[str] = field(default_factory=list)
    #: A published row's critical path and slowest operation in words (``paths.path_line``).
    critical_path: str = ""
    #: How long admission was closed: from the first participant's prepare to the last one's
    #: resume, stamps of several processes on the callers' clock (``clocks``); ``None``
    #: without both, or when a participant's clock is not proven on it (``pause_unknown``).
    paused_ms: float | None = None
    pause_unknown: bool = False
    #: That pause's (first prepare, last resume), in ns, when ``paused_ms`` is known.
    paused_span: tuple[int, int] | None = None
    #: (trace id, span id) of each root span: a checkpoint run by a bare coordinator has one
    #: root per coordinate operation (prepare, commit, resume), all with its checkpoint id.
    roots: list[tuple[int, int]] = field(default_factory=list)
    coordinated: bool = False
    #: A restore: what dominated it (the longest read or install step: participant, records,
    #: MB/s), and the number (1-based) of the row of the checkpoint it restored, if in the logs.
    dominated: str = ""
    source_row: int | None = None
    #: A restore's longest read or install step, in ms (``None``: not a restore, or none seen).
    dominant_ms: float | None = None
    #: After a restore: episodes that continued from their checkpointed boundary and episodes
    #: restarted from scratch (a rollout collection's ``collection.restore`` ``rows`` and
    #: ``restarts``; a bare coordinator's restore counts its ``episodes`` as continued and
    #: does not know the restarts). ``None``: not a restore, or not carried.
    continued: int | None = None
    restarted: int | None = None

    @property
    def episodes_text(self) -> str:
        """``12 episodes continued from their boundary, 3 restarted from scratch``, or ``""``."""
        return episodes_text(self.continued, self.restarted)

    @property
    def trace_ids(self) -> set[int]:
        return {trace for trace, _ in self.roots}

    @property
    def ms(self) -> float | None:
        # Both stamps are the controller's; a clock that went back never makes it negative.
        return None if self.end_ns is None else max(0, self.end_ns - self.start_ns) / 1e6

    @property
    def published(self) -> bool:
        return self.outcome in (PUBLISHED, RESTORED)


@dataclass
class _Trace:
    """What one trace leaves after it streamed past: never its events."""

    first_prepare_ns: int | None = None
    last_resume_ns: int | None = None
    #: A resume of unknown duration (its clock went back during it): its end is unknown.
    resume_unknown: bool = False
    #: The participants a coordinate.prepare that prepared called: with fewer prepares in the
    #: logs (a log rotated or cut mid-prepare, a participant's log not given) the first is unknown.
    members: int | None = None
    #: Its prepares, errors and stops, for its row's causes.
    causes: TraceCauses = field(default_factory=TraceCauses)


#: The spans that can be a row (``events.RootSpan``).
_ROOT_TYPES = (CollectionStarted, CollectionFinished, CoordinateStarted, CoordinateFinished)
#: Traces with no root seen yet whose spans are kept (a collector's file holds no started
#: events: a root is known when it ends, after its spans); past this many the longest idle is
#: let go. Participants' logs without the controller's make one such trace per checkpoint, and
#: every span was kept (1.2M lines: 531 MB).
_UNROOTED: Final = 4096

#: What the overview calls each counted event that names no checkpoint (one, many).
_UNSCOPED_NOUNS: Final = {
    CountedEvent.REFUSED: ("refusal", "refusals"),
    CountedEvent.LEASE_EXPIRED: ("lease expiry", "lease expiries"),
    CountedEvent.PREPARE_NOT_READY: ("prepare not ready", "prepares not ready"),
    CountedEvent.GENERATION_CUT: ("generation cut", "generation cuts"),
    CountedEvent.STALLED: ("stalled operation", "stalled operations"),
}


class Unscoped(NamedTuple):
    """Counted events that name no checkpoint, as the overview counts them run-wide: the event,
    its detail (a refusal's code, a lease's phase, a cut's disposition, a stalled operation;
    ``""`` for a prepare not ready) and the participant."""

    event: CountedEvent
    detail: str
    who: str


def _unscoped(e: PointEvent) -> Unscoped:
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
class Run:
    """Every row in time order, folded from one streaming pass over the logs.

    Only summaries are kept: per trace its prepares, pause bounds and errors, per root its
    start and end events and its critical path, the spans still open at the end, and the
    counted events that name a cause. A row's events (for its detail) are read again from
    the logs by ``events_of`` / ``details``, filtered by its trace ids and checkpoint id.
    Counted events that name no checkpoint are counted (``unscoped``), never kept, so memory
    follows the checkpoints shown, not the lines read.
    """

    rows: list[RunRow]
    last_ns: int
    first_ns: int
    #: Events read in the first pass.
    count: int = 0
    again: Callable[[], Iterable[CheckpointEvent]] | None = None
    trends: Trends = field(default_factory=Trends)
    #: Counted events that name no checkpoint (a refusal before the body is read), run-wide.
    unscoped: Counter[Unscoped] = field(default_factory=Counter)
    #: The trace of the last finished span: the one a run with no row draws (``whole``).
    last_trace: int | None = None
    #: Traces with no root seen that were let go past ``_UNROOTED`` kept (their spans left out).
    unrooted_let_go: int = 0
    #: When the logs hold several runs apart (no trace in common: two fleets' logs in one
    #: folder), each with its files, its logs' time and its rows; else empty (one run).
    fleets: list[Fleet] = field(default_factory=list)

    def details(self, rows: Sequence[RunRow]) -> dict[int, list[CheckpointEvent]]:
        """Each row's spans (its traces) and the events naming its checkpoint id, in time
        order, keyed by ``id(row)``: one more pass over the logs for all of them."""
        if not rows:
            return {}
        if self.again is None:
            raise RuntimeError("this run was folded from a one-shot stream: pass again= to overview()")
        by_trace: dict[int, list[list[CheckpointEvent]]] = {}
        out: dict[int, list[CheckpointEvent]] = {}
        for row in rows:
            bucket = out.setdefault(id(row), [])
            for trace in row.trace_ids:
                by_trace.setdefault(trace, []).append(bucket)
        # A counted event goes to the one row of its checkpoint id it belongs to (``row_of``).
        same_id = _same_id(self.rows)
        for e in self.again():
            if isinstance(e, SpanEvent):
                for bucket in by_trace.get(e.trace_id) or ():
                    bucket.append(e)
            elif (owner := row_of(same_id.get(e.checkpoint_id or "", ()), e.time_ns, e)) and id(owner) in out:
                out[id(owner)].append(e)
        for bucket in out.values():
            bucket.sort(key=event_time)
        return out

    def events_of(self, row: RunRow) -> list[CheckpointEvent]:
        """One row's events (see ``details``)."""
        return self.details([row])[id(row)]

    def all_events(self) -> list[CheckpointEvent]:
        """Every event of the logs, read again into a list (a file that holds the whole run)."""
        return [] if self.again is None else list(self.again())

    def whole(self) -> Whole:
        """For logs with no row (participants' spans only: their parents are in a controller
        log not given), two more streamed passes: the per-participant breakdown and the counted
        events of every event, and the events of the last trace; nothing else is kept."""
        if self.again is None:
            raise RuntimeError("this run was folded from a one-shot stream: pass again= to overview()")
        drawn: list[CheckpointEvent] = []

        def tapped(events: Iterable[CheckpointEvent]) -> Iterator[CheckpointEvent]:
            for e in events:
                if self.last_trace is not None and trace_of(e) == self.last_trace:
                    drawn.append(e)
                yield e

        rows = breakdown(tapped(self.again()))
        return Whole(drawn, rows, counts(self.again()))

    def let_go_line(self) -> str | None:
        """What the fold let go to bound its memory, if anything: traces whose root never came."""
        if not self.unrooted_let_go:
            return None
        return (
            f"{self.unrooted_let_go:,} traces with no root span were let go past {_UNROOTED:,} waiting "
            "for one: a checkpoint whose root came later lacks their spans (the controller's log "
            "holds the roots; give it too)"
        )

    def unscoped_lines(self) -> list[str]:
        """One line per counted event that named no checkpoint, its most frequent details and
        participants first: ``2,000,000 refusals without a checkpoint id: unauthorized (401)
        2,000,000 on environment/environment-0``."""
        lines = []
        for event in CountedEvent:
            found = sorted(
                ((n, key) for key, n in self.unscoped.items() if key.event == event),
                key=lambda found: (-found[0], found[1]),
            )
            if not found:
                continue
            said = []
            for n, key in found[:CAUSES_SHOWN]:
                codes = HTTP_STATUS.items() if event == CountedEvent.REFUSED else ()
                status = next((status for code, status in codes if code == key.detail), None)
                detail = f"{key.detail} ({status}) " if status else f"{key.detail} " if key.detail else ""
                said.append(f"{detail}{n:,} on {key.who}")
            if len(found) > CAUSES_SHOWN:
                said.append(f"... and {sum(n for n, _ in found[CAUSES_SHOWN:]):,} more")
            singular, plural = _UNSCOPED_NOUNS[event]
            total = sum(n for n, _ in found)
            lines.append(f"{counted(total, singular, plural)} without a checkpoint id: {', '.join(said)}")
        return lines


@dataclass(frozen=True)
class Whole:
    """What the logs of a run with no row hold (``Run.whole``)."""

    #: The last trace's events, in time order: the one drawn.
    events: list[CheckpointEvent]
    #: Every participant's totals over every event of the logs.
    breakdown: list[Breakdown]
    #: The counted events of the logs (``timeline.counts``).
    counts: dict[str, Counter[str]]


def overview(
    events: Iterable[CheckpointEvent],
    *,
    again: Callable[[], Iterable[CheckpointEvent]] | None = None,
    clocks: ClockEvidence | None = None,
    runs: RunLinks | None = None,
) -> Run:
    """Rows for every root span, in start order, with outcome, causes and critical path.

    ``events`` is streamed once and folded; ``again`` gives the events anew for the detail
    of chosen rows (a list passed as ``events`` is its own ``again``). ``clocks``, filled by
    the same stream (``LogProblems.clocks``), names the traces where a participant answered
    outside the controller's call: their pause is unknown. ``runs``, filled by the same stream
    (``LogProblems.runs``), tells the runs apart when the logs hold several (``Run.fleets``)."""
    if again is None and isinstance(events, list | tuple):
        kept = events
        again = lambda: kept  # noqa: E731
    fold = _fold(events)
    rows = _rows(fold.root_started, fold.root_finished)
    first_ns, last_ns = fold.first_ns, fold.last_ns
    if clocks is not None and clocks.unaligned() and fold.controller_first is not None:
        first_ns, last_ns = fold.controller_first, fold.controller_last
    run = Run(
        rows,
        last_ns,
        first_ns or 0,
        fold.count,
        again,
        fold.trends,
        fold.unscoped,
        fold.last_trace,
        fold.let_go,
    )
    checkpoints: dict[str, int] = {}
    same_id = _same_id(rows)
    outside = clocks.outside if clocks is not None else set()
    for number, row in enumerate(rows, 1):
        _judge(run, row, fold, same_id.get(row.checkpoint_id or "", [row]))
        if row.what == "restore":
            # The restore carries the id of the checkpoint it restored (no event names a
            # separate source id): the last checkpoint row with that id before it that may have
            # published (published, or open at the end of its log), never one that aborted or
            # failed (an id reused by another run).
            row.source_row = checkpoints.get(row.checkpoint_id or "")
            row.dominated = "; ".join(fold.dominated[k] for k in row.roots if fold.dominated.get(k))
            step_ms = [ms for k in row.roots if (ms := fold.dominant_ms.get(k)) is not None]
            row.dominant_ms = max(step_ms) if step_ms else None
        elif row.checkpoint_id and row.outcome in (PUBLISHED, OPEN):
            checkpoints[row.checkpoint_id] = number
    fold.trends.rows = rows
    _unaligned_paths(run, fold, outside)
    for row in rows:
        if row.trace_ids & outside or any(
            fold.traces[t].resume_unknown for t in row.trace_ids if t in fold.traces
        ):
            row.paused_ms = None
            row.paused_span = None
            row.pause_unknown = True
    if runs is not None:
        run.fleets = fleets(rows, runs)
    return run


@dataclass
class _Fold:
    """What the streamed pass over the logs keeps (``_fold``): never the events themselves."""

    traces: dict[int, _Trace]
    #: Spans started and never finished, by (trace id, span id).
    started: dict[tuple[int, int], StartedSpan]
    root_started: dict[tuple[int, int], RootSpan]
    root_finished: dict[tuple[int, int], CollectionFinished | CoordinateFinished]
    #: Per root: its critical path in words, and for a restore what dominated it and its
    #: longest read or install step (ms).
    critical: dict[tuple[int, int], str]
    dominated: dict[tuple[int, int], str]
    dominant_ms: dict[tuple[int, int], float | None]
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


# One step over 60 lines, kept flat for speed: the span half as a helper called per event cost
# 2-3% (0.14 of 5.6 us/event over bench_report's 64,000 lines).
def _fold(events: Iterable[CheckpointEvent]) -> _Fold:
    """Fold ``events`` in one streamed pass: each trace's summary, each root's critical path as
    it ends, the counted events that name a cause (at most ``causes.KEPT_CAUSES`` per checkpoint)."""
    traces: dict[int, _Trace] = {}
    #: Spans started and not yet finished, by (trace id, span id).
    started: dict[tuple[int, int], StartedSpan] = {}
    #: Finished spans of each trace since its last root ended: the critical path's input.
    pending: dict[int, list[FinishedSpan]] = {}
    root_started: dict[tuple[int, int], RootSpan] = {}
    root_finished: dict[tuple[int, int], CollectionFinished | CoordinateFinished] = {}
    critical: dict[tuple[int, int], str] = {}
    dominated: dict[tuple[int, int], str] = {}
    dominant_ms: dict[tuple[int, int], float | None] = {}
    causes = CheckpointCauses()
    #: The start of the latest root span read naming each checkpoint id (a flood's row).
    root_since: dict[str, int] = {}
    unscoped: Counter[Unscoped] = Counter()
    #: Traces with a root, and those with none yet, longest idle first (``_UNROOTED``).
    rooted: set[int] = set()
    unrooted: dict[int, None] = {}
    last_trace: int | None = None
    trends = Trends()
    first_ns: int | None = None
    last_ns = 0
    # The controller's own first and last stamps: the logs' time when a participant's clock
    # fits no one shift (its stamps would stretch it).
    controller_first: int | None = None
    controller_last = 0
    count = 0
    let_go = 0  # unrooted traces let go past _UNROOTED (said in the overview, never silent)
    #: Per trace, the last root that ended whose parent in its process may still come.
    provisional: dict[int, CollectionFinished | CoordinateFinished] = {}
    for e in events:
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
                    causes.add(e.checkpoint_id, e, root_since.get(e.checkpoint_id))
            else:  # a cause of no row: counted run-wide, never kept (2M of them took 382 MiB)
                unscoped[_unscoped(e)] += 1
            continue
        trace_id = e.trace_id
        key = (trace_id, e.span_id)
        trace = traces.get(trace_id)
        if trace is None:
            trace = traces[trace_id] = _Trace()
        buffer = pending.setdefault(trace_id, [])
        if trace_id not in rooted:
            unrooted.pop(trace_id, None)
            unrooted[trace_id] = None
            if len(unrooted) > _UNROOTED:
                idle = next(iter(unrooted))
                del unrooted[idle]
                del traces[idle], pending[idle]
                let_go += 1
        candidate = isinstance(e, _ROOT_TYPES)
        parent_seen = (
            (trace_id, e.parent_span_id) in started or any(f.span_id == e.parent_span_id for f in buffer)
            if candidate and e.parent_span_id is not None
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
                    if isinstance(e, OperationStarted) and e.operation == Operation.PREPARE:
                        writer = who_wrote(e)
                        trace.causes.prepares.setdefault(writer, e.start_ns)
                        if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                            trace.first_prepare_ns = e.start_ns
                    if candidate and isinstance(e, _ROOT_TYPES) and not parent_seen:
                        root_started[key] = e
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
                writer = who_wrote(e)
                prepares = trace.causes.prepares
                prepares[writer] = min(e.start_ns, prepares.get(writer, e.start_ns))
                if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                    trace.first_prepare_ns = e.start_ns
            case OperationFinished(operation=Operation.RESUME):
                # Its end by its own clock: its start plus its duration.
                length = duration_ns(e)
                trace.resume_unknown |= length is None
                end = e.start_ns + (length or 0)
                if trace.last_resume_ns is None or end > trace.last_resume_ns:
                    trace.last_resume_ns = end
            case CoordinateFinished(operation=Operation.PREPARE, prepared=True, participants=int(members)):
                trace.members = max(members, trace.members or 0)
        # Ended in error, or a coordinate.prepare not prepared: only a failed span pays the call.
        if e.outcome == Outcome.ERROR or (isinstance(e, CoordinateFinished) and e.prepared is False):
            trace.causes.span_failed(e, t)
        buffer.append(e)
        if candidate and isinstance(e, _ROOT_TYPES) and (key in root_started or not parent_seen):
            # A root ended: its trace's spans so far are its tree; fold and let them go.
            root_finished[key] = e
            rooted.add(trace_id)
            unrooted.pop(trace_id, None)
            critical[key] = path_of(buffer, trace_id)
            if _what(e) == "restore":
                dominated[key] = dominated_by(buffer)
                dominant_ms[key] = dominant_step_ms(buffer)
            if e.parent_span_id is not None and not e.parent_remote and not parent_seen:
                # Its parent in its own process was not read (a collector's file holds no
                # started events, a rotated log lost it): a root for now, whose spans are kept
                # for that parent, which would have had only what ends after this.
                provisional[trace_id] = e
                continue
            provisional.pop(trace_id, None)
            trends.add_trace(buffer, e)
            del pending[trace_id]
    for trace_id, root in provisional.items():  # their parent never came: roots after all
        trends.add_trace(pending[trace_id], root)
    return _Fold(
        traces,
        started,
        root_started,
        root_finished,
        critical,
        dominated,
        dominant_ms,
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
    )


def _rows(
    root_started: dict[tuple[int, int], RootSpan],
    root_finished: dict[tuple[int, int], CollectionFinished | CoordinateFinished],
) -> list[RunRow]:
    roots = [*root_started.values(), *(f for k, f in root_finished.items() if k not in root_started)]
    # A span whose parent's start was not in the logs (rotated away, a log that begins mid-
    # checkpoint) was taken for a root until that parent ended as one: it is that root's child,
    # not a checkpoint of its own.
    keys = {(e.trace_id, e.span_id) for e in roots}
    roots = [
        e
        for e in roots
        if (
            not isinstance(e, CollectionStarted | CollectionFinished)
            or e.action in (CollectionAction.CHECKPOINT, CollectionAction.RESTORE)
        )
        and (e.trace_id, e.parent_span_id) not in keys
    ]
    roots.sort(key=lambda e: e.start_ns)
    rows: list[RunRow] = []
    for e in roots:
        last = rows[-1] if rows else None
        coordinate = isinstance(e, CoordinateStarted | CoordinateFinished)
        if (
            isinstance(e, CoordinateStarted | CoordinateFinished)
            and last is not None
            and last.coordinated
            and last.checkpoint_id == e.checkpoint_id
            and (e.operation == Operation.RESTORE) == (last.what == "restore")
        ):
            last.roots.append((e.trace_id, e.span_id))
            continue
        rows.append(
            RunRow(
                _what(e), e.checkpoint_id, e.start_ns, roots=[(e.trace_id, e.span_id)], coordinated=coordinate
            )
        )
    return rows


def _unaligned_paths(run: Run, fold: _Fold, outside: Collection[int]) -> None:
    """A published row whose trace a participant answered outside a call by a clock no shift
    aligns (``clocks``): which call ended last is unknown, so its critical path is said unknown
    (its slowest operation still said, from its events read again). Known at the end only (an
    answer stamped ahead is read after its root ended); the rare case pays one more pass."""
    rows = [r for r in run.rows if r.published and any(t in outside for t in r.trace_ids)]
    details = run.details(rows) if run.again is not None else {}
    for row in rows:
        ends = [fold.root_finished[k] for k in row.roots if k in fold.root_finished]
        longest = max(ends, key=lambda f: f.end_ns - f.start_ns)
        row.critical_path = path_unknown_of(details.get(id(row), []), longest.trace_id)


def _same_id(rows: Iterable[RunRow]) -> dict[str, list[RunRow]]:
    """The rows that carry each checkpoint id, in start order."""
    out: dict[str, list[RunRow]] = {}
    for row in sorted(rows, key=lambda r: r.start_ns):
        if row.checkpoint_id:
            out.setdefault(row.checkpoint_id, []).append(row)
    return out


def row_of(same_id: Sequence[RunRow], time_ns: int | None, event: PointEvent | None = None) -> RunRow | None:
    """Of the rows that carry one checkpoint id (in start order), the one a counted ``event``
    at ``time_ns`` belongs to: the latest that started at or before it among those it could be
    a cause of (the first of them when it came before all); ``None`` without rows."""
    fits = [r for r in same_id if _may_cause(event, r)] or list(same_id)
    if not fits:
        return None
    owner = fits[0]
    for row in fits:
        if time_ns is not None and row.start_ns <= time_ns:
            owner = row
    return owner


def _may_cause(event: PointEvent | None, row: RunRow) -> bool:
    """Whether ``event`` can be about ``row``: a prepare not ready is a checkpoint's, a lease
    expiry a restore's in phase ``restored`` and a checkpoint's in any other."""
    restore = row.what == "restore"
    match event:
        case PrepareNotReady():
            return not restore
        case LeaseExpired(phase=phase):
            return restore == (phase == Phase.RESTORED)
        case _:
            return True


def _judge(run: Run, row: RunRow, fold: _Fold, same_id: Sequence[RunRow]) -> None:
    """Set ``row``'s end, pause, outcome and causes (or critical path) from what the fold kept;
    ``same_id``: the rows that carry its checkpoint id (``row_of``)."""
    mine = [fold.traces[t] for t in row.trace_ids if t in fold.traces]
    ends = [fold.root_finished[k] for k in row.roots if k in fold.root_finished]
    row.paused_span = _paused_span(mine)
    row.paused_ms = None if row.paused_span is None else (row.paused_span[1] - row.paused_span[0]) / 1e6
    events: list[CauseEvent] = [
        e for e in fold.causes.of(row.checkpoint_id) if row_of(same_id, e.time_ns, e) is row
    ]
    causes, aborted_by = causes_of([t.causes for t in mine], events)
    if len(ends) < len(row.roots):
        row.outcome = OPEN
        causes += open_causes((s for k, s in fold.started.items() if k[0] in row.trace_ids), run.last_ns)
        row.end_ns = None
    else:
        row.end_ns = max(f.end_ns for f in ends)
        if any(f.outcome == Outcome.ERROR for f in ends):
            # The protocol's own aborts surface as the controller's error (not prepared, or a
            # commit refused after the lease): the abort is the outcome, not a failure.
            row.outcome = ABORTED if aborted_by else FAILED
        elif any(_not_done(f) for f in ends):
            row.outcome = ABORTED
        elif row.coordinated and row.what == "checkpoint" and not _committed(ends):
            row.outcome = ABORTED
            causes = causes or ["prepared, never committed"]
        else:
            row.outcome = RESTORED if "restore" in row.what else PUBLISHED
    if row.what == "restore" and ends:
        _episodes_after_restore(row, ends)
    if row.published:
        longest = max(ends, key=lambda f: f.end_ns - f.start_ns)
        row.critical_path = fold.critical.get((longest.trace_id, longest.span_id), "")
        causes = []
    # Past the causes kept per checkpoint, the rest are counted (``causes.KEPT_CAUSES``).
    over = sum(
        n
        for (checkpoint_id, since), n in fold.causes.over_since.items()
        if checkpoint_id == row.checkpoint_id and row_of(same_id, since) is row
    )
    row.causes = shown(causes, over if causes else 0)


def _paused_span(traces: Sequence[_Trace]) -> tuple[int, int] | None:
    """(first participant's prepare, last one's resume) over ``traces`` (``None`` without both,
    with the resume before the prepare, or with fewer participants' prepares in the logs than a
    prepare that prepared called: its first may be the one missing)."""
    if any(t.members is not None and len(t.causes.prepares) < t.members for t in traces):
        return None
    firsts = [t.first_prepare_ns for t in traces if t.first_prepare_ns is not None]
    lasts = [t.last_resume_ns for t in traces if t.last_resume_ns is not None]
    return (min(firsts), max(lasts)) if firsts and lasts and max(lasts) >= min(firsts) else None


def episodes_text(continued: int | None, restarted: int | None) -> str:
    """Words for episodes continued and restarted after a restore (``""`` if neither known)."""
    parts = []
    if continued is not None:
        parts.append(f"{counted(continued, 'episode')} continued from their boundary")
    if restarted is not None:
        parts.append(f"{restarted:,} restarted from scratch")
    return ", ".join(parts)


def _episodes_after_restore(row: RunRow, ends: Sequence[CollectionFinished | CoordinateFinished]) -> None:
    collections = [
        f for f in ends if isinstance(f, CollectionFinished) and f.action == CollectionAction.RESTORE
    ]
    if collections:
        rows = [f.rows for f in collections if f.rows is not None]
        restarts = [f.restarts for f in collections if f.restarts is not None]
        row.continued = sum(rows) if rows else None
        row.restarted = sum(restarts) if restarts else None
        return
    episodes = [f.episodes for f in ends if isinstance(f, CoordinateFinished) and f.episodes is not None]
    row.continued = sum(episodes) if episodes else None


def _what(root: RootSpan) -> str:
    match root:
        case CollectionStarted(action=action) | CollectionFinished(action=action):
            return str(action)
        case CoordinateStarted(operation=operation) | CoordinateFinished(operation=operation):
            return "restore" if operation == Operation.RESTORE else "checkpoint"


def _committed(roots: Sequence[CollectionFinished | CoordinateFinished]) -> bool:
    return any(isinstance(f, CoordinateFinished) and f.operation == Operation.COMMIT for f in roots)


def _not_done(root: CollectionFinished | CoordinateFinished) -> bool:
    """A root that ended without doing its work: a collection not published, a prepare not
    prepared."""
    match root:
        case CollectionFinished(published=False) | CoordinateFinished(prepared=False):
            return True
        case _:
            return False
