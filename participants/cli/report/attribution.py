"""Where one checkpoint's (or restore's) time went: ``attribute`` sweeps the root's time of a
span tree (``model``'s ``trace_spans``) once and gives every instant to exactly one part, by
priority:

1. a participant's handler (its operation span);
2. queued inside a participant (request arrived, ``received_ns``, handler not yet started),
   also before the root when the root is a participant's own operation (``queued_alone``): the
   sweep then begins at its request's arrival;
3. transit, request on its way: from the calling controller span's start to the
   participant's ``received_ns``;
4. transit, replies and waiting: the rest of a controller span that calls participants (a
   stage, a fanned-out coordinate operation) with no handler running;
5. controller: inside a named controller span that calls nobody (publishing the collection
   record, ``coordinate.prepare`` between its stages), named by the deepest such span;
6. unattributed: covered by the root span only; when the root is a participant's own operation
   (a user's server with no controller: nothing called it that the logs hold), its time outside
   its steps is its handler's, never unattributed.

A trace with several top-level spans (two requests that came with one caller's ``traceparent``,
the caller in no log given) is swept over what its waterfall draws (``drawn_extent``): from the
first one's arrival to the last one's end. Each top-level span counts as the root does for its own
descendants, and a participant's handler running wins an instant over another request's wait; an
instant in none of them is ``between top-level operations``, never a participant's.

The parts add up to the swept time exactly. Nothing here draws.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from ckpt_events.participants.cli.report.model import Span, drawn_extent, queued_alone, waited
from ckpt_events.participants.cli.words import milliseconds

__all__ = [
    "Attribution",
    "attribute",
    "naming_root",
]

HANDLERS = "participants' handlers"
QUEUED = "queued in participants"
TRANSIT = "transit"
CONTROLLER = "controller"
UNATTRIBUTED = "unattributed"
BETWEEN = "between top-level operations"
#: The root's own time loses every instant to any other part (``attribute``'s item 6).
_LAST: Final = 100


@dataclass(frozen=True)
class Attribution:
    """Where one root span's time went, in milliseconds; ``parts`` names each piece."""

    root: str
    total_ms: float
    handlers_ms: float
    transit_ms: float
    controller_ms: float
    unattributed_ms: float
    parts: dict[str, float]
    max_loop_lag_ms: float | None
    #: The root span's checkpoint id (a restore's: the checkpoint it restored).
    checkpoint_id: str | None = None
    #: True when the trace holds a controller's span; False for a participant's own operation
    #: (a user's server, no controller), whose line names no controller or transit it never had.
    coordinated: bool = True
    #: Why where its time went is unknown (``None``: it is known): a participant's operation sits
    #: outside the controller's call it answered, by stamps a clock stepped between.
    unknown: str | None = None
    #: How many top-level spans the trace holds, and the time in none of them when several.
    roots: int = 1
    between_ms: float = 0.0
    #: False when a top-level span's duration is unknown (its clock went back during it): the
    #: sweep's end is then no end, and ``total_ms`` no total.
    total_known: bool = True

    @property
    def unattributed_share(self) -> float:
        return self.unattributed_ms / self.total_ms if self.total_ms else 0.0

    def top_parts(self, most: int = 8) -> list[tuple[str, float]]:
        """The largest named parts (at least 1% of the total), largest first."""
        floor = self.total_ms / 100
        return [(name, ms) for name, ms in self.parts.items() if ms > 0 and ms >= floor][:most]

    def line(self) -> str:
        """``N ms total, M ms in participants' handlers, K ms transit/queue, L ms controller, U ms
        unattributed (S%)``; for a trace with no controller's span, ``N ms total, M ms in
        participants' handlers`` (and the time queued, if any) and that it has no controller. With
        several top-level spans, the time in none of them (``G ms between them``)."""
        # Said only when there is such time, as the time queued: several that overlap have none.
        between = ""
        if self.roots > 1 and self.between_ms > 0:
            # Without a controller the parenthesis names them: "between them" there.
            them = f"its {self.roots} top-level spans" if self.coordinated else "them"
            between = f", {milliseconds(self.between_ms)} between {them}"
        if not self.total_known:
            return f"total unknown: {self.unknown}"
        if self.unknown is not None:
            return f"{milliseconds(self.total_ms)} total; where it went unknown: {self.unknown}"
        if not self.coordinated:
            queued = f", {milliseconds(self.transit_ms)} queued" if self.transit_ms > 0 else ""
            whose = "a participant's own operation"
            if self.roots > 1:
                whose = f"{self.roots} top-level operations of participants"
            return (
                f"{milliseconds(self.total_ms)} total, {milliseconds(self.handlers_ms)} in participants' "
                f"handlers{queued}{between} ({whose}: no controller's span in its trace)"
            )
        # A share of a zero total is no figure: left out rather than printed as 0.0%.
        share = f" ({self.unattributed_share:.1%})" if self.total_ms > 0 else ""
        return (
            f"{milliseconds(self.total_ms)} total, "
            f"{milliseconds(self.handlers_ms)} in participants' handlers, "
            f"{milliseconds(self.transit_ms)} transit/queue, "
            f"{milliseconds(self.controller_ms)} controller, "
            f"{milliseconds(self.unattributed_ms)} unattributed{share}{between}"
        )

    def parts_line(self) -> str:
        """The named parts and the worst event-loop lag, ``; `` between them, each only when it
        has something to say (``""`` when neither has): the parts of a trace with no controller
        are the line's own, so only its lag is said."""
        said = []
        if self.coordinated and self.unknown is None and (parts := self.top_parts()):
            said.append(", ".join(f"{name} {milliseconds(ms)}" for name, ms in parts))
        if self.max_loop_lag_ms is not None:
            said.append(f"worst participant event-loop lag {milliseconds(self.max_loop_lag_ms)}")
        return "; ".join(said)


def _piece_labels(
    intervals: list[tuple[int, str, int, int]], cuts: list[int], lo: int, hi: int
) -> Iterator[str | None]:
    """The label of each piece between ``cuts`` (the covering interval of the lowest priority
    number, ``None`` where none covers it): an interval covers a piece when it holds its middle.

    A sweep: an interval cut to the root covers the piece (a, b) when its start is at or
    before a and its end at or after b. The pieces scanned every interval each: 5,000
    participants in one checkpoint took 34 s (quadratic); a heap of the open ones, emptied
    lazily, takes each in and out once. A root whose end is before its start (its clock went
    back) cuts every stamp to its start: its one piece is scanned."""
    if lo > hi:
        for a, b in itertools.pairwise(cuts):
            mid = (a + b) / 2
            covering = [(p, label) for p, label, s, e in intervals if s <= mid < e]
            yield min(covering)[1] if covering else None
        return
    opens: dict[int, list[tuple[int, str]]] = {}
    closes: dict[int, list[tuple[int, str]]] = {}
    for p, label, began, ended in intervals:
        start = max(lo, min(hi, began))
        end = max(lo, min(hi, ended))
        if start < end:
            opens.setdefault(start, []).append((p, label))
            closes.setdefault(end, []).append((p, label))
    active: dict[tuple[int, str], int] = {}
    heap: list[tuple[int, str]] = []
    for a, _ in itertools.pairwise(cuts):
        for key in closes.get(a, ()):
            active[key] -= 1
        for key in opens.get(a, ()):
            active[key] = active.get(key, 0) + 1
            heapq.heappush(heap, key)
        while heap and not active[heap[0]]:
            heapq.heappop(heap)
        yield heap[0][1] if heap else None


def naming_root(roots: list[Span]) -> Span:
    """The top-level span (of a trace's ``roots``) that names the trace: the longest."""
    return max(roots, key=lambda s: s.end_ns - s.start_ns)


def attribute(spans: list[Span]) -> Attribution | None:
    """Sweep the root's time into parts (``naming_root`` names it); with several top-level
    spans, the time their waterfall draws (``drawn_extent``); ``None`` without spans."""
    roots = [s for s in spans if s.depth == 0]
    if not roots:
        return None
    root = naming_root(roots)
    lo, hi = root.start_ns, root.end_ns
    by_id = {s.span_id: s for s in spans}
    # (priority, label, start, end): a lower priority number wins an instant.
    intervals: list[tuple[int, str, int, int]] = []
    if (queued := queued_alone(root)) is not None:
        # A participant's root operation waited from its request's arrival: that wait was outside
        # the sweep (150 ms behind a slow middleware, a 23.8 ms restore said nothing of it).
        lo = queued[0]
        intervals.append((2, QUEUED, *queued))
    if len(roots) > 1:
        # The line swept the longest one alone while the waterfall drew them all: two sequential
        # restores read '22.2 ms total' over a 'waterfall (69.4 ms)'.
        lo, hi = drawn_extent(spans)
        intervals = _top_level(spans)
    called = _called_waits(spans, by_id)
    for s in spans:
        if s.depth == 0:
            continue
        if s.participant:
            holes = sorted(called.get(id(s), []))
            intervals.extend((1, HANDLERS, a, b) for a, b in _minus((s.start_ns, s.end_ns), holes))
            if (wait := waited(s)) is not None:
                intervals.append((2, QUEUED, *wait))
            parent = by_id.get(s.parent_span_id or -1)
            if s.received_ns is not None and parent is not None and parent.client:
                label = f"{TRANSIT}: request on its way ({parent.short})"
                intervals.append((3, label, parent.start_ns, s.received_ns))
        elif s.client:
            intervals.append((4, f"{TRANSIT}: replies and waiting ({s.short})", s.start_ns, s.end_ns))
        else:
            intervals.append((5 + 32 - min(s.depth, 32), f"{CONTROLLER} ({s.short})", s.start_ns, s.end_ns))
    unknown = _outside_call(spans, by_id)
    # A root of unknown duration ends at its start: its total read '0 ms' beside a 5.5 ms waterfall.
    unsure = next((r for r in roots if not r.known), None)
    if unsure is not None:
        unknown = f"{unsure.who}'s {unsure.short}: its duration unknown (its clock went back during it)"
    cuts = sorted({lo, hi, *(max(lo, min(hi, t)) for _, _, a, b in intervals for t in (a, b))})
    # Whole nanoseconds, made milliseconds once: a float sum of the pieces drifted off the
    # total's own figure (27 500 ns in three pieces read 0.027499999999999997 ms, printed
    # 0.027 ms of handlers beside 0.028 ms total for one and the same time).
    parts_ns: dict[str, int] = {}
    # A participant's operation at the root ran its handler all along: its time outside its
    # steps was read as unattributed (55.6 ms restore, no steps: 100% unattributed).
    uncovered = BETWEEN if len(roots) > 1 else HANDLERS if root.participant else UNATTRIBUTED
    for (a, b), covered in zip(itertools.pairwise(cuts), _piece_labels(intervals, cuts, lo, hi), strict=True):
        label = uncovered if covered is None else covered
        parts_ns[label] = parts_ns.get(label, 0) + (b - a)
    parts = {label: ns / 1e6 for label, ns in parts_ns.items()}

    def total(*prefixes: str) -> float:
        return sum(ns for k, ns in parts_ns.items() if k.startswith(prefixes)) / 1e6

    lags = [s.loop_lag_ms for s in spans if s.loop_lag_ms is not None]
    return Attribution(
        root=root.short,
        total_ms=(hi - lo) / 1e6,
        handlers_ms=total(HANDLERS),
        transit_ms=total(QUEUED, TRANSIT),
        controller_ms=total(CONTROLLER),
        unattributed_ms=total(UNATTRIBUTED),
        parts=dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        max_loop_lag_ms=max(lags) if lags else None,
        checkpoint_id=root.checkpoint_id,
        coordinated=not all(s.participant for s in spans),
        unknown=unknown,
        roots=len(roots),
        between_ms=total(BETWEEN),
        total_known=unsure is None,
    )


def _top_level(spans: list[Span]) -> list[tuple[int, str, int, int]]:
    """The intervals of each top-level span of ``spans`` as a root of its own: its request's wait
    (``queued_alone``) queued; a controller's unattributed and a participant's its handler's, at
    the lowest priority. A participant's handler outside its own descendants' waits and transits
    wins over another request's wait: it was running then (three overlapping restores' handlers
    read 30.3 ms of a waterfall that drew one running for 33 ms)."""
    by_id = {s.span_id: s for s in spans}
    # Each span's top-level ancestor, parents first (a parent is one level up).
    top: dict[int, Span] = {}
    below: dict[int, list[Span]] = {}
    for s in sorted(spans, key=lambda s: s.depth):
        parent = by_id.get(s.parent_span_id or -1)
        ancestor = s if s.depth == 0 else None if parent is None else top.get(id(parent))
        if ancestor is not None:
            top[id(s)] = ancestor
            if ancestor is not s:
                below.setdefault(id(ancestor), []).append(s)
    out: list[tuple[int, str, int, int]] = []
    for root in (s for s in spans if s.depth == 0):
        if (queued := queued_alone(root)) is not None:
            out.append((2, QUEUED, *queued))
        out.append((_LAST, HANDLERS if root.participant else UNATTRIBUTED, root.start_ns, root.end_ns))
        if root.participant:
            holes = sorted(_waits(below.get(id(root), []), by_id))
            out.extend((1, HANDLERS, a, b) for a, b in _minus((root.start_ns, root.end_ns), holes))
    return out


def _called_waits(spans: list[Span], by_id: dict[int, Span]) -> dict[int, list[tuple[int, int]]]:
    """The waits (arrival, start) of participants' operations called by another participant, by
    ``id`` of each participant's span under the root above them: its handler awaited them (a judge's
    step calling a store held 30 ms by a middleware read 47.3 ms of handlers, 0 of the store's
    wait, drawn all the same). Walks up from each wait; none under a controller's calls."""
    out: dict[int, list[tuple[int, int]]] = {}
    for s in spans:
        if (wait := waited(s)) is None:
            continue
        seen = {s.span_id}
        up = by_id.get(s.parent_span_id or -1)
        # Bounded by the spans (parent ids may loop: each span is visited once).
        while up is not None and up.depth > 0 and up.participant and up.span_id not in seen:
            seen.add(up.span_id)
            out.setdefault(id(up), []).append(wait)
            up = by_id.get(up.parent_span_id or -1)
    return out


def _waits(below: list[Span], by_id: dict[int, Span]) -> Iterator[tuple[int, int]]:
    """The time of ``below`` that is not a handler: participants' waits, transits, controllers."""
    for s in below:
        if s.participant:
            if (wait := waited(s)) is not None:
                yield wait
            parent = by_id.get(s.parent_span_id or -1)
            if s.received_ns is not None and parent is not None and parent.client:
                yield parent.start_ns, s.received_ns
        else:
            yield s.start_ns, s.end_ns


def _minus(whole: tuple[int, int], holes: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The stretches of ``whole`` outside every one of ``holes`` (sorted by start)."""
    at, end = whole
    for a, b in holes:
        if a > at:
            yield at, min(a, end)
        at = max(at, b)
        if at >= end:
            return
    if at < end:
        yield at, end


#: A participant's operation this far (ns) outside the call it answered, as the report's clocks
#: were aligned, was stamped by a clock that stepped (``clocks``: aligned, each fits its call).
_OUTSIDE_SLACK_NS: Final = 1_000_000


def _outside_call(spans: list[Span], by_id: dict[int, Span]) -> str | None:
    """Why the sweep of ``spans`` says nothing true, if it does not: a participant's operation
    outside the controller's call it answered. Was: resources-0's prepare, stamped an hour back,
    left its call's 4.0 ms as "transit: replies and waiting", its handler's 1.7 ms in none."""
    for s in spans:
        parent = by_id.get(s.parent_span_id or -1)
        if parent is not None and (said := _outside_caller(s, parent)) is not None:
            return said
        if not (s.participant and parent is not None and parent.client):
            continue
        # A call that ended in error bounds no answer's end: the controller gave up on it.
        late = 0 if parent.error else s.end_ns - parent.end_ns
        off = max(parent.start_ns - s.start_ns, late)
        if off > _OUTSIDE_SLACK_NS:
            return (
                f"{s.who}'s {s.short} sits {off / 1e6:,.1f} ms outside the controller's {parent.short} "
                "it answered (a clock that stepped?)"
            )
    return None


def _outside_caller(s: Span, parent: Span) -> str | None:
    """Why the sweep says nothing true when ``s``, a participant's operation (its arrival, else
    its start, to its end), sits outside ``parent``'s, another participant process's that called
    it: no controller's call bounds their clocks (``clocks``), so their clocks are apart, and
    where its wait and handler went in its caller's time is unknown. Was: a store 50 ms behind its
    judge read '41.7 ms in participants' handlers, 3.1 ms queued', its 32 ms wait a handler's."""
    if not (s.participant and parent.participant and parent.who != s.who):
        return None
    began = s.start_ns if s.received_ns is None else min(s.received_ns, s.start_ns)
    # A caller that failed may have given up on it (a timeout), one of unknown duration has no
    # end (its clock went back): its end bounds nothing.
    late = 0 if parent.error or not parent.known else s.end_ns - parent.end_ns
    off = max(parent.start_ns - began, late)
    if off <= _OUTSIDE_SLACK_NS:
        return None
    return (
        f"{s.who}'s {s.short} sits {off / 1e6:,.1f} ms outside {parent.who}'s {parent.short} that "
        "called it (the two processes' clocks apart: nothing in the logs aligns them)"
    )
