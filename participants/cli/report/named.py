"""The traces of one checkpoint id in logs with no controller (a user's own server): each of
its requests (prepare, a commit that failed and its retry, a later restore) is a trace of its
own, and ``--checkpoint`` draws them all, the most recent ``DRAWN_TRACES``, in time order.

The logs are streamed: only the ids of the traces kept are held while reading, then their
events in one more pass, so a log of 100,000 requests for one id holds ``DRAWN_TRACES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from ckpt_events import CheckpointEvent, Event, OperationStarted, SpanEvent
from ckpt_events.participants.cli.report.attribution import attribute, naming_root
from ckpt_events.participants.cli.report.cancels import mark
from ckpt_events.participants.cli.report.folding import error_type
from ckpt_events.participants.cli.report.model import Span, trace_spans
from ckpt_events.participants.cli.text import short_id
from ckpt_events.participants.cli.words import counted

__all__ = [
    "DRAWN_TRACES",
    "NamedLine",
    "NamedTraces",
    "checkpoint_of",
    "earlier_said",
    "heading_said",
    "named_line",
]

#: How many traces of one checkpoint id are drawn, the most recent; the earlier are counted.
DRAWN_TRACES: Final = 8


@dataclass
class NamedTraces:
    """Which traces hold an operation or step naming ``checkpoint``: the ``DRAWN_TRACES`` that
    started last, in start order, and how many started before them (``earlier``)."""

    checkpoint: str
    limit: int = DRAWN_TRACES
    #: Trace id to the start of its first span seen naming the id, in the order first seen.
    kept: dict[int, int] = field(default_factory=dict)
    #: Traces let go past ``limit``, each counted once.
    earlier: int = 0
    #: The latest start let go: a span of a trace starting no later is of one already counted
    #: (its finish read after newer traces started), not a trace of its own.
    _floor: int | None = None

    def see(self, e: CheckpointEvent) -> None:
        """Note ``e`` if it is a span naming the checkpoint id (events in time order)."""
        if not isinstance(e, SpanEvent) or e.checkpoint_id != self.checkpoint:
            return
        trace = e.trace_id
        if trace in self.kept:
            return
        start: int = e.start_ns
        if self._floor is not None and start <= self._floor:
            return
        self.kept[trace] = start
        if len(self.kept) > self.limit:
            # The earliest to start goes (a long commit first seen by its start stays in place).
            first = min(self.kept, key=self.kept.__getitem__)
            gone = self.kept.pop(first)
            self._floor = gone if self._floor is None else max(self._floor, gone)
            self.earlier += 1

    def order(self) -> list[int]:
        """The traces kept, by the start of their first span naming the id."""
        return sorted(self.kept, key=self.kept.__getitem__)


@dataclass(frozen=True)
class NamedLine:
    """What one trace of a checkpoint id did: ``title`` (``commit judge-0 ✗ ConnectionError``),
    ``figures`` (where its time went: ``Attribution.line``), its spans to draw."""

    operation: str
    title: str
    figures: str
    spans: list[Span]


def named_line(events: Sequence[Event]) -> NamedLine:
    """The line of one trace's events (``NamedTraces``): its root operation, its outcome with
    the error type, its total, handlers and time queued; ``open`` when no span of it ended."""
    trace = next((e.trace_id for e in events if isinstance(e, SpanEvent)), None)
    spans = [] if trace is None else trace_spans(events, trace)
    roots = [s for s in spans if s.depth == 0]
    if not roots:
        started = next((e for e in events if isinstance(e, OperationStarted)), None)
        operation = "operation" if started is None else str(started.operation)
        who = "" if started is None else f" {started.instance}"
        return NamedLine(operation, f"{operation}{who} open", "no end of it in these logs", [])
    root = naming_root(roots)
    operation = root.short
    failed = error_type(root)
    outcome = "ok" if failed is None else f"{mark(failed)} {failed}"
    who = f" {root.who.split('/', 1)[-1]}" if root.participant else ""
    attribution = attribute(spans)
    figures = "" if attribution is None else attribution.line()
    return NamedLine(operation, f"{operation}{who} {outcome}", figures, spans)


def checkpoint_of(events: Sequence[CheckpointEvent]) -> str:
    """The checkpoint id a trace of ``NamedTraces`` was chosen by (its first event naming one)."""
    return next((e.checkpoint_id for e in events if e.checkpoint_id), None) or ""


def heading_said(named: Sequence[Sequence[CheckpointEvent]]) -> str:
    """``c1: 4 requests, each its own trace, in time order``: what heads the traces drawn."""
    checkpoint = short_id(checkpoint_of(named[0]))
    return f"{checkpoint}: {counted(len(named), 'request')}, each its own trace, in time order"


def earlier_said(named: Sequence[Sequence[CheckpointEvent]], earlier: int) -> str | None:
    """``+2 earlier traces of c1 not drawn`` (bounded: a log of 100,000 retries of one id draws
    the last few); ``None`` when none was left out."""
    if not earlier:
        return None
    return f"+{counted(earlier, 'earlier trace')} of {short_id(checkpoint_of(named[0]))} not drawn"
