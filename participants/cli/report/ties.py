"""Events that carry one stamp, in an order their lines' order cannot change.

A coarse clock (Windows' 15.6 ms, a VM's) gives many events one stamp, and a log merged from
several processes, or one read sorted after going back in time, holds them in any order: read
by (stamp, file, line) alone, a span's end read before its start and the report said "16 spans
never finished" for a checkpoint that finished. ``in_tie_order`` puts the events of each stamp
in nesting order, read from the spans' parent links: a span's start before its children's, its
end after theirs, a span open before the stamp closed before one opened at it; then by process
(its kind, instance and worker) and, within one, in file and line order: the only evidence of
the order of two events the links do not relate is their process's order of writing them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    StepFinished,
    StepStarted,
)

__all__ = ["Entry", "in_tie_order", "tie_ordered"]

#: The span events, a start and an end of each kind of span.
_STARTS: Final = (OperationStarted, StepStarted, CoordinateStarted, StageStarted, CollectionStarted)
_ENDS: Final = (OperationFinished, StepFinished, CoordinateFinished, StageFinished, CollectionFinished)

_SpanEvent = (
    OperationStarted
    | StepStarted
    | CoordinateStarted
    | StageStarted
    | CollectionStarted
    | OperationFinished
    | StepFinished
    | CoordinateFinished
    | StageFinished
    | CollectionFinished
)

#: (time, file, line, event), as the reader merges them.
Entry = tuple[int, int, int, CheckpointEvent]


@dataclass
class _Span:
    """A span with an event at the stamp: its start and end there, if any, and its children."""

    order: tuple[str, str, int, int, int]  # (kind, instance, worker, file, line): its first event's
    start: Entry | None = None
    end: Entry | None = None
    children: list[_Span] = field(default_factory=list)

    def key(self) -> tuple[bool, tuple[str, str, int, int, int]]:
        # Open before the stamp (no start here) first: it closed before a sibling opened.
        return (self.start is not None, self.order)


def _span_of(
    spans: dict[tuple[int, int], _Span], event: _SpanEvent, file: int, line: int
) -> tuple[tuple[int, int], _Span]:
    """``event``'s span (made at its first event, ordered by it) and its key."""
    key = (event.trace_id, event.span_id)
    return key, spans.setdefault(key, _Span((event.kind, event.instance, event.worker or -1, file, line)))


def tie_ordered(group: list[Entry]) -> list[Entry]:
    """The entries of one stamp (``group``, as read) in nesting order (see the module docstring)."""
    points: list[Entry] = []
    spans: dict[tuple[int, int], _Span] = {}
    parents: dict[tuple[int, int], tuple[int, int] | None] = {}
    copies = False  # an event read twice (a copy not yet dropped): the group is kept as read
    for entry in group:
        _, file, line, event = entry
        if isinstance(event, _STARTS):
            span_key, span = _span_of(spans, event, file, line)
            copies = copies or span.start is not None
            span.start = entry
        elif isinstance(event, _ENDS):
            span_key, span = _span_of(spans, event, file, line)
            copies = copies or span.end is not None
            span.end = entry
        else:
            points.append(entry)
            continue
        parent = event.parent_span_id
        parents[span_key] = None if parent is None else (event.trace_id, parent)
    if copies:
        return group
    roots: list[_Span] = []
    for span_key, span in spans.items():
        parent_key = parents[span_key]
        if parent_key is not None and parent_key in spans and parent_key != span_key:
            spans[parent_key].children.append(span)
        else:
            roots.append(span)
    out = points
    stack: list[tuple[_Span, bool]] = [(s, False) for s in sorted(roots, key=_Span.key, reverse=True)]
    # Bounded: each span is pushed at most twice (open, then close); a cycle of parent links
    # (a corrupt log) leaves its spans unvisited, and the group is then kept as read.
    while stack:
        span, closing = stack.pop()
        if closing:
            if span.end is not None:
                out.append(span.end)
            continue
        if span.start is not None:
            out.append(span.start)
        stack.append((span, True))
        stack.extend((c, False) for c in sorted(span.children, key=_Span.key, reverse=True))
    return out if len(out) == len(group) else group


def in_tie_order(entries: Iterator[Entry]) -> Iterator[Entry]:
    """``entries`` (in time order) with the entries of each stamp in nesting order (see the
    module docstring); an entry alone at its stamp passes straight through."""
    group: list[Entry] = []
    for entry in entries:
        if group and entry[0] != group[0][0]:
            if len(group) == 1:
                yield group[0]
            else:
                yield from tie_ordered(group)
            group = [entry]
        else:
            group.append(entry)
    if len(group) == 1:
        yield group[0]
    elif group:
        yield from tie_ordered(group)
