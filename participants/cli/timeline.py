"""Where a checkpoint's time went, built from its events alone.

Used by ``ckpt-events demo`` (live events) and ``ckpt-events report LOG.jsonl`` (a recorded
log): a per-participant breakdown, a waterfall of one checkpoint's spans (terminal, SVG or
HTML), and the counted events. Nothing here talks to a server.
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckpt_events import (
    PREPARE_ORDER,
    CollectionAction,
    CollectionFinished,
    CoordinateFinished,
    CountedEvent,
    Event,
    GenerationCut,
    Kind,
    LeaseExpired,
    Operation,
    OperationFinished,
    Outcome,
    PrepareNotReady,
    Refused,
    Step,
    StepFinished,
    span_name_of,
)

__all__ = [
    "BREAKDOWN_COLUMNS",
    "Breakdown",
    "Span",
    "breakdown",
    "counts",
    "render",
    "spans_of",
    "write_timeline",
]

#: Operations and steps shown per participant, in the order a checkpoint runs them.
BREAKDOWN_COLUMNS: tuple[str, ...] = tuple(
    str(name)
    for name in (
        Operation.PREPARE, Step.WAIT_READY, Step.GENERATION_CUT,
        Operation.COMMIT, Step.EXPORT, Step.WRITE,
        Operation.RESTORE, Step.READ, Step.INSTALL,
        Operation.RESUME,
    )
)  # fmt: skip
_KIND_ORDER = {kind: i for i, kind in enumerate((*PREPARE_ORDER, Kind.CONTROLLER))}


@dataclass
class Breakdown:
    """One participant's totals: milliseconds per operation/step, records committed, bytes written."""

    kind: Kind
    instance: str
    ms: dict[str, float] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    errors: int = 0
    #: The worker process of a multi-worker participant (its row sits under the participant's).
    worker: int | None = None


@dataclass(frozen=True)
class Span:
    """A finished span, flattened for drawing."""

    name: str
    who: str
    start_ns: int
    end_ns: int
    depth: int
    error: bool

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def breakdown(events: Iterable[Event], checkpoint_id: str | None = None) -> list[Breakdown]:
    """Per-participant totals over every operation and step (of one checkpoint, if given);
    a multi-worker participant's workers get a row each, right under the participant's."""
    rows: dict[tuple[Kind, str, int | None], Breakdown] = {}
    for event in events:
        if checkpoint_id is not None and getattr(event, "checkpoint_id", None) != checkpoint_id:
            continue
        match event:
            case OperationFinished(operation=op) | StepFinished(step=op):
                key = (event.kind, event.instance, event.worker)
                row = rows.setdefault(key, Breakdown(event.kind, event.instance, worker=event.worker))
                row.ms[op.value] = row.ms.get(op.value, 0.0) + (event.end_ns - event.start_ns) / 1e6
                row.errors += event.outcome is Outcome.ERROR
                # What a checkpoint holds: records committed and bytes written (a restore
                # reads the same ones back, so counting both would double them).
                if isinstance(event, OperationFinished) and op is Operation.COMMIT:
                    row.records += event.records or 0
                if isinstance(event, StepFinished) and op is Step.WRITE:
                    row.bytes += event.bytes or 0
            case _:
                pass
    return sorted(
        rows.values(),
        key=lambda r: (_KIND_ORDER.get(r.kind, 9), r.instance, -1 if r.worker is None else r.worker),
    )


def counts(events: Iterable[Event]) -> dict[str, Counter[str]]:
    """The counted events: refusals by code, lease expiries, not-ready prepares, cuts."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for event in events:
        match event:
            case Refused(code=code):
                out[CountedEvent.REFUSED][code.value] += 1
            case LeaseExpired(phase=phase):
                out[CountedEvent.LEASE_EXPIRED][f"{event.kind.value}/{phase.value}"] += 1
            case PrepareNotReady(blockers=blockers):
                out[CountedEvent.PREPARE_NOT_READY][event.kind.value] += 1
                out["prepare_not_ready_blockers"][event.kind.value] += blockers
            case GenerationCut(disposition=disposition, calls=calls):
                out[CountedEvent.GENERATION_CUT][disposition.value] += calls
            case _:
                pass
    return dict(out)


def spans_of(events: Iterable[Event], trace_id: int | None = None) -> list[Span]:
    """The finished spans of one trace (default: the trace of the last collection
    checkpoint, else of the last coordinate commit), parents before children."""
    finished: list[Any] = [e for e in events if span_name_of(e) is not None]  # every *Finished event
    if trace_id is None:
        roots: list[Any] = [
            e
            for e in finished
            if isinstance(e, CollectionFinished) and e.action is CollectionAction.CHECKPOINT
        ]
        roots = roots or [e for e in finished if isinstance(e, CoordinateFinished)]
        if not roots:
            roots = finished
        if not roots:
            return []
        trace_id = roots[-1].trace_id
    chosen = [e for e in finished if e.trace_id == trace_id]
    by_id = {e.span_id: e for e in chosen}

    def depth(e: Any) -> int:
        d, parent = 0, e.parent_span_id
        while parent in by_id and d < 32:
            d, parent = d + 1, by_id[parent].parent_span_id
        return d

    spans = [
        Span(
            name=span_name_of(e) or "",
            who="controller" if e.kind is Kind.CONTROLLER else _who(e.kind, e.instance, e.worker),
            start_ns=e.start_ns,
            end_ns=e.end_ns,
            depth=depth(e),
            error=e.outcome is Outcome.ERROR,
        )
        for e in chosen
    ]
    return sorted(spans, key=lambda s: (s.start_ns, s.depth))


def _who(kind: Kind, instance: str, worker: int | None) -> str:
    """``kind/instance``, and ``/w<index>`` for a worker of a multi-worker participant."""
    return f"{kind.value}/{instance}" + ("" if worker is None else f"/w{worker}")


def render(console: Console, events: Sequence[Event], *, title: str = "checkpoint") -> None:
    """Print the breakdown table, the waterfall of one checkpoint and the counts."""
    table = Table(title=f"{title}: time per participant (ms), records and bytes", title_justify="left")
    table.add_column("participant")
    for column in BREAKDOWN_COLUMNS:
        table.add_column(column, justify="right")
    table.add_column("records committed", justify="right")
    table.add_column("bytes written", justify="right")
    for row in breakdown(events):
        cells = [f"{row.ms[c]:.1f}" if c in row.ms else "" for c in BREAKDOWN_COLUMNS]
        who = f"{row.kind.value}/{row.instance}" if row.worker is None else f"  └ worker {row.worker}"
        who += f" ({row.errors} errors)" if row.errors else ""
        table.add_row(who, *cells, f"{row.records:,}", f"{row.bytes:,}")
    console.print(table)
    spans = spans_of(events)
    if spans:
        # Fixed columns: span 30, who 24, ms 8, plus borders and padding (13).
        console.print(_waterfall(spans, width=max(20, min(console.width, 200) - 30 - 24 - 8 - 13)))
    tallies = counts(events)
    summary = Table(title="counted events", title_justify="left")
    summary.add_column("event")
    summary.add_column("by")
    summary.add_column("count", justify="right")
    for event_name in CountedEvent:
        for key, value in sorted(tallies.get(event_name, Counter()).items()):
            summary.add_row(event_name, key, f"{value:,}")
    if not summary.row_count:
        summary.add_row("(none)", "", "0")
    console.print(summary)


def _waterfall(spans: list[Span], width: int) -> Table:
    t0 = min(s.start_ns for s in spans)
    total = max(1, max(s.end_ns for s in spans) - t0)
    table = Table(title=f"timeline of one checkpoint ({total / 1e6:.1f} ms)", title_justify="left")
    table.add_column("span", no_wrap=True, width=30, overflow="ellipsis")
    table.add_column("who", no_wrap=True, width=24, overflow="ellipsis")
    table.add_column("ms", justify="right", width=8)
    table.add_column("timeline", no_wrap=True, width=width, overflow="crop")
    for s in spans:
        left = int((s.start_ns - t0) / total * width)
        length = max(1, int((s.end_ns - s.start_ns) / total * width))
        bar = Text(" " * left)
        left = min(left, width - 1)
        bar.append("█" * max(1, min(length, width - left)), style="red" if s.error else _colour(s.who))
        table.add_row("  " * s.depth + s.name.removeprefix("gym.checkpoint."), s.who, f"{s.ms:.1f}", bar)
    return table


_COLOURS = {"controller": "magenta", "environment": "green", "model": "blue", "agent": "cyan",
            "resources": "yellow"}  # fmt: skip


def _colour(who: str) -> str:
    return _COLOURS.get(who.split("/", 1)[0], "white")


def write_timeline(path: Path, spans: list[Span], *, title: str = "checkpoint timeline") -> None:
    """Write the waterfall as SVG (``.svg``) or as an HTML page around it (otherwise)."""
    row_h, label_w, bar_w = 18, 430, 720
    t0 = min((s.start_ns for s in spans), default=0)
    total = max(1, max((s.end_ns for s in spans), default=1) - t0)
    height = row_h * (len(spans) + 2)
    fills = {"controller": "#a855f7", "environment": "#22c55e", "model": "#3b82f6", "agent": "#06b6d4",
             "resources": "#eab308"}  # fmt: skip
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 80}" height="{height}" '
        f'font-family="monospace" font-size="12">',
        f'<text x="4" y="{row_h - 4}" font-weight="bold">{html.escape(title)} ({total / 1e6:.1f} ms)</text>',
    ]
    for i, s in enumerate(spans, start=1):
        y = row_h * i + 4
        x = label_w + (s.start_ns - t0) / total * bar_w
        w = max(1.0, (s.end_ns - s.start_ns) / total * bar_w)
        fill = "#ef4444" if s.error else fills.get(s.who.split("/", 1)[0], "#9ca3af")
        label = html.escape(f"{'  ' * s.depth}{s.name.removeprefix('gym.checkpoint.')}  {s.who}")
        parts.append(f'<text x="4" y="{y + 11}" xml:space="preserve">{label}</text>')
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{fill}">'
            f"<title>{html.escape(s.name)} {html.escape(s.who)}: {s.ms:.2f} ms</title></rect>"
        )
        parts.append(f'<text x="{x + w + 4:.1f}" y="{y + 11}" fill="#555">{s.ms:.1f}</text>')
    parts.append("</svg>")
    svg = "\n".join(parts)
    if path.suffix.lower() == ".svg":
        path.write_text(svg + "\n")
    else:
        path.write_text(
            f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"</head><body>\n{svg}\n</body></html>\n"
        )
