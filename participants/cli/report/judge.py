"""A run overview's row judged: its end, pause, outcome (one of ``PUBLISHED``, ``RESTORED``,
``ABORTED``, ``FAILED``, ``OPEN``, ``UNKNOWN``) and causes, or its critical path when it
published, from what ``fold.fold_events`` kept of its traces and root spans. A counted event
is a cause of the row it belongs to (``owners``), and said on each row it may be of when which
one is not known.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

from ckpt_events import CoordinateStarted, OperationStarted
from ckpt_events.participants.cli.report.causes import (
    CauseEvent,
    causes_of,
    never_finished_line,
    open_causes,
    repeated,
    shown,
    unfinished_causes,
)
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.events import StartedSpan, who_wrote
from ckpt_events.participants.cli.report.owners import (
    may_cause,
    owner_in_doubt,
    owner_of,
    owner_since,
    rows_of,
)
from ckpt_events.participants.cli.report.roots import RootEnd
from ckpt_events.participants.cli.text import short_id
from ckpt_events.vocab import CollectionAction, Operation, Outcome

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.fold import Evidence, Fold, Trace
    from ckpt_events.participants.cli.report.overview import Run, RunRow

__all__ = ["ABORTED", "FAILED", "OPEN", "PUBLISHED", "RESTORED", "UNKNOWN", "judge"]

PUBLISHED: Final = "published"
RESTORED: Final = "restored"
ABORTED: Final = "aborted"
FAILED: Final = "failed"
OPEN: Final = "open at end of log"
#: A row whose root span's end was an event this version could not read (another version's
#: type or value), or a collection's checkpoint (restore) that ended without saying whether it
#: published (what it restored) and with no commit (restore) in its logs to say so: it ended,
#: how is not known; its causes say why.
UNKNOWN: Final = "outcome unknown"
#: Its first cause when a collection's checkpoint ended so (``_publish_unsaid``).
PUBLISH_UNSAID: Final = (
    "collection.checkpoint ended without saying whether it published (its published is not "
    "set) and no coordinate.commit or publish of it ended ok in the logs"
)
#: Its first cause when a collection's restore ended so (``_restore_unsaid``).
RESTORE_UNSAID: Final = (
    "collection.restore ended without saying what it restored (its rows are not set) and no "
    "coordinate.restore of it ended ok in the logs, nor every participant's restore"
)

#: Said after either when its trace holds other rows' roots too: their evidence is not its.
SHARED: Final = (
    " (its trace is shared with other rows, one traceparent given to each: only what ran under "
    "its own root by its end is its)"
)


def judge(
    run: Run,
    row: RunRow,
    fold: Fold,
    same_id: Sequence[RunRow],
    clocks_agree: bool,
    clocks: ClockEvidence | None = None,
    *,
    cut: bool = False,
    shared: bool = False,
) -> None:
    """Set ``row``'s end, pause, outcome and causes (or critical path) from what the fold kept;
    ``same_id``: the rows that carry its checkpoint id (``owner_of``); ``clocks_agree``: no
    participant of its traces answered outside the controller's call (``causes_of``);
    ``clocks``: what the calls prove of each participant's clock (``owner_in_doubt``);
    ``shared``: its trace holds other rows' roots too (``_unsaid``)."""
    mine = [fold.traces[t] for t in row.trace_ids if t in fold.traces]
    ends = [fold.root_finished[k] for k in row.roots if k in fold.root_finished]
    row.paused_span = _paused_span(mine)
    row.paused_ms = None if row.paused_span is None else (row.paused_span[1] - row.paused_span[0]) / 1e6
    if row.paused_span is None and mine and all(t.refused_prepares and not t.prepare_starts for t in mine):
        row.paused_ms = 0.0  # every prepare refused: it paused nobody (another held the fleet)
    events: list[CauseEvent] = []
    counts: list[int] = []
    # Each cause in doubt once, with how many events said it (copies, or events alike).
    doubtful: dict[str, int] = {}
    for e, trace, n in fold.causes.traced(row.checkpoint_id):
        if owner_in_doubt(candidates := rows_of(same_id, trace), e, clocks):
            if row in candidates and may_cause(e, row):
                # Said on each row it may be of, as such: never a cause given to the wrong one.
                (said,), _ = causes_of([], [e])
                said = (
                    f"{said}, of this {row.what} or another of {short_id(row.checkpoint_id)} "
                    f"({who_wrote(e)}'s "
                    "clock is not known to agree with the controller's)"
                )
                doubtful[said] = doubtful.get(said, 0) + n
        elif owner_of(same_id, e, trace) is row:
            events.append(e)
            counts.append(n)
    causes, aborted_by = causes_of([t.causes for t in mine], events, clocks_agree=clocks_agree, counts=counts)
    causes += [repeated(said, n) for said, n in doubtful.items()]
    unsaid = ""  # why it ended without saying what it did (``_publish_unsaid``, ``_restore_unsaid``)
    unread = [fold.ended_unknown[k][1] for k in row.roots if k in fold.ended_unknown]
    if unread and len(ends) + len(unread) == len(row.roots):
        # Its end was another version's event (a newer outcome, a type this one does not
        # know): it ended, with what is not read. Was "open at end of log", its spans "never
        # finished", and the cut or the processes blamed.
        row.outcome = UNKNOWN
        # When it ended was read: only how is not known.
        row.end_ns = max([f.end_ns for f in ends] + [u.end_ns for u in unread])
        causes = [f"its end was skipped: {unread[0].why}", *causes]
    elif len(ends) < len(row.roots):
        row.outcome = OPEN
        if row.logs_end_ns is None:
            row.logs_end_ns = run.last_ns
        causes += open_causes(
            (s for k, s in fold.started.items() if k[0] in row.trace_ids), row.logs_end_ns, cut=cut
        )
        row.end_ns = None
    else:
        end = row.end_ns = max(f.end_ns for f in ends)
        if any(f.outcome == Outcome.ERROR for f in ends):
            # The protocol's own aborts surface as the controller's error (not prepared, or a
            # commit refused after the lease): the abort is the outcome, not a failure.
            row.outcome = ABORTED if aborted_by else FAILED
        elif any(_not_done(f) for f in ends):
            row.outcome = ABORTED
        elif unsaid := _unsaid(row, fold, ends, mine, shared, end):
            # A user's own coordinator that never set ``published`` (``rows``): an ok end alone
            # read "published" ("restored") with its commit (restore) failed (TimeoutError) and
            # never finished anywhere.
            row.outcome = UNKNOWN
        elif row.coordinated and row.what == "checkpoint" and not _committed(ends):
            row.outcome = ABORTED
            causes = causes or ["prepared, never committed"]
        else:
            row.outcome = RESTORED if "restore" in row.what else PUBLISHED
        if not row.published:
            # A participant's operation its call ended without (its process killed mid-call):
            # the controller's error (a reset connection) follows from it, so it comes first.
            left = _left(fold, row.trace_ids, end, row if unsaid and shared else None)
            causes = unfinished_causes(left) + causes
        if unsaid:
            causes = [unsaid, *causes]  # why its outcome is not known comes first
    if row.what == "restore" and ends:
        _episodes_after_restore(row, ends)
    if row.published:
        longest = max(ends, key=lambda f: f.end_ns - f.start_ns)
        row.critical_path = fold.critical.get((longest.trace_id, longest.span_id), "")
        causes = []
        # Its own spans only: a trace shared with a restore (one traceparent) holds the restore's.
        row.never_finished = never_finished_line(
            s
            for k, s in fold.started.items()
            if k[0] in row.trace_ids and s.checkpoint_id in (None, row.checkpoint_id)
        )
    # Past the causes kept per checkpoint, the rest are counted (``causes.KEPT_CAUSES``).
    over = sum(
        n
        for (checkpoint_id, since, trace), n in fold.causes.over_since.items()
        if checkpoint_id == row.checkpoint_id and owner_since(same_id, since, trace) is row
    )
    row.causes = shown(causes, over if causes else 0)


def _paused_span(traces: Sequence[Trace]) -> tuple[int, int] | None:
    """(first participant's prepare, last one's resume) over ``traces`` (``None`` without both,
    with the resume before the prepare, or with fewer participants' prepares in the logs than a
    prepare that prepared called: its first may be the one missing)."""
    if any(t.members is not None and len(t.causes.prepares) < t.members for t in traces):
        return None
    firsts = [t.first_prepare_ns for t in traces if t.first_prepare_ns is not None]
    lasts = [t.last_resume_ns for t in traces if t.last_resume_ns is not None]
    return (min(firsts), max(lasts)) if firsts and lasts and max(lasts) >= min(firsts) else None


def _episodes_after_restore(row: RunRow, ends: Sequence[RootEnd]) -> None:
    collections = [f for f in ends if f.action == CollectionAction.RESTORE]
    if collections:
        rows = [f.rows for f in collections if f.rows is not None]
        restarts = [f.restarts for f in collections if f.restarts is not None]
        row.continued = sum(rows) if rows else None
        row.restarted = sum(restarts) if restarts else None
        return
    episodes = [f.episodes for f in ends if f.coordinated and f.episodes is not None]
    row.continued = sum(episodes) if episodes else None


def _committed(roots: Sequence[RootEnd]) -> bool:
    return any(f.operation == Operation.COMMIT for f in roots)


def _publish_unsaid(roots: Sequence[RootEnd], traces: Sequence[Trace | Evidence]) -> str:
    """``PUBLISH_UNSAID`` for a collection's checkpoint that ended without saying whether it
    published (``published`` never set: the project's controller always sets it, a user's own
    coordinator may not), and no ``coordinate.commit`` or ``publish`` of its traces ended ok:
    whether it published is not known. Else ``""``."""
    unsaid = any(f.action == CollectionAction.CHECKPOINT and f.published is None for f in roots)
    return PUBLISH_UNSAID if unsaid and not any(t.committed for t in traces) else ""


def _restore_unsaid(
    roots: Sequence[RootEnd], traces: Sequence[Trace | Evidence], left: Iterable[StartedSpan]
) -> str:
    """``RESTORE_UNSAID`` for a collection's restore that ended without saying what it restored
    (``rows`` never set: the project's controller always sets it, and ends in error when its
    restore failed; a user's own coordinator may catch that and end ok) with no evidence in its
    traces: no ``coordinate.restore`` ended ok, and its participants' restores did not all end
    ok (none did, or one failed or was ``left`` open, or a ``coordinate.restore`` failed: the
    project's coordinator undoes a restore that failed anywhere). Else ``""``."""
    unsaid = any(f.action == CollectionAction.RESTORE and f.rows is None for f in roots)
    if not unsaid or any(t.restore_ok for t in traces):
        return ""
    if any(t.restore_failed for t in traces) or not any(t.installed for t in traces):
        return RESTORE_UNSAID
    restores = (OperationStarted, CoordinateStarted)
    opened = any(isinstance(s, restores) and s.operation == Operation.RESTORE for s in left)
    return RESTORE_UNSAID if opened else ""


def _left(fold: Fold, trace_ids: set[int], end: int, row: RunRow | None = None) -> Iterator[StartedSpan]:
    """The spans of ``trace_ids`` started by ``end`` (a row's) and never finished; with ``row``
    (one that ended unsaid, its trace shared with other rows) those open under its own roots
    at its end (``Fold.own_evidence``): the others' are theirs."""
    if row is not None:
        return (s for e in _own(row, fold) for s in e.left)
    return (s for k, s in fold.started.items() if k[0] in trace_ids and s.start_ns <= end)


def _own(row: RunRow, fold: Fold) -> list[Evidence]:
    """The evidence under ``row``'s own roots (``Fold.own_evidence``)."""
    return [e for k in row.roots if (e := fold.own_evidence.get(k)) is not None]


def _unsaid(
    row: RunRow, fold: Fold, ends: Sequence[RootEnd], mine: Sequence[Trace], shared: bool, end: int
) -> str:
    """Why ``row`` (ended at ``end``) has an unknown outcome when it ended ok without saying what
    it did (``_publish_unsaid``, ``_restore_unsaid``), else ``""``. Its evidence is its traces',
    or with its trace ``shared`` with other rows' roots (one traceparent given to several
    collections: theirs are not its) what ran under its own roots by their end (``SHARED``)."""
    evidence: Sequence[Trace | Evidence] = _own(row, fold) if shared else mine
    left = _left(fold, row.trace_ids, end, row if shared else None)
    unsaid = _publish_unsaid(ends, evidence) or _restore_unsaid(ends, evidence, left)
    return f"{unsaid}{SHARED}" if unsaid and shared else unsaid


def _not_done(root: RootEnd) -> bool:
    """A root that ended without doing its work: a collection not published, a prepare not
    prepared."""
    return root.published is False or root.prepared is False
