"""A waterfall's rows for a wide fleet: a stage's parallel calls folded to the slowest.

Under one parent, the participants' spans of one operation on one kind (sixteen environment
servers' ``prepare``) are a group. A group of more than ``FOLD_AT`` calls keeps its slowest
call (and the one on the critical path, when that is another), each with its steps, and one
``Folded`` row sums up the rest: how many, when the first started and the last ended, their
median and longest. A checkpoint across 64 participants is then a few rows per stage, not 64.
A failed call (its own span or one of its steps failed) is drawn too, the first
``FAILED_DRAWN`` of a group by start, so every output names who failed and how; the rest are
counted on the ``Folded`` row (``k more failed``).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Final

from ckpt_events.participants.cli.report.cancels import is_cancelled
from ckpt_events.participants.cli.report.model import Span

__all__ = ["FAILED_DRAWN", "FOLD_AT", "Folded", "Row", "error_type", "waterfall_rows"]

#: A group of at most this many parallel calls is drawn whole.
FOLD_AT: Final = 3
#: A group's failed calls drawn beside its slowest (the first by start); more are counted.
FAILED_DRAWN: Final = 8


@dataclass(frozen=True)
class Folded:
    """The calls of one group not drawn: ``count`` of operation ``name`` on ``kind``."""

    name: str
    kind: str
    depth: int
    count: int
    start_ns: int
    end_ns: int
    median_ms: float
    max_ms: float
    #: The calls not drawn that failed (their own span or one of their steps), but not those
    #: whose every failed span was cancelled (``cancels.is_cancelled``): those are ``cancelled``.
    errors: int
    #: Failed calls of the group drawn above (``FAILED_DRAWN``): ``errors`` are the more.
    errors_drawn: int = 0
    #: The calls not drawn, by span id (their subtrees hidden with them).
    span_ids: frozenset[int] = field(default=frozenset(), repr=False, compare=False)
    #: The calls not drawn that were cancelled (their span or a step), and failed no other way.
    cancelled: int = 0
    #: Cancelled calls of the group drawn above: ``cancelled`` are the more.
    cancelled_drawn: int = 0

    @property
    def label(self) -> str:
        """``+15 more prepare on environment``."""
        return f"+{self.count} more {self.name} on {self.kind}"

    @property
    def summary(self) -> str:
        """``median 5.2 ms, longest 8.9 ms`` (and the errors and cancellations among them, if any)."""
        said = f"median {self.median_ms:.1f} ms, longest {self.max_ms:.1f} ms"
        return said + (f", {self.failed}" if self.errors or self.cancelled else "")

    @property
    def failed(self) -> str:
        """``2 failed``, or ``5 more failed`` when some of the group's failed calls are drawn;
        ``1 cancelled`` (``1 more cancelled``) apart, after them."""
        said = []
        if self.errors:
            said.append(f"{self.errors:,} more failed" if self.errors_drawn else f"{self.errors:,} failed")
        if self.cancelled:
            more = "more " if self.cancelled_drawn else ""
            said.append(f"{self.cancelled:,} {more}cancelled")
        return ", ".join(said)


def error_type(s: Span) -> str | None:
    """A failed span's exception type (``RuntimeError``), ``error`` when its event named none;
    ``None`` when it did not fail."""
    if not s.error:
        return None
    said = s.details.get("error_type")
    return str(said) if said else "error"


Row = Span | Folded


def _kind(s: Span) -> str:
    return s.who.split("/", 1)[0]


def waterfall_rows(spans: Sequence[Span], critical: Collection[int] = ()) -> list[Row]:
    """``spans`` (one trace's, parents before children, as ``model.trace_spans`` gives them) with
    each large group of parallel calls folded: the slowest call and the one on the ``critical``
    path (span ids) stay, and the first ``FAILED_DRAWN`` failed calls, with their subtrees, and
    a ``Folded`` row follows the last of them.
    A span of depth 0 is a root, whatever its parent id (a loop's, drawn as one)."""
    ids = {s.span_id for s in spans}
    children: dict[int | None, list[Span]] = {}
    parent_of: dict[int, int] = {}
    for s in spans:
        drawn_under = s.depth and s.parent_span_id in ids and s.parent_span_id != s.span_id
        parent = s.parent_span_id if drawn_under else None
        children.setdefault(parent, []).append(s)
        if parent is not None:
            parent_of[s.span_id] = parent
    # A call failed when its span or a span under it did (an ok prepare whose step failed);
    # it was cancelled when each of those was cancelled, and failed otherwise.
    failed: set[int] = set()
    not_cancelled: set[int] = set()
    for s in spans:
        if not s.error:
            continue
        for marked in [failed] if is_cancelled(error_type(s)) else [failed, not_cancelled]:
            at: int | None = s.span_id
            while at is not None and at not in marked and len(marked) <= len(spans):
                marked.add(at)
                at = parent_of.get(at)
    cancelled = failed - not_cancelled
    out: list[Row] = []
    # One parent's level, by its span id (``None``: the roots), built once: a span's copies (one
    # log repeated, each copy an event of its own) share an id, so each copy's children are all
    # the copies' children, and a level built per copy took n^2 (1,000 copies of a 23-line log:
    # 36 s). The same level is then drawn under each copy, as it was.
    levels: dict[int | None, list[Row]] = {}

    def level(parent: int | None) -> list[Row]:
        rows = levels.get(parent)
        if rows is None:
            rows = levels[parent] = _level(children.get(parent, []), critical, failed, cancelled)
        return rows

    # Depth-first with an explicit stack of (level, next row), children in start order; a Folded
    # row follows the last call kept from its group, so it follows that call's subtree. A frame
    # is a position in a shared level, not a copy of it: pushing a copy cost its length again.
    stack: list[tuple[list[Row], int]] = [(level(None), 0)]
    while stack and len(out) <= 2 * len(spans):
        rows, at = stack[-1]
        if at == len(rows):
            stack.pop()
            continue
        stack[-1] = (rows, at + 1)
        row = rows[at]
        out.append(row)
        if isinstance(row, Span):
            stack.append((level(row.span_id), 0))
    return out


def _level(
    siblings: list[Span], critical: Collection[int], failed: Collection[int], cancelled: Collection[int]
) -> list[Row]:
    """One parent's children in start order, large groups folded (``failed``: the span ids of
    failed calls and of the spans above a failed one; ``cancelled``: those of them that only
    a cancellation failed)."""
    ordered = sorted(siblings, key=lambda s: (s.start_ns, -s.end_ns))
    groups: dict[tuple[str, str], list[Span]] = {}
    for s in ordered:
        if s.participant:
            groups.setdefault((s.short, _kind(s)), []).append(s)
    kept: dict[int, Folded] = {}  # span id of a group's last kept call -> the group's Folded row
    hidden: set[int] = set()
    for (name, kind), calls in groups.items():
        if len(calls) <= FOLD_AT:
            continue
        slowest = max(calls, key=lambda s: s.end_ns - s.start_ns)
        on_path = [s for s in calls if s is not slowest and s.span_id in critical]
        keep = [slowest, *sorted(on_path, key=lambda s: s.end_ns)[-1:]]
        # Never folded into a count only: who failed is drawn (``calls`` are in start order).
        failures = [s for s in calls if s.span_id in failed and all(s is not k for k in keep)]
        keep += failures[:FAILED_DRAWN]
        rest = [s for s in calls if all(s is not k for k in keep)]
        if not rest:
            continue
        hidden.update(s.span_id for s in rest)
        last = max(keep, key=lambda s: (s.start_ns, -s.end_ns))
        kept[last.span_id] = Folded(
            name=name,
            kind=kind,
            depth=slowest.depth,
            count=len(rest),
            start_ns=min(s.start_ns for s in rest),
            end_ns=max(s.end_ns for s in rest),
            median_ms=statistics.median(s.ms for s in rest),
            max_ms=max(s.ms for s in rest),
            errors=sum(s.span_id in failed and s.span_id not in cancelled for s in rest),
            errors_drawn=sum(k.span_id in failed and k.span_id not in cancelled for k in keep),
            span_ids=frozenset(s.span_id for s in rest),
            cancelled=sum(s.span_id in cancelled for s in rest),
            cancelled_drawn=sum(k.span_id in cancelled for k in keep),
        )
    out: list[Row] = []
    for s in ordered:
        if s.span_id in hidden:
            continue
        out.append(s)
        if s.span_id in kept:
            out.append(kept[s.span_id])
    return out
