"""The run overview: one row per checkpoint and per restore, its outcome and, when it did not
publish, its cause in words naming the participant.

A row is a root span (a span whose parent is not in the logs): a collection checkpoint or
restore, or a coordinate operation run on its own. What a failure leaves in the log, and how
it becomes a row's causes, is ``causes``'s. Any counted event that names no checkpoint (a
refusal before the body is read) is no row's cause: it is counted run-wide by event, detail
and participant (``Run.unscoped``) and said in one line per event, never kept (2M of them
were 382 MiB, and shown nowhere).

The logs are read once, by ``fold.fold_events``, which keeps what each trace, root span and
counted event leaves; this module turns that into the rows, and ``judge`` judges each.

A restore names the checkpoint it restored: the collection restore carries that
checkpoint's id as its ``checkpoint_id``.

A counted event names a checkpoint id, not a row: when several rows carry one id, which one it
belongs to is ``owners``'s, so one run's cause is never said of another (``owner_of``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from ckpt_events import (
    CheckpointEvent,
    OperationStarted,
    SpanEvent,
)
from ckpt_events.participants.cli.report.causes import (
    CAUSES_SHOWN,
    OwnOperations,
)
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.durations import DurationsFold
from ckpt_events.participants.cli.report.events import (
    UnreadEnd,
    event_time,
    trace_of,
)
from ckpt_events.participants.cli.report.fold import UNROOTED, Fold, Unscoped, fold_events
from ckpt_events.participants.cli.report.judge import (
    OPEN,
    PUBLISHED,
    RESTORED,
    UNKNOWN,
    judge,
)
from ckpt_events.participants.cli.report.named import NamedTraces
from ckpt_events.participants.cli.report.operations import OperationRow, operation_rows
from ckpt_events.participants.cli.report.owners import (
    owner_in_doubt,
    owner_of,
    rows_by_id,
    rows_of,
)
from ckpt_events.participants.cli.report.paths import path_unknown_line as path_unknown_of
from ckpt_events.participants.cli.report.root_clocks import FIRST, wall_step
from ckpt_events.participants.cli.report.roots import RootEnd, RootStart
from ckpt_events.participants.cli.report.runs import Fleet, RunLinks, fleets
from ckpt_events.participants.cli.report.shared import owned, shared_line, shared_traces
from ckpt_events.participants.cli.report.stall_blame import StallBlame
from ckpt_events.participants.cli.report.timeline import Breakdown, breakdown, count, settle
from ckpt_events.participants.cli.report.trends import Trends
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import HTTP_STATUS
from ckpt_events.vocab import CollectionAction, CountedEvent, Operation

__all__ = ["Run", "RunRow", "Unscoped", "Whole", "episodes_text", "overview"]

#: Why a row's pause is unknown (``RunRow.pause_why``): a participant answered outside the
#: controller's call (a clock no one shift aligns); a participant's clock went back during its
#: resume (its end unknown); its trace holds another row's root too (whose prepares and
#: resumes are its own is unknown); its root spans' stamps are out of the order they ran in;
#: the controller's wall clock stepped between its root spans (read on its monotonic clock:
#: the participants' prepares and resumes are stamped across that step too).
PauseUnknown = Literal["unaligned", "resume_clock", "shared_trace", "stepped", "wall_step"]


@dataclass
class RunRow:
    """One checkpoint or restore of the run."""

    what: str
    checkpoint_id: str | None
    start_ns: int
    end_ns: int | None = None
    #: Where an open row's logs end: its own run's last stamp when the logs hold several runs
    #: apart (``Run.fleets``), else the logs'. Its open spans are known open until then, no later.
    logs_end_ns: int | None = None
    outcome: str = OPEN
    causes: list[str] = field(default_factory=list)
    #: A published row's critical path and slowest operation in words (``paths.path_line``).
    critical_path: str = ""
    #: How long admission was closed: from the first participant's prepare to the last one's
    #: resume, stamps of several processes on the callers' clock (``clocks``); ``None``
    #: without both, or when it is unknown why (``pause_why``).
    paused_ms: float | None = None
    pause_why: PauseUnknown | None = None
    #: That pause's (first prepare, last resume), in ns, when ``paused_ms`` is known.
    paused_span: tuple[int, int] | None = None
    #: (trace id, span id) of each root span: a checkpoint run by a bare coordinator has one
    #: root per coordinate operation (prepare, commit, resume), all with its checkpoint id.
    roots: list[tuple[int, int]] = field(default_factory=list)
    coordinated: bool = False
    #: Why its duration is unknown though it ended (``ms`` is then ``None``): the root spans it
    #: spans disagree, read on clocks that stepped between them (``root_clocks``).
    ms_why: str | None = None
    #: How far the controller's wall clock stepped between the root spans it spans (ns), read on
    #: the controller's monotonic clock (``root_clocks``); ``None``: no step past
    #: ``root_clocks.ROOTS_SLACK_NS``, or not known (one root, or a log written before that clock).
    stepped_ns: int | None = None
    #: Its duration on that monotonic clock (ns) when its wall clock stepped (``stepped_ns``):
    #: what ``ms`` says then.
    monotonic_ns: int | None = None
    #: A restore: what dominated it (the longest read or install step: participant, records,
    #: MB/s), and the number (1-based) of the row of the checkpoint it restored, if in the logs.
    dominated: str = ""
    source_row: int | None = None
    #: A published row's spans that started and never finished in the logs, in words (``""``:
    #: none): said under the table with its critical path.
    never_finished: str = ""
    #: A restore's longest read or install step, in ms (``None``: not a restore, or none seen).
    dominant_ms: float | None = None
    #: A restore's longest read of each participant (``model/model-4``), in ms: empty when a
    #: read or install had not finished when it ended, or not a restore.
    reads_ms: dict[str, float] = field(default_factory=dict)
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
        """How long it took, by the controller's stamps (on its monotonic clock when its wall
        clock stepped between its root spans, ``monotonic_ns``); ``None`` while open at the end of
        the log, or when that clock went back during it (``ms_text`` says which)."""
        if self.end_ns is None or self.ms_why is not None:
            return None
        if self.monotonic_ns is not None:
            return self.monotonic_ns / 1e6
        # Was 0.0 when the clock went back: a figure, where a span's duration is unknown.
        return None if self.end_ns < self.start_ns else (self.end_ns - self.start_ns) / 1e6

    @property
    def ms_text(self) -> str:
        """``12.3``; ``unknown`` when its root spans disagree (``ms_why``), ``?`` when the
        controller's clock went back during it; ``""`` while open."""
        if self.end_ns is None:
            return ""
        if self.ms_why is not None:
            return "unknown"
        return "?" if self.ms is None else f"{self.ms:.1f}"

    @property
    def pause_unknown(self) -> bool:
        """Whether its pause is unknown for a reason (``pause_why``), not merely not in the logs."""
        return self.pause_why is not None

    @property
    def published(self) -> bool:
        return self.outcome in (PUBLISHED, RESTORED)


#: What the overview calls each counted event that names no checkpoint (one, many).
_UNSCOPED_NOUNS: Final = {
    CountedEvent.REFUSED: ("refusal", "refusals"),
    CountedEvent.LEASE_EXPIRED: ("lease expiry", "lease expiries"),
    CountedEvent.PREPARE_NOT_READY: ("prepare not ready", "prepares not ready"),
    CountedEvent.GENERATION_CUT: ("generation cut", "generation cuts"),
    CountedEvent.STALLED: ("stalled operation", "stalled operations"),
}


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
    #: Traces with no root seen that were let go past ``UNROOTED`` kept (their spans left out).
    unrooted_let_go: int = 0
    #: Spans whose end, in a line this version could not read, came before their start, let go
    #: past ``fold.ENDED_WAITING`` waiting for it (``Fold.ended_let_go``).
    ended_let_go: int = 0
    #: When the logs hold several runs apart (no trace in common: two fleets' logs in one
    #: folder), each with its files, its logs' time and its rows; else empty (one run).
    fleets: list[Fleet] = field(default_factory=list)
    #: What the calls prove of each participant's clock, when known: a counted event no clock
    #: places among its checkpoint id's rows is in no row's detail (``owner_in_doubt``).
    clocks: ClockEvidence | None = None

    def details(self, rows: Sequence[RunRow]) -> dict[int, list[CheckpointEvent]]:
        """Each row's spans (its traces; of a trace shared with other rows, the spans under
        its own root: ``shared``) and the events naming its checkpoint id, in time order, keyed
        by ``id(row)``: one more pass over the logs for all of them."""
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
        # A trace that holds several rows' roots: its spans are told apart once all are read
        # (was: each row drew them all, a checkpoint's detail ran on into its restore).
        shared = shared_traces(self.rows)
        held: dict[int, list[CheckpointEvent]] = {}
        # A counted event goes to the one row of its checkpoint id it belongs to (``owner_of``).
        same_id = rows_by_id(self.rows)
        own = OwnOperations()
        for e in self.again():
            if isinstance(e, SpanEvent):
                if isinstance(e, OperationStarted):
                    own.started(e)
                if e.trace_id in shared:
                    if e.trace_id in by_trace:
                        held.setdefault(e.trace_id, []).append(e)
                    continue
                for bucket in by_trace.get(e.trace_id) or ():
                    bucket.append(e)
            else:
                candidates = same_id.get(e.checkpoint_id or "", ())
                its_trace = own.trace_of(e)
                if owner_in_doubt(rows_of(candidates, its_trace), e, self.clocks):
                    continue  # of one of several rows, which unknown: counted in none
                if (owner := owner_of(candidates, e, its_trace)) and id(owner) in out:
                    out[id(owner)].append(e)
        for trace, events in held.items():
            for e, owner in owned(events, shared[trace]):
                if id(owner) in out:
                    out[id(owner)].append(e)
        for bucket in out.values():
            bucket.sort(key=event_time)
        return out

    def shared_line(self, row: RunRow) -> str | None:
        """What ``row``'s detail says when its trace holds other rows' roots (``shared``)."""
        return shared_line(self.rows, row)

    def events_of(self, row: RunRow) -> list[CheckpointEvent]:
        """One row's events (see ``details``)."""
        return self.details([row])[id(row)]

    def all_events(self) -> list[CheckpointEvent]:
        """Every event of the logs, read again into a list (a file that holds the whole run)."""
        return [] if self.again is None else list(self.again())

    def whole(self, checkpoint: str | None = None) -> Whole:
        """For logs with no row (participants' spans only: a user's own server, or participants
        whose parents are in a controller log not given), one more streamed pass: the
        per-participant breakdown, the per-operation table and the counted events of every
        event, and the events of the last trace; with ``checkpoint``, those of each trace
        holding an operation or step of that checkpoint id (``named``: the ``DRAWN_TRACES``
        most recent, in time order, read in a pass of their own; none when no span names it),
        ``events`` the last of them; nothing else is kept."""
        if self.again is None:
            raise RuntimeError("this run was folded from a one-shot stream: pass again= to overview()")
        drawn: list[CheckpointEvent] = []
        operations = DurationsFold()
        # Counted in the breakdown's pass: a pass of their own read the logs a third time (of a
        # 1,000,000-line log of a newer version's events, one pass is 5.8 s, was 13.8).
        tallies: defaultdict[str, Counter[str]] = defaultdict(Counter)
        # No row: no controller's coordination to judge its stalls by (said unknown), and the
        # calls of every participant, kept, grew this pass with the logs.
        blame = StallBlame(keep_calls=False)

        last = self.last_trace if checkpoint is None else None
        # A checkpoint of one's own server is several requests, each its own trace (prepare, a
        # commit, its retry, a restore): the last alone was drawn, one request of c1's four.
        named = None if checkpoint is None else NamedTraces(checkpoint)

        def tapped(events: Iterable[CheckpointEvent]) -> Iterator[CheckpointEvent]:
            for e in events:
                if last is not None and trace_of(e) == last:
                    drawn.append(e)
                elif named is not None:
                    named.see(e)
                operations.add(e)
                count(tallies, e, blame)
                yield e

        rows = breakdown(tapped(self.again()))
        settle(tallies, blame)
        traces: list[list[CheckpointEvent]] = []
        if named is not None and named.kept:
            # Their traces' spans that name no checkpoint too (a callee's), in one more pass.
            by_trace: dict[int, list[CheckpointEvent]] = {t: [] for t in named.order()}
            for e in self.again():
                if (bucket := by_trace.get(trace_of(e) or -1)) is not None:
                    bucket.append(e)
            traces = list(by_trace.values())
            drawn = traces[-1]
        earlier = 0 if named is None else named.earlier
        return Whole(drawn, rows, dict(tallies), operation_rows(operations.result()), traces, earlier)

    def let_go_line(self) -> str | None:
        """What the fold let go to bound its memory, if anything: traces whose root never came."""
        if not self.unrooted_let_go:
            return None
        return (
            f"{self.unrooted_let_go:,} traces with no root span were let go past {UNROOTED:,} waiting "
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
    #: One row per (kind, operation, step) over every participant's span of the logs: what one
    #: request takes, where ``breakdown`` sums them all.
    operations: list[OperationRow] = field(default_factory=list)
    #: With ``--checkpoint``: the events of each trace naming that id that is drawn, the most
    #: recent ``DRAWN_TRACES`` in time order (``events`` is the last of them); else empty.
    named: list[list[CheckpointEvent]] = field(default_factory=list)
    #: Traces naming that id that started before those drawn: counted, not drawn.
    earlier: int = 0


def overview(
    events: Iterable[CheckpointEvent],
    *,
    again: Callable[[], Iterable[CheckpointEvent]] | None = None,
    clocks: ClockEvidence | None = None,
    runs: RunLinks | None = None,
    cut: bool = False,
    ended: dict[tuple[int, int], UnreadEnd] | None = None,
) -> Run:
    """Rows for every root span, in start order, with outcome, causes and critical path.

    ``events`` is streamed once and folded; ``again`` gives the events anew for the detail
    of chosen rows (a list passed as ``events`` is its own ``again``). ``clocks``, filled by
    the same stream (``LogProblems.clocks``), names the traces where a participant answered
    outside the controller's call: their pause is unknown. ``runs``, filled by the same stream
    (``LogProblems.runs``), tells the runs apart when the logs hold several (``Run.fleets``).
    ``cut``: a log given ends in a rotated file (``rotated_ends``), so work open at the end may
    have been answered in the newer file not given. ``ended``, filled by the same stream
    (``LogProblems.ended``): spans whose end this version could not read, said ended."""
    if again is None and isinstance(events, list | tuple):
        kept = events
        again = lambda: kept  # noqa: E731
    fold = fold_events(events, ended)
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
        fold.ended_let_go,
        clocks=clocks,
    )
    checkpoints: dict[str, int] = {}
    same_id = rows_by_id(rows)
    outside = clocks.outside if clocks is not None else set()
    if runs is not None:
        # Before judging: a run killed mid-checkpoint ages its open spans by its own logs' end,
        # not by another fleet's an hour later ("still open, 3600093.0 ms").
        run.fleets = fleets(rows, runs)
    for fleet in run.fleets:
        for row in fleet.rows:
            row.logs_end_ns = fleet.last_ns
    # A trace that holds several rows' roots (one traceparent given to several collections).
    sharing = Counter(t for row in rows for t in row.trace_ids)
    for number, row in enumerate(rows, 1):
        judge(
            run,
            row,
            fold,
            same_id.get(row.checkpoint_id or "", [row]),
            not row.trace_ids & outside,
            clocks,
            cut=cut,
            shared=any(sharing[t] > 1 for t in row.trace_ids),
        )
        if row.what == "restore":
            # The restore carries the id of the checkpoint it restored (no event names a
            # separate source id): the last checkpoint row with that id before it that may have
            # published (published, open at the end of its log, or of unknown outcome), never
            # one that aborted or failed (an id reused by another run).
            row.source_row = checkpoints.get(row.checkpoint_id or "")
            row.dominated = "; ".join(fold.dominated[k] for k in row.roots if fold.dominated.get(k))
            step_ms = [ms for k in row.roots if (ms := fold.dominant_ms.get(k)) is not None]
            row.dominant_ms = max(step_ms) if step_ms else None
            for k in row.roots:
                for who, ms in fold.reads_ms.get(k, {}).items():
                    row.reads_ms[who] = max(row.reads_ms.get(who, 0.0), ms)
        elif row.checkpoint_id and row.outcome in (PUBLISHED, OPEN, UNKNOWN):
            checkpoints[row.checkpoint_id] = number
        ends = [f for k in row.roots if (f := fold.root_finished.get(k)) is not None and f.coordinated]
        stepped, monotonic, ms_why = wall_step(ends) if row.end_ns is not None else (None, None, None)
        row.stepped_ns = stepped
        row.monotonic_ns = monotonic
        row.ms_why = ms_why
    fold.trends.rows = rows
    _unaligned_paths(run, fold, outside)
    # Each row's pause is its traces' first prepare to last resume: a trace shared by several
    # rows gave each the span of them all (a checkpoint "paused" until the restore resumed).
    for row in rows:
        why: PauseUnknown | None = None
        if any(sharing[t] > 1 for t in row.trace_ids):
            row.paused_ms = None
            row.paused_span = None
            why = "shared_trace" if row.what == "checkpoint" else None  # a restore's is not shown
        elif row.trace_ids & outside:
            why = "unaligned"
        elif row.ms_why is not None:
            why = "stepped"  # its roots' stamps disagree: first prepare to last resume is no time
        elif row.stepped_ns is not None:
            why = "wall_step"  # its participants' stamps span the step too: no time either
        elif any(fold.traces[t].resume_unknown for t in row.trace_ids if t in fold.traces):
            why = "resume_clock"  # was said "unaligned": a cause no clock line backed
        if why is not None:
            row.paused_ms = None
            row.paused_span = None
            row.pause_why = why
    return run


def _rows(
    root_started: dict[tuple[int, int], RootStart],
    root_finished: dict[tuple[int, int], RootEnd],
) -> list[RunRow]:
    roots = [*root_started.values(), *(f for k, f in root_finished.items() if k not in root_started)]
    # A span whose parent's start was not in the logs (rotated away, a log that begins mid-
    # checkpoint) was taken for a root until that parent ended as one: it is that root's child,
    # not a checkpoint of its own.
    keys = {(e.trace_id, e.span_id) for e in roots}
    roots = [
        e
        for e in roots
        if (e.action is None or e.action in (CollectionAction.CHECKPOINT, CollectionAction.RESTORE))
        and (e.parent_span_id == e.span_id or (e.trace_id, e.parent_span_id) not in keys)
    ]
    roots.sort(key=lambda e: e.start_ns)
    rows: list[RunRow] = []
    #: Per (checkpoint id, restore or not, controller): its latest coordinated row and the
    #: coordinate operations it holds. Not the row just before only: two controllers at once
    #: interleave (a's prepare, b's refused checkpoint, a's commit), and a's checkpoint was two
    #: rows, 'aborted' and 'published'. A second prepare or restore with its id is a retry (a
    #: restore run again after its first failed, the id being the checkpoint's), a row of its
    #: own; merged, the retry's success was said as the first attempt's failure.
    open_rows: dict[tuple[str | None, bool, str, str], tuple[RunRow, set[str]]] = {}
    for e in roots:
        if e.operation is not None:  # a coordinate operation run on its own
            key = (e.checkpoint_id, e.operation == Operation.RESTORE, e.kind, e.instance)
            found = open_rows.get(key)
            if found is not None and not (
                e.operation in (Operation.PREPARE, Operation.RESTORE) and e.operation in found[1]
            ):
                found[0].roots.append((e.trace_id, e.span_id))
                found[1].add(e.operation)
                if e.operation in FIRST:
                    # It ran first, whatever the stamps say: a commit stamped an hour early (a
                    # clock stepped back after the prepare) gave the row its stamp, and sorted
                    # it first of the run.
                    found[0].start_ns = e.start_ns
                continue
        rows.append(
            RunRow(
                e.what,
                e.checkpoint_id,
                e.start_ns,
                roots=[(e.trace_id, e.span_id)],
                coordinated=e.coordinated,
            )
        )
        if e.operation is not None:  # a coordinate operation run on its own
            open_rows[key] = (rows[-1], {e.operation})
    rows.sort(key=lambda r: r.start_ns)  # stable: the order read where starts tie
    return rows


def _unaligned_paths(run: Run, fold: Fold, outside: Collection[int]) -> None:
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


def episodes_text(continued: int | None, restarted: int | None) -> str:
    """Words for episodes continued and restarted after a restore (``""`` if neither known)."""
    parts = []
    if continued is not None:
        parts.append(f"{counted(continued, 'episode')} continued from their boundary")
    if restarted is not None:
        parts.append(f"{restarted:,} restarted from scratch")
    return ", ".join(parts)
