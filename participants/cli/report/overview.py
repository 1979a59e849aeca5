"""The run overview: one row per checkpoint and per restore, its outcome and, when it did not
publish, its cause in words naming the participant.

A row is a root span (a span whose parent is not in the logs): a collection checkpoint or
restore, or a coordinate operation run on its own. What a failure leaves in the log:

- ``lease_expired`` (participant, phase), timed from that participant's prepare;
- ``prepare_not_ready`` (participant, blocker count);
- ``refused`` (code, participant);
- a span with outcome ``error`` (participant, exception type);
- spans started and never finished: the checkpoint is open at the end of the log.

A restore names the checkpoint it restored: the collection restore carries that
checkpoint's id as its ``checkpoint_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ckpt_events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
)
from ckpt_events.participants.cli.report.logs import event_time
from ckpt_events.participants.cli.report.model import who_of
from ckpt_events.participants.cli.report.paths import dominant_step_ms
from ckpt_events.participants.cli.report.paths import dominated as dominated_by
from ckpt_events.participants.cli.report.paths import slowest as path_of
from ckpt_events.participants.cli.report.trends import Trends
from ckpt_events.participants.cli.words import counted
from ckpt_events.vocab import CollectionAction, Kind, Operation, Outcome

__all__ = ["Run", "RunRow", "episodes_text", "overview"]

PUBLISHED: Final = "published"
RESTORED: Final = "restored"
ABORTED: Final = "aborted"
FAILED: Final = "failed"
OPEN: Final = "open at end of log"
#: Causes shown per row; the rest are counted.
_CAUSES = 4


@dataclass
class RunRow:
    """One checkpoint or restore of the run."""

    what: str
    checkpoint_id: str | None
    start_ns: int
    end_ns: int | None = None
    outcome: str = OPEN
    causes: list[str] = field(default_factory=list)
    slowest: str = ""
    #: How long admission was closed: from the first participant's prepare to the last one's
    #: resume; ``None`` without both.
    paused_ms: float | None = None
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
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e6

    @property
    def published(self) -> bool:
        return self.outcome in (PUBLISHED, RESTORED)


@dataclass
class _Trace:
    """What one trace leaves after it streamed past: never its events."""

    #: Each participant's first prepare start, for "N s after its prepare".
    prepares: dict[str, int] = field(default_factory=dict)
    first_prepare_ns: int | None = None
    last_resume_ns: int | None = None
    #: (time, cause) of every span that ended in error.
    errors: list[tuple[int, str]] = field(default_factory=list)


_CAUSE_EVENTS = (LeaseExpired, PrepareNotReady, Refused)


@dataclass
class Run:
    """Every row in time order, folded from one streaming pass over the logs.

    Only summaries are kept: per trace its prepares, pause bounds and errors, per root its
    start and end events and its slowest path, the spans still open at the end, and the
    counted events that name a cause. A row's events (for its detail) are read again from
    the logs by ``events_of`` / ``details``, filtered by its trace ids and checkpoint id.
    """

    rows: list[RunRow]
    last_ns: int
    first_ns: int
    #: Events read in the first pass.
    count: int = 0
    again: Callable[[], Iterable[Any]] | None = None
    trends: Trends = field(default_factory=Trends)

    def details(self, rows: Sequence[RunRow]) -> dict[int, list[Any]]:
        """Each row's spans (its traces) and the events naming its checkpoint id, in time
        order, keyed by ``id(row)``: one more pass over the logs for all of them."""
        if self.again is None:
            raise RuntimeError("this run was folded from a one-shot stream: pass again= to overview()")
        by_trace: dict[int, list[list[Any]]] = {}
        by_checkpoint: dict[str, list[list[Any]]] = {}
        out: dict[int, list[Any]] = {}
        for row in rows:
            bucket: list[Any] = out.setdefault(id(row), [])
            for trace in row.trace_ids:
                by_trace.setdefault(trace, []).append(bucket)
            if row.checkpoint_id:
                by_checkpoint.setdefault(row.checkpoint_id, []).append(bucket)
        for e in self.again():
            trace_id = getattr(e, "trace_id", None)
            targets = by_checkpoint.get(e.checkpoint_id or "") if trace_id is None else by_trace.get(trace_id)
            for bucket in targets or ():
                bucket.append(e)
        for bucket in out.values():
            bucket.sort(key=event_time)
        return out

    def events_of(self, row: RunRow) -> list[Any]:
        """One row's events (see ``details``)."""
        return self.details([row])[id(row)]

    def all_events(self) -> list[Any]:
        """Every event of the logs, read again (for logs with no checkpoint to scope to)."""
        return [] if self.again is None else list(self.again())


def overview(events: Iterable[Any], *, again: Callable[[], Iterable[Any]] | None = None) -> Run:
    """Rows for every root span, in start order, with outcome, causes and slowest path.

    ``events`` is streamed once and folded; ``again`` gives the events anew for the detail
    of chosen rows (a list passed as ``events`` is its own ``again``)."""
    if again is None and isinstance(events, list | tuple):
        kept = events
        again = lambda: kept  # noqa: E731
    traces: dict[int, _Trace] = {}
    #: Spans started and not yet finished, by (trace id, span id).
    started: dict[tuple[int, int], Any] = {}
    #: Finished spans of each trace since its last root ended: the slowest path's input.
    pending: dict[int, list[Any]] = {}
    root_started: dict[tuple[int, int], Any] = {}
    root_finished: dict[tuple[int, int], Any] = {}
    slowest: dict[tuple[int, int], str] = {}
    dominated: dict[tuple[int, int], str] = {}
    dominant_ms: dict[tuple[int, int], float | None] = {}
    causes_by_checkpoint: dict[str, list[Any]] = {}
    trends = Trends()
    first_ns: int | None = None
    last_ns = 0
    count = 0
    for e in events:
        count += 1
        t = event_time(e)
        last_ns = max(last_ns, t)
        begin = getattr(e, "start_ns", None) or t
        first_ns = begin if first_ns is None else min(first_ns, begin)
        trace_id = getattr(e, "trace_id", None)
        if trace_id is None:
            if isinstance(e, _CAUSE_EVENTS):
                causes_by_checkpoint.setdefault(e.checkpoint_id or "", []).append(e)
            continue
        key = (trace_id, e.span_id)
        trace = traces.get(trace_id)
        if trace is None:
            trace = traces[trace_id] = _Trace()
        buffer = pending.setdefault(trace_id, [])
        candidate = isinstance(
            e, CollectionStarted | CollectionFinished | CoordinateStarted | CoordinateFinished
        )
        parent_seen = (
            (trace_id, e.parent_span_id) in started or any(f.span_id == e.parent_span_id for f in buffer)
            if candidate and e.parent_span_id is not None
            else False
        )
        if not hasattr(e, "end_ns"):
            started[key] = e
            if isinstance(e, OperationStarted) and e.operation is Operation.PREPARE:
                who = _who(e)
                trace.prepares.setdefault(who, e.start_ns)
                if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                    trace.first_prepare_ns = e.start_ns
            if candidate and not parent_seen:
                root_started[key] = e
            continue
        started.pop(key, None)
        if isinstance(e, OperationFinished) and e.operation is Operation.PREPARE:
            # Also from the finished span: an OTLP file holds no started events.
            who = _who(e)
            trace.prepares[who] = min(e.start_ns, trace.prepares.get(who, e.start_ns))
            if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                trace.first_prepare_ns = e.start_ns
        if (
            isinstance(e, OperationFinished)
            and e.operation is Operation.RESUME
            and (trace.last_resume_ns is None or e.end_ns > trace.last_resume_ns)
        ):
            trace.last_resume_ns = e.end_ns
        if e.outcome is Outcome.ERROR:
            name, kind = span_name_or_kind(e), e.error_type or "error"
            trace.errors.append((t, f"{name} failed on {_who(e)} ({kind}: {_clip(e.error_message)})"))
        buffer.append(e)
        if candidate and (key in root_started or not parent_seen):
            # A root ended: its trace's spans so far are its tree; fold and let them go.
            root_finished[key] = e
            slowest[key] = path_of(buffer, trace_id)
            if _what(e) == "restore":
                dominated[key] = dominated_by(buffer)
                dominant_ms[key] = dominant_step_ms(buffer)
            trends.add_trace(buffer, e)
            del pending[trace_id]
    rows = _rows(root_started, root_finished)
    run = Run(rows, last_ns, first_ns or 0, count, again, trends)
    checkpoints: dict[str, int] = {}
    for number, row in enumerate(rows, 1):
        _judge(run, row, traces, started, root_finished, slowest, causes_by_checkpoint)
        if row.what == "restore":
            # The restore carries the id of the checkpoint it restored (no event names a
            # separate source id): the last checkpoint row with that id before it.
            row.source_row = checkpoints.get(row.checkpoint_id or "")
            row.dominated = "; ".join(dominated[k] for k in row.roots if dominated.get(k))
            step_ms = [ms for k in row.roots if (ms := dominant_ms.get(k)) is not None]
            row.dominant_ms = max(step_ms) if step_ms else None
        elif row.checkpoint_id:
            checkpoints[row.checkpoint_id] = number
    trends.rows = rows
    return run


def _rows(
    root_started: dict[tuple[int, int], Any], root_finished: dict[tuple[int, int], Any]
) -> list[RunRow]:
    roots = [*root_started.values(), *(f for k, f in root_finished.items() if k not in root_started)]
    roots = [
        e
        for e in roots
        if not isinstance(e, CollectionStarted | CollectionFinished)
        or e.action in (CollectionAction.CHECKPOINT, CollectionAction.RESTORE)
    ]
    roots.sort(key=lambda e: e.start_ns)
    rows: list[RunRow] = []
    for e in roots:
        last = rows[-1] if rows else None
        coordinate = isinstance(e, CoordinateStarted | CoordinateFinished)
        if (
            coordinate
            and last is not None
            and last.coordinated
            and last.checkpoint_id == e.checkpoint_id
            and (e.operation is Operation.RESTORE) == (last.what == "restore")
        ):
            last.roots.append((e.trace_id, e.span_id))
            continue
        rows.append(
            RunRow(
                _what(e), e.checkpoint_id, e.start_ns, roots=[(e.trace_id, e.span_id)], coordinated=coordinate
            )
        )
    return rows


def _judge(
    run: Run,
    row: RunRow,
    traces: dict[int, _Trace],
    started: dict[tuple[int, int], Any],
    root_finished: dict[tuple[int, int], Any],
    slowest: dict[tuple[int, int], str],
    causes_by_checkpoint: dict[str, list[Any]],
) -> None:
    mine = [traces[t] for t in row.trace_ids if t in traces]
    ends = [root_finished[k] for k in row.roots if k in root_finished]
    prepares: dict[str, int] = {}
    for trace in mine:
        for who, at in trace.prepares.items():
            prepares[who] = min(at, prepares.get(who, at))
    firsts = [t.first_prepare_ns for t in mine if t.first_prepare_ns is not None]
    lasts = [t.last_resume_ns for t in mine if t.last_resume_ns is not None]
    row.paused_ms = (
        (max(lasts) - min(firsts)) / 1e6 if firsts and lasts and max(lasts) >= min(firsts) else None
    )
    timed: list[tuple[int, str]] = [c for trace in mine for c in trace.errors]
    aborted_by = False  # a participant not ready at the deadline, or a lease that ran out
    for e in causes_by_checkpoint.get(row.checkpoint_id or "", []) if row.checkpoint_id else []:
        match e:
            case LeaseExpired():
                since = e.time_ns - prepares[_who(e)] if _who(e) in prepares else None
                after = "" if since is None else f", {since / 1e9:.1f} s after its prepare"
                timed.append((e.time_ns, f"lease expired on {_who(e)} in phase {e.phase.value}{after}"))
                aborted_by = True
            case PrepareNotReady():
                blocked = f"not ready at its deadline: {_who(e)} blocked by {counted(e.blockers, 'episode')}"
                timed.append((e.time_ns, blocked))
                aborted_by = True
            case Refused():
                timed.append((e.time_ns, f"refused ({e.code.value}) by {_who(e)}"))
    timed.sort(key=lambda c: c[0])
    causes = [c for _, c in timed]
    if len(ends) < len(row.roots):
        row.outcome = OPEN
        traces_of = row.trace_ids
        open_spans = sorted((s for k, s in started.items() if k[0] in traces_of), key=lambda s: s.start_ns)
        silent = sorted({_who(s) for s in open_spans if isinstance(s, OperationStarted)})
        for s in open_spans[:_CAUSES]:
            age_ms = (run.last_ns - s.start_ns) / 1e6
            causes.append(f"{span_name_or_kind(s)} on {_who(s)} still open, {age_ms:.1f} ms")
        if len(open_spans) > _CAUSES:
            causes.append(f"... {len(open_spans) - _CAUSES} more open spans")
        if silent:
            causes.append("never answered: " + ", ".join(silent))
        row.end_ns = None
    else:
        row.end_ns = max(f.end_ns for f in ends)
        if any(f.outcome is Outcome.ERROR for f in ends):
            # The protocol's own aborts surface as the controller's error (not prepared, or a
            # commit refused after the lease): the abort is the outcome, not a failure.
            row.outcome = ABORTED if aborted_by else FAILED
        elif any(
            getattr(f, "published", None) is False or getattr(f, "prepared", None) is False for f in ends
        ):
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
        row.slowest = slowest.get((longest.trace_id, longest.span_id), "")
        causes = []
    more = [f"... and {len(causes) - _CAUSES} more"] if len(causes) > _CAUSES else []
    row.causes = causes[:_CAUSES] + more


def episodes_text(continued: int | None, restarted: int | None) -> str:
    """Words for episodes continued and restarted after a restore (``""`` if neither known)."""
    parts = []
    if continued is not None:
        parts.append(f"{continued:,} episode{'' if continued == 1 else 's'} continued from their boundary")
    if restarted is not None:
        parts.append(f"{restarted:,} restarted from scratch")
    return ", ".join(parts)


def _episodes_after_restore(row: RunRow, ends: Sequence[Any]) -> None:
    collections = [
        f for f in ends if isinstance(f, CollectionFinished) and f.action is CollectionAction.RESTORE
    ]
    if collections:
        rows = [f.rows for f in collections if f.rows is not None]
        restarts = [f.restarts for f in collections if f.restarts is not None]
        row.continued = sum(rows) if rows else None
        row.restarted = sum(restarts) if restarts else None
        return
    episodes = [f.episodes for f in ends if isinstance(f, CoordinateFinished) and f.episodes is not None]
    row.continued = sum(episodes) if episodes else None


def _who(e: Any) -> str:
    return "controller" if e.kind == Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def _what(root: Any) -> str:
    if isinstance(root, CollectionStarted | CollectionFinished):
        return str(root.action.value)
    return "restore" if root.operation is Operation.RESTORE else "checkpoint"


def _committed(roots: Sequence[Any]) -> bool:
    return any(getattr(f, "operation", None) is Operation.COMMIT for f in roots)


def span_name_or_kind(e: Any) -> str:
    for attr in ("operation", "step", "stage", "action"):
        if (value := getattr(e, attr, None)) is not None:
            return str(value.value)
    return type(e).__name__


def _clip(text: str | None, most: int = 60) -> str:
    text = text or ""
    return text if len(text) <= most else text[: most - 1] + "…"
