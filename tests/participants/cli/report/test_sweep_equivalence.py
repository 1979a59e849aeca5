"""The attribution sweep (a heap of open intervals) and the critical-path walk (one index per
node) against the scans they replaced, kept here as they were: on random span trees (overlaps,
zero-length spans, spans outside the root, equal stamps, unknown durations) every part and
every section is the same."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ckpt_events.participants.cli.report.attribution import (
    BETWEEN,
    CONTROLLER,
    HANDLERS,
    QUEUED,
    TRANSIT,
    UNATTRIBUTED,
    attribute,
)
from ckpt_events.participants.cli.report.model import Span, drawn_extent
from ckpt_events.participants.cli.report.paths import S, Section, _tree, _unknown_duration, _walk


def _called(caller: Span, spans: list[Span], by_id: dict[int, Span], mid: float) -> bool:
    """Whether a participant's operation that ``caller`` (a participant's, under the root) called,
    itself or through other participants' spans under the root, waits in its server at ``mid``."""
    for s in spans:
        if not (s.participant and s.received_ns is not None and s.received_ns <= mid < s.start_ns):
            continue
        up = by_id.get(s.parent_span_id or -1)
        for _ in range(len(spans)):  # up the participants' spans under the root
            if up is None or up.depth == 0 or not up.participant or up is caller:
                break
            up = by_id.get(up.parent_span_id or -1)
        if up is caller:
            return True
    return False


def _waiting(root: Span, spans: list[Span], by_id: dict[int, Span], mid: float) -> bool:
    """Whether a descendant of ``root`` waits, is in transit or is a controller's at ``mid``."""
    for s in spans:
        up = s
        for _ in range(len(spans)):  # up the parents to ``s``'s top-level span
            if up.depth == 0:
                break
            parent = by_id.get(up.parent_span_id or -1)
            if parent is None:
                break
            up = parent
        if s is root or up is not root:
            continue
        parent = by_id.get(s.parent_span_id or -1)
        if not s.participant:
            waits = [(s.start_ns, s.end_ns)]
        elif s.received_ns is None:
            waits = []
        else:
            waits = [(s.received_ns, s.start_ns)]
            if parent is not None and parent.client:
                waits.append((parent.start_ns, s.received_ns))
        if any(a <= mid < b for a, b in waits):
            return True
    return False


def _old_parts(spans: list[Span]) -> dict[str, float]:
    """``attribute``'s parts as its scan of every interval per cut made them (before ffb5fbb);
    with several top-level spans, as the rules of ``attribute`` say, scanned the same way."""
    root = max((s for s in spans if s.depth == 0), key=lambda s: s.end_ns - s.start_ns)
    lo, hi = root.start_ns, root.end_ns
    by_id = {s.span_id: s for s in spans}
    intervals: list[tuple[int, str, int, int]] = []
    if root.participant and root.known and root.received_ns is not None and root.received_ns < lo:
        # A participant's root operation's own wait, from its arrival (added after the sweep).
        intervals.append((2, QUEUED, root.received_ns, lo))
        lo = root.received_ns
    roots = [s for s in spans if s.depth == 0]
    if len(roots) > 1:
        # Several top-level spans: the time their waterfall draws, each a root of its own.
        lo, hi = drawn_extent(spans)
        intervals = []
        for r in roots:
            if r.participant and r.known and r.received_ns is not None and r.received_ns < r.start_ns:
                intervals.append((2, QUEUED, r.received_ns, r.start_ns))
            intervals.append((100, HANDLERS if r.participant else UNATTRIBUTED, r.start_ns, r.end_ns))
    for s in spans:
        if s.depth == 0:
            continue
        if s.participant:
            if s.received_ns is not None and s.received_ns < s.start_ns:
                intervals.append((2, QUEUED, s.received_ns, s.start_ns))
            parent = by_id.get(s.parent_span_id or -1)
            if s.received_ns is not None and parent is not None and parent.client:
                label = f"{TRANSIT}: request on its way ({parent.short})"
                intervals.append((3, label, parent.start_ns, s.received_ns))
        elif s.client:
            intervals.append((4, f"{TRANSIT}: replies and waiting ({s.short})", s.start_ns, s.end_ns))
        else:
            intervals.append((5 + 32 - min(s.depth, 32), f"{CONTROLLER} ({s.short})", s.start_ns, s.end_ns))
    # Every handler's and every wait's stamps cut too (the handlers are covered at each piece).
    stamps = [t for _, _, a, b in intervals for t in (a, b)]
    stamps += [
        t for s in spans if s.participant for t in (s.start_ns, s.end_ns, s.received_ns) if t is not None
    ]
    cuts = sorted({lo, hi, *(max(lo, min(hi, t)) for t in stamps)})
    parts_ns: dict[str, int] = {}
    uncovered = BETWEEN if len(roots) > 1 else HANDLERS if root.participant else UNATTRIBUTED
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        covering = [(p, label) for p, label, s, e in intervals if s <= mid < e]
        # A participant's handler runs where no participant it called (in turn) waits.
        covering += [
            (1, HANDLERS)
            for s in spans
            if s.depth > 0
            and s.participant
            and s.start_ns <= mid < s.end_ns
            and not _called(s, spans, by_id, mid)
        ]
        if len(roots) > 1:
            # A participant's top-level handler runs where none of its own descendants waits.
            covering += [
                (1, HANDLERS)
                for r in roots
                if r.participant and r.start_ns <= mid < r.end_ns and not _waiting(r, spans, by_id, mid)
            ]
        label = min(covering)[1] if covering else uncovered
        parts_ns[label] = parts_ns.get(label, 0) + (b - a)
    parts = {label: ns / 1e6 for label, ns in parts_ns.items()}
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))  # as ``attribute`` orders them


# paths._walk as it scanned the children from the first on every return (before ffb5fbb).
def _old_walk(spans: Iterable[S]) -> tuple[list[Section[S]], S | None]:
    """The critical path's sections, latest first, and the span of unknown duration where the
    walk had to stop (``None``: the path is whole)."""
    root, children = _tree(spans)
    if root is None:
        return [], None
    if _unknown_duration(root):
        return [], root
    # Each span's time cut to its parent's, top down; what falls outside is dropped. A child
    # of unknown duration that started before its parent ended may have ended any time until
    # the parent did: kept apart, it stops the walk where the walk reaches its parent.
    bounds: dict[int, tuple[int, int]] = {root.span_id: (root.start_ns, root.end_ns)}
    parent_of: dict[int, S] = {}
    kids: dict[int, list[S]] = {}
    unsure: dict[int, S] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        lo, hi = bounds[node.span_id]
        inside = []
        for child in children.get(node.span_id, []):
            if child.span_id in bounds or child.start_ns >= hi:
                continue
            if _unknown_duration(child):
                unsure.setdefault(node.span_id, child)
                continue
            if child.end_ns <= lo:
                continue
            bounds[child.span_id] = (max(lo, child.start_ns), min(hi, child.end_ns))
            parent_of[child.span_id] = node
            inside.append(child)
        kids[node.span_id] = sorted(inside, key=lambda c: bounds[c.span_id][1], reverse=True)
        todo.extend(inside)
    out: list[Section[S]] = []
    entered = {root.span_id}
    node, returning = root, None  # returning: the start of the child just walked back from
    for _ in range(2 * len(bounds) + 1):  # each span is entered once and left once
        if returning is None and (stop := unsure.get(node.span_id)) is not None:
            return out, stop
        lo, hi = bounds[node.span_id]
        top = hi if returning is None else returning
        # A sibling that ended the instant the next one started counts as before it (Jaeger
        # asks for strictly before, and would skip a stage ending exactly at the next's start).
        candidates = [
            c for c in kids[node.span_id] if bounds[c.span_id][1] <= top and c.span_id not in entered
        ]
        last = candidates[0] if candidates else None
        if last is not None:
            entered.add(last.span_id)
            if bounds[last.span_id][1] < top:
                out.append(Section(node, bounds[last.span_id][1], top))
            node, returning = last, None
            continue
        if lo < top:
            out.append(Section(node, lo, top))
        if node is root:
            break
        node, returning = parent_of[node.span_id], lo
    return out, None


@st.composite
def _trees(draw: st.DrawFn) -> list[Span]:
    """Up to 24 spans in one tree (a parent drawn among the earlier, or none: another root or a
    lost parent) over stamps 0-20: equal stamps, zero-length, reversed (unknown) and outside
    their parent's or the root's time are all common."""
    count = draw(st.integers(1, 24))
    spans: list[Span] = []
    depth: dict[int, int] = {}
    for i in range(count):
        span_id = i + 1
        parent = draw(st.one_of(st.none(), st.integers(1, span_id))) if i else None
        if parent == span_id:
            parent = 99  # a parent not in the trace
        depth[span_id] = depth[parent] + 1 if parent in depth else 0
        start = draw(st.integers(0, 20))
        end = draw(st.integers(0, 20))
        known = end >= start or draw(st.booleans())
        spans.append(
            Span(
                name=draw(st.sampled_from(["a", "b", "c"])),
                who=draw(st.sampled_from(["controller", "agent", "model"])),
                start_ns=start,
                end_ns=end if known or end >= start else start,
                depth=depth[span_id],
                error=False,
                span_id=span_id,
                parent_span_id=parent,
                client=draw(st.booleans()),
                received_ns=draw(st.one_of(st.none(), st.integers(0, 20))),
                known=known,
            )
        )
    return spans


def _reversed_root() -> list[Span]:
    """A root whose end is before its start (its clock went back), over a controller span that
    covers its one piece: the first sweep cut that span to nothing (``unattributed``)."""
    root = Span(name="a", who="controller", start_ns=1, end_ns=0, depth=0, error=False, span_id=1)
    child = Span(
        name="a", who="controller", start_ns=0, end_ns=1, depth=1, error=False, span_id=2, parent_span_id=1
    )
    return [root, child]


# Derandomized: every run checks the same 400 trees (a CI run is reproducible), plus the
# examples that once told the two apart.
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(_trees())
@example(_reversed_root())
def test_the_sweep_attributes_as_the_scan_did(spans: list[Span]) -> None:
    """Every part's figure and order as the scan of every interval per cut made them."""
    attribution = attribute(spans)
    assert attribution is not None
    assert attribution.parts == _old_parts(spans)
    assert list(attribution.parts) == list(_old_parts(spans))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(_trees())
def test_the_walk_takes_the_path_the_scan_took(spans: list[Span]) -> None:
    """The same sections in the same order, and the same span where the walk stops."""
    assert _walk(spans) == _old_walk(spans)
