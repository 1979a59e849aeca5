"""The report's model: one checkpoint's (or restore's) spans as a tree, read from its events.

``trace_spans`` flattens one trace into ``Span`` rows, children under their parents in
start order, with every field of each event kept for hover details (the critical path is
``paths``', where the time went ``attribution``'s). ``drawn_extent`` is the time a waterfall of
them draws; ``queued_alone``, ``queued_on_row`` and ``waited`` the waits in a participant's server
before its handler began. Nothing here draws.

A span's duration is read from one clock, its own process's (``events.duration_ns``): never
from two processes' stamps. When that clock went back during the span (its end stamped before its
start), its duration is unknown: the span is drawn as an instant and never as a negative time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    Event,
    OperationFinished,
    StageFinished,
    StepFinished,
)
from ckpt_events.participants.cli.report.events import FinishedSpan, duration_ns, who_wrote
from ckpt_events.vocab import (
    CollectionAction,
    Operation,
    Outcome,
    SpanKind,
    span_kind_of,
    span_name,
    span_name_of,
)

__all__ = [
    "OUTSIDE_BAR",
    "Span",
    "checkpoint_and_restore",
    "drawn_extent",
    "finished_spans",
    "outside",
    "queued_alone",
    "queued_on_row",
    "trace_spans",
    "waited",
]

#: Participants record no span for renew, but its events say how long each handler took.
_RENEW_NAME = span_name(Operation.RENEW.value)


@dataclass(frozen=True)
class Span:
    """A finished span, flattened for drawing: ``depth`` under the root, ``details`` every field."""

    name: str
    who: str
    start_ns: int
    end_ns: int
    depth: int
    error: bool
    span_id: int = 0
    parent_span_id: int | None = None
    client: bool = False
    received_ns: int | None = None
    loop_lag_ms: float | None = None
    #: Every field of its event, for hover details: the JSON edge, so values of any type.
    details: dict[str, Any] = field(default_factory=dict)
    #: False when the process's clock went back during the span: ``end_ns`` is then its start
    #: and ``ms`` 0, its duration unknown (drawn as ``?``, never as a number).
    known: bool = True
    checkpoint_id: str | None = None
    #: The worker process of a multi-worker participant that wrote it (``who`` ends ``/w<i>``).
    worker: int | None = None

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def short(self) -> str:
        """The name without the ``gym.checkpoint.`` prefix."""
        return self.name.removeprefix("gym.checkpoint.")

    @property
    def participant(self) -> bool:
        return self.who != "controller"


def finished_spans(events: Iterable[Event]) -> list[FinishedSpan]:
    """Every ``*Finished`` event: each closes a span (a participant's renew records none, but
    its events say how long the handler took)."""
    out: list[FinishedSpan] = []
    for e in events:
        match e:
            case (
                OperationFinished()
                | StepFinished()
                | CoordinateFinished()
                | StageFinished()
                | CollectionFinished()
            ):
                out.append(e)
    return out


def checkpoint_and_restore(events: Iterable[Event]) -> tuple[int | None, int | None]:
    """Trace ids of the last collection checkpoint and the last restore (coordinate spans when
    no collection ran; without a checkpoint's, the last trace other than the restore's);
    ``None`` where there is none, never one trace as both. With no controller's root at all
    (participants' spans alone: a user's own server), the last trace, as the restore when a
    participant's restore is its root, else as the checkpoint."""
    finished = finished_spans(events)

    def last(action: CollectionAction, operation: Operation) -> int | None:
        roots: list[CollectionFinished | CoordinateFinished] = [
            e for e in finished if isinstance(e, CollectionFinished) and e.action == action
        ]
        if not roots:
            roots = [e for e in finished if isinstance(e, CoordinateFinished) and e.operation == operation]
        return roots[-1].trace_id if roots else None

    checkpoint = last(CollectionAction.CHECKPOINT, Operation.COMMIT)
    restore = last(CollectionAction.RESTORE, Operation.RESTORE)
    if checkpoint is None and restore is None and finished:
        trace = finished[-1].trace_id
        # A participant's restore with no controller above it was drawn and named as a
        # "checkpoint c1 (restore)", and the restore section never appeared.
        if _root_operation(finished, trace) == Operation.RESTORE:
            return None, trace
        return trace, None
    if checkpoint is None:
        # The last trace that is not the restore's: a restore row's detail (its trace alone)
        # was drawn twice, as "checkpoint" and as "restore", with its breakdown said twice.
        checkpoint = next((e.trace_id for e in reversed(finished) if e.trace_id != restore), None)
    return checkpoint, restore


def _root_operation(finished: list[FinishedSpan], trace_id: int) -> str | None:
    """The operation of the participant's span at the root of ``trace_id`` (its parent not in
    the trace), the last to finish of several; ``None`` when no participant's operation is one."""
    spans = [e for e in finished if e.trace_id == trace_id]
    ids = {e.span_id for e in spans}
    roots = [
        e
        for e in spans
        if isinstance(e, OperationFinished) and (e.parent_span_id not in ids or e.parent_span_id == e.span_id)
    ]
    return str(roots[-1].operation) if roots else None


def _details(event: FinishedSpan) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(event).__name__}
    for name, value in msgspec.structs.asdict(event).items():
        if value is None or name == "attributes":
            continue
        if name in ("trace_id", "span_id", "parent_span_id"):
            out[name] = f"{value:0{32 if name == 'trace_id' else 16}x}"
        else:
            out[name] = str(value) if isinstance(value, enum.Enum) else value
    out.update(event.attributes or {})
    length = duration_ns(event)
    out["duration_ms"] = (
        round(length / 1e6, 3)
        if length is not None
        else f"unknown: the clock went back {(event.start_ns - event.end_ns) / 1e6:,.1f} ms during it"
    )
    return out


def trace_spans(events: Iterable[Event], trace_id: int) -> list[Span]:
    """The spans of one trace, each child right under its parent, siblings in start order.
    A span whose parent id is its own, or not in the trace, is a root; where parent ids loop
    (no span of the loop without a parent), the loop's earliest span is drawn as a root."""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    ids = {e.span_id for e in chosen}
    children: dict[int | None, list[FinishedSpan]] = {}
    for e in chosen:
        parent = e.parent_span_id if e.parent_span_id in ids and e.parent_span_id != e.span_id else None
        children.setdefault(parent, []).append(e)
    out: list[Span] = []
    drawn: set[int] = set()  # id() of the events drawn
    roots = sorted(children.get(None, []), key=_start)
    # A span's copies (one log repeated, each copy an event of its own) share an id: each copy
    # has all the copies' children, so they were sorted and stacked once per copy, n^2 (1,000
    # copies of a 131-line log: minutes). Each parent id's children are sorted once, and a
    # frame is a place in that list, stepping over the spans drawn since, as popping them did.
    below_of: dict[int, _Below] = {}
    # Each round draws at least one span (a loop's earliest when no root is left), so at most
    # one round per span: a loop of parent ids once ended the report in a traceback.
    for _ in range(len(chosen)):
        if not roots:
            roots = sorted((e for e in chosen if id(e) not in drawn), key=_start)[:1]
            if not roots:
                break
        # Depth-first with an explicit stack of (children, how many are left, depth): bounded by
        # the number of events, never recursive.
        stack: list[tuple[_Below, int, int]] = [(_Below(roots[::-1]), len(roots), 0)]
        roots = []
        while stack and len(out) <= len(chosen):
            below, left, depth = stack[-1]
            at = below.undrawn(left - 1, drawn)
            if at < 0:
                stack.pop()
                continue
            stack[-1] = (below, at, depth)
            e = below.spans[at]
            drawn.add(id(e))
            out.append(_span(e, depth))
            if (mine := below_of.get(e.span_id)) is None:
                mine = below_of[e.span_id] = _Below(
                    sorted(children.get(e.span_id, []), key=_start, reverse=True)
                )
            stack.append((mine, len(mine.spans), depth + 1))
    return out


class _Below:
    """One parent id's children, latest start first (popped from the end), and a way past the
    ones already drawn: each position links to one below it, shortened as it is walked."""

    __slots__ = ("skip", "spans")

    def __init__(self, spans: list[FinishedSpan]) -> None:
        self.spans = spans
        self.skip = list(range(-1, len(spans) - 1))  # a drawn span's position: where to look next

    def undrawn(self, at: int, drawn: set[int]) -> int:
        """The highest position at or below ``at`` whose span is not in ``drawn`` (``id()``s), -1 if none."""
        spans, skip = self.spans, self.skip
        walked = []
        while at >= 0 and id(spans[at]) in drawn:
            walked.append(at)
            at = skip[at]
        for passed in walked:  # drawn stays drawn: the next walk jumps straight here
            skip[passed] = at
        return at


#: A waterfall's bar for a span outside its root's time (``outside``).
OUTSIDE_BAR: Final = "outside the checkpoint's time: not drawn"


def drawn_extent(spans: list[Span]) -> tuple[int, int]:
    """The time a waterfall of ``spans`` draws: its roots' own (start, end), else, with a root of
    unknown duration or none, every span's. A span stamped by a clock that stepped sits outside
    it: every span's scaled a 55 ms checkpoint's axis to an hour (3,600,043.4 ms). A root that
    queued (``queued_alone``) is drawn from its request's arrival."""
    roots = [s for s in spans if s.depth == 0]
    if not roots or not all(s.known for s in roots):
        roots = spans
    return min(_arrived(s) for s in roots), max(s.end_ns for s in roots)


def queued_alone(span: Span) -> tuple[int, int] | None:
    """(arrival, start) of a participant's operation drawn at the root of its trace (no caller in
    the logs: a user's own server, or a caller whose log was not given) that waited in its server
    before its handler began; ``None`` when it did not, its arrival is unknown (``received_ns``
    absent: unknown, never 0) or its duration is. Under a controller's call, the call draws it."""
    return waited(span) if span.depth == 0 and span.known else None


def queued_on_row(span: Span, parent: Span | None) -> tuple[int, int] | None:
    """(arrival, start) of a participant's wait in its server that its own row draws, before its
    operation's bar: at the root (``queued_alone``), or called by another participant (a user's
    judge whose restore calls a store with its ``traceparent``), whose wait ``attribute`` counts
    as queued all the same. ``None`` under a controller's call (the call's row draws it with its
    transits), without a wait, or with its arrival unknown."""
    if parent is None or span.depth == 0:
        return queued_alone(span)
    return None if parent.client else waited(span)


def waited(span: Span) -> tuple[int, int] | None:
    """(arrival, start) of a participant's operation whose request waited in its server before it
    began; ``None`` when it did not, or its arrival is unknown (``received_ns`` absent)."""
    if span.participant and span.received_ns is not None and span.received_ns < span.start_ns:
        return span.received_ns, span.start_ns
    return None


def _arrived(span: Span) -> int:
    """When ``span``'s time begins on a waterfall: its request's arrival if it queued alone."""
    queued = queued_alone(span)
    return span.start_ns if queued is None else queued[0]


def outside(span: Span, extent: tuple[int, int]) -> bool:
    """Whether ``span`` sticks out of ``extent`` (``drawn_extent``) by more than a tenth of it
    (at least 1 ms: processes' clocks aligned by their calls still differ by microseconds)."""
    slack = max(1_000_000, (extent[1] - extent[0]) // 10)
    return span.start_ns < extent[0] - slack or span.end_ns > extent[1] + slack


def _start(e: FinishedSpan) -> tuple[int, int]:
    return (e.start_ns, -_end(e))


def _end(e: FinishedSpan) -> int:
    """The end by the span's own clock: its start plus its duration (its start if unknown)."""
    return e.start_ns + (duration_ns(e) or 0)


def _span(e: FinishedSpan, depth: int) -> Span:
    match e:
        case OperationFinished(received_ns=received_ns, loop_lag_ms=loop_lag_ms):
            pass
        case _:
            received_ns = None
            loop_lag_ms = None
    return Span(
        name=span_name_of(e) or _RENEW_NAME,
        who=who_wrote(e),
        start_ns=e.start_ns,
        end_ns=_end(e),
        depth=depth,
        error=e.outcome == Outcome.ERROR,
        span_id=e.span_id,
        parent_span_id=e.parent_span_id,
        client=span_kind_of(e) is SpanKind.CLIENT,
        received_ns=received_ns,
        loop_lag_ms=loop_lag_ms,
        details=_details(e),
        known=duration_ns(e) is not None,
        checkpoint_id=e.checkpoint_id,
        worker=e.worker,
    )
