"""The run overview: one row per checkpoint and per restore, its outcome and, when it did not
publish, its cause in words naming the participant.

A row is a root span (a span whose parent is not in the logs): a collection checkpoint or
restore, or a coordinate operation run on its own. What a failure leaves in the log:

- ``lease_expired`` (participant, phase), timed from that participant's prepare;
- ``prepare_not_ready`` (participant, blocker count);
- ``refused`` (code, participant);
- a controller span that records whose calls failed and how (``FAILURES_ATTRIBUTE``: a
  refusal before the body is read, a wrong token, names no checkpoint on the participant's
  side; the controller knows which checkpoint it was for);
- a span with outcome ``error`` (participant, the error's name and message); a controller span
  whose error only follows from a failure below it (a child that failed, or a prepare not
  ready) is not a cause of its own, unless nothing else is named;
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
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.logs import event_time
from ckpt_events.participants.cli.report.model import duration_ns, who_of
from ckpt_events.participants.cli.report.paths import dominant_step_ms
from ckpt_events.participants.cli.report.paths import dominated as dominated_by
from ckpt_events.participants.cli.report.paths import path_line as path_of
from ckpt_events.participants.cli.report.trends import Trends
from ckpt_events.participants.cli.words import clipped, counted
from ckpt_events.participants.controller.types import FAILURES_ATTRIBUTE, MemberFailure, read_failures
from ckpt_events.participants.errors import HTTP_STATUS
from ckpt_events.vocab import CollectionAction, Kind, Operation, Outcome

__all__ = ["Run", "RunRow", "episodes_text", "overview"]

PUBLISHED: Final = "published"
RESTORED: Final = "restored"
ABORTED: Final = "aborted"
FAILED: Final = "failed"
OPEN: Final = "open at end of log"
#: Causes shown per row; the rest are counted.
_CAUSES = 4
#: A cause's error message is cut (at a word) past this many characters.
_MESSAGE = 160


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
    #: resume, stamps of several processes on the callers' clock (``clocks``); ``None``
    #: without both, or when a participant's clock is not proven on it (``pause_unknown``).
    paused_ms: float | None = None
    pause_unknown: bool = False
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

    #: Each participant's first prepare start, for "N s after its prepare".
    prepares: dict[str, int] = field(default_factory=dict)
    first_prepare_ns: int | None = None
    last_resume_ns: int | None = None
    #: A resume of unknown duration (its clock went back during it): its end is unknown.
    resume_unknown: bool = False
    #: Every span that ended in error.
    errors: list[_Error] = field(default_factory=list)
    #: Spans with a failure below them: a child that ended in error or a prepare not ready.
    failed_below: set[int] = field(default_factory=set)
    #: ``prepare stopped at stage environment``: each coordinate.prepare that was not prepared
    #: (said only when nothing names why: the participants' logs are not all in).
    stops: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Error:
    """A span that ended in error: when, where in its trace, and what it says."""

    time_ns: int
    span_id: int
    who: str
    operation: str
    #: ``prepare failed on agent/agent-0 (...)``: the span's own error in words.
    said: str
    #: Whose calls failed and how, as the controller recorded them on this span.
    members: list[MemberFailure]


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


def overview(
    events: Iterable[Any],
    *,
    again: Callable[[], Iterable[Any]] | None = None,
    clocks: ClockEvidence | None = None,
) -> Run:
    """Rows for every root span, in start order, with outcome, causes and slowest path.

    ``events`` is streamed once and folded; ``again`` gives the events anew for the detail
    of chosen rows (a list passed as ``events`` is its own ``again``). ``clocks``, filled by
    the same stream (``LogProblems.clocks``), names the traces where a participant answered
    outside the controller's call: their pause is unknown."""
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
    # The controller's own first and last stamps: the logs' time when a participant's clock
    # fits no one shift (its stamps would stretch it).
    controller_first: int | None = None
    controller_last = 0
    count = 0
    for e in events:
        count += 1
        t = event_time(e)
        last_ns = max(last_ns, t)
        begin = getattr(e, "start_ns", None) or t
        first_ns = begin if first_ns is None else min(first_ns, begin)
        if e.kind == Kind.CONTROLLER:
            controller_last = max(controller_last, t)
            controller_first = begin if controller_first is None else min(controller_first, begin)
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
            if isinstance(e, OperationStarted) and e.operation == Operation.PREPARE:
                who = _who(e)
                trace.prepares.setdefault(who, e.start_ns)
                if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                    trace.first_prepare_ns = e.start_ns
            if candidate and not parent_seen:
                root_started[key] = e
            continue
        started.pop(key, None)
        if isinstance(e, OperationFinished) and e.operation == Operation.PREPARE:
            # Also from the finished span: an OTLP file holds no started events.
            who = _who(e)
            trace.prepares[who] = min(e.start_ns, trace.prepares.get(who, e.start_ns))
            if trace.first_prepare_ns is None or e.start_ns < trace.first_prepare_ns:
                trace.first_prepare_ns = e.start_ns
        if isinstance(e, OperationFinished) and e.operation == Operation.RESUME:
            # Its end by its own clock: its start plus its duration.
            length = duration_ns(e)
            trace.resume_unknown |= length is None
            end = e.start_ns + (length or 0)
            if trace.last_resume_ns is None or end > trace.last_resume_ns:
                trace.last_resume_ns = end
        if e.outcome == Outcome.ERROR:
            trace.errors.append(_error(e, t))
        if e.parent_span_id is not None and (
            e.outcome == Outcome.ERROR or getattr(e, "prepared", None) is False
        ):
            trace.failed_below.add(e.parent_span_id)
        if getattr(e, "prepared", None) is False:
            trace.stops.append(
                f"prepare stopped at stage {getattr(e, 'stopped_at', None) or '?'}, not prepared"
            )
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
    if clocks is not None and clocks.unaligned() and controller_first is not None:
        first_ns, last_ns = controller_first, controller_last
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
    outside = clocks.outside if clocks is not None else set()
    for row in rows:
        if row.trace_ids & outside or any(traces[t].resume_unknown for t in row.trace_ids if t in traces):
            row.paused_ms, row.pause_unknown = None, True
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
    timed, recorded, following = _span_causes(mine)
    aborted_by = False  # a participant not ready at the deadline, or a lease that ran out
    for e in causes_by_checkpoint.get(row.checkpoint_id or "", []) if row.checkpoint_id else []:
        match e:
            case LeaseExpired():
                since = e.time_ns - prepares[_who(e)] if _who(e) in prepares else None
                after = "" if since is None else f", {since / 1e9:.1f} s after its prepare"
                timed.append((e.time_ns, f"lease expired on {_who(e)} in phase {e.phase}{after}"))
                aborted_by = True
            case PrepareNotReady():
                blocked = f"not ready at its deadline: {_who(e)} blocked by {counted(e.blockers, 'episode')}"
                timed.append((e.time_ns, blocked))
                aborted_by = True
            case Refused():
                status = HTTP_STATUS.get(e.code)
                refused = f"{_who(e)} refused: {e.code}" + ("" if status is None else f" ({status})")
                # The controller's record of the same refusal says more (its detail, when).
                if not any(c.startswith(refused) for c in recorded):
                    timed.append((e.time_ns, refused))
    # A controller error that only follows from a failure below it is said when nothing else is.
    timed.sort(key=lambda c: c[0])
    causes = [c for _, c in timed] or following
    if len(ends) < len(row.roots):
        row.outcome = OPEN
        traces_of = row.trace_ids
        open_spans = sorted((s for k, s in started.items() if k[0] in traces_of), key=lambda s: s.start_ns)
        silent = sorted({_who(s) for s in open_spans if isinstance(s, OperationStarted)})
        for s in open_spans[:_CAUSES]:
            age_ms = (run.last_ns - s.start_ns) / 1e6
            causes.append(f"{span_name_or_kind(s)} on {_who(s)} still open, {age_ms:.1f} ms")
        if len(open_spans) > _CAUSES:
            causes.append(f"... {counted(len(open_spans) - _CAUSES, 'more open span')}")
        if silent:
            causes.append("never answered: " + ", ".join(silent))
        row.end_ns = None
    else:
        row.end_ns = max(f.end_ns for f in ends)
        if any(f.outcome == Outcome.ERROR for f in ends):
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
        parts.append(f"{counted(continued, 'episode')} continued from their boundary")
    if restarted is not None:
        parts.append(f"{restarted:,} restarted from scratch")
    return ", ".join(parts)


def _episodes_after_restore(row: RunRow, ends: Sequence[Any]) -> None:
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


def _who(e: Any) -> str:
    return "controller" if e.kind == Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def _what(root: Any) -> str:
    if isinstance(root, CollectionStarted | CollectionFinished):
        return str(root.action)
    return "restore" if root.operation == Operation.RESTORE else "checkpoint"


def _committed(roots: Sequence[Any]) -> bool:
    return any(getattr(f, "operation", None) == Operation.COMMIT for f in roots)


def span_name_or_kind(e: Any) -> str:
    for attr in ("operation", "step", "stage", "action"):
        if (value := getattr(e, attr, None)) is not None:
            # A stage (and a user's own step) is a plain name; the protocol's are enums.
            name = str(getattr(value, "value", value))
            return f"prepare stage {name}" if attr == "stage" else name
    return type(e).__name__


def _error(e: Any, t: int) -> _Error:
    """What a span that ended in error says: its error's name (not its module path; a
    refusal's code is the start of its message) and message, cut at a word."""
    name = (e.error_type or "error").rsplit(".", 1)[-1]
    message = e.error_message or ""
    what = message if name == "ProtocolRefusal" and message else f"{name}: {message}" if message else name
    said = f"{span_name_or_kind(e)} failed on {_who(e)} ({clipped(what, _MESSAGE)})"
    members = read_failures((e.attributes or {}).get(FAILURES_ATTRIBUTE))
    return _Error(t, e.span_id, _who(e), _operation_of(e), said, members)


def _operation_of(e: Any) -> str:
    if getattr(e, "stage", None) is not None:
        return Operation.PREPARE.value  # a stage of coordinate.prepare
    return span_name_or_kind(e)


def _span_causes(traces: Sequence[_Trace]) -> tuple[list[tuple[int, str]], list[str], list[str]]:
    """(time, cause) of the spans that failed in ``traces``, the causes the controller recorded
    (one per member and what it said, with every operation it said it in), and the errors of
    controller spans that only follow from a failure below them."""
    timed: list[tuple[int, str]] = []
    following: list[str] = []
    # (who, said) -> (first time, operations): a refusal at prepare and again at the resume
    # after the abort is one cause.
    recorded: dict[tuple[str, str], tuple[int, list[str]]] = {}
    for trace in traces:
        for error in trace.errors:
            for m in error.members:
                key = (who_of(m.kind, m.instance, None), m.said)
                at, operations = recorded.setdefault(key, (error.time_ns, []))
                recorded[key] = (min(at, error.time_ns), operations)
                if error.operation not in operations:
                    operations.append(error.operation)
    # A participant's failed operation that the controller recorded is said once, by the record
    # (its code and HTTP status; the participant's message is its detail).
    named = {(who, operation) for (who, _), (_, operations) in recorded.items() for operation in operations}
    for trace in traces:
        for error in trace.errors:
            if error.members or (error.who, error.operation) in named:
                continue
            if error.who == "controller" and error.span_id in trace.failed_below:
                following.append(error.said)
            else:
                timed.append((error.time_ns, error.said))
    following = following or [stop for trace in traces for stop in trace.stops]
    said = []
    for (who, what), (at, operations) in recorded.items():
        cause = f"{who} {clipped(what, _MESSAGE)} (at {' and '.join(operations)})"
        timed.append((at, cause))
        said.append(cause)
    return timed, said, following
