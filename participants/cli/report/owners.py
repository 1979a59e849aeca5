"""Which row of the run overview a counted event belongs to, when several rows carry its
checkpoint id (a restore and its checkpoint, or a second run that reused the id, appended to the
same log).

It belongs to the row whose trace holds the latest operation its participant started naming
that id before it, both stamped by the participant's own clock (``causes.OwnOperations``);
without one, to the latest of them that started at or before it and could have caused it (a
prepare not ready, or a lease that expired in a checkpoint's phase, is a checkpoint's; one in
phase ``restored`` a restore's), so one run's cause is never said of another (``owner_of``).
When the participant's clock is not known to agree with the controller's, which row is said
unknown (``owner_in_doubt``), never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ckpt_events import LeaseExpired, PrepareNotReady
from ckpt_events.participants.cli.report.clocks import ClockEvidence, process_of
from ckpt_events.participants.cli.report.events import PointEvent
from ckpt_events.vocab import Kind, Phase

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import RunRow

__all__ = ["may_cause", "owner_in_doubt", "owner_of", "owner_since", "row_of", "rows_by_id", "rows_of"]


def rows_by_id(rows: Iterable[RunRow]) -> dict[str, list[RunRow]]:
    """The rows that carry each checkpoint id, in start order."""
    out: dict[str, list[RunRow]] = {}
    for row in sorted(rows, key=lambda r: r.start_ns):
        if row.checkpoint_id:
            out.setdefault(row.checkpoint_id, []).append(row)
    return out


def owner_of(same_id: Sequence[RunRow], event: PointEvent, trace: int | None) -> RunRow | None:
    """Of the rows that carry ``event``'s checkpoint id (in start order), the one it belongs to:
    the row of ``trace`` (``causes.OwnOperations``, by its participant's own clock), else by
    time (``row_of``); among several rows that share ``trace`` (one ``traceparent`` given to a
    checkpoint and its restore), by time."""
    rows = rows_of(same_id, trace)
    return rows[0] if len(rows) == 1 else row_of(rows, event.time_ns, event)


def owner_since(same_id: Sequence[RunRow], since: int | None, trace: int | None) -> RunRow | None:
    """The row a counted event past ``causes.KEPT_CAUSES`` is counted on: its ``trace``'s, else
    the latest started by ``since`` (``owner_of``)."""
    rows = rows_of(same_id, trace)
    return rows[0] if len(rows) == 1 else row_of(rows, since)


def rows_of(same_id: Sequence[RunRow], trace: int | None) -> Sequence[RunRow]:
    """The rows a counted event of ``trace`` may be of: those that hold its trace, else all of
    ``same_id`` (its trace unknown, or no row's)."""
    traced = [row for row in same_id if trace is not None and trace in row.trace_ids]
    return traced or same_id


def owner_in_doubt(same_id: Sequence[RunRow], e: PointEvent, clocks: ClockEvidence | None) -> bool:
    """Whether the time rule (``row_of``) cannot tell which of several rows (``rows_of``) a
    participant's counted event belongs to: no call bounds its clock, or the shifts the calls
    allow put it after different rows' starts (a clock minutes ahead whose calls all failed is
    bounded below only). Without ``clocks``, never."""
    fits = [r for r in same_id if may_cause(e, r)]
    if clocks is None or e.kind == Kind.CONTROLLER or len(fits) < 2:
        return False
    bounds = clocks.bounds(process_of(e))
    if bounds is None:
        return True
    low, high = bounds
    # Its stamp on the controller's clock lies in [time + low, time + high].
    latest = fits[-1] if high is None else row_of(same_id, e.time_ns + high, e)
    return row_of(same_id, e.time_ns + low, e) is not latest


def row_of(same_id: Sequence[RunRow], time_ns: int | None, event: PointEvent | None = None) -> RunRow | None:
    """Of the rows that carry one checkpoint id (in start order), the one a counted ``event``
    at ``time_ns`` belongs to: the latest that started at or before it among those it could be
    a cause of (the first of them when it came before all); ``None`` without rows."""
    fits = [r for r in same_id if may_cause(event, r)] or list(same_id)
    if not fits:
        return None
    owner = fits[0]
    for row in fits:
        if time_ns is not None and row.start_ns <= time_ns:
            owner = row
    return owner


def may_cause(event: PointEvent | None, row: RunRow) -> bool:
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
