"""The report in a terminal (rich): the breakdown, where each millisecond went, both waterfalls,
the counts. Everything fits the console's width: the breakdown pivots (participants as
columns) when the wide table would not fit, and no cell is ever cut with an ellipsis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckpt_events import CheckpointEvent, Event
from ckpt_events.participants.cli.report.attribution import Attribution, attribute
from ckpt_events.participants.cli.report.cancels import CANCELLED_MARK, is_cancelled, mark
from ckpt_events.participants.cli.report.failures import failure_lines
from ckpt_events.participants.cli.report.folding import Folded, Row, error_type, waterfall_rows
from ckpt_events.participants.cli.report.model import (
    OUTSIDE_BAR,
    Span,
    checkpoint_and_restore,
    drawn_extent,
    outside,
    queued_on_row,
    trace_spans,
)
from ckpt_events.participants.cli.report.named import checkpoint_of, earlier_said, heading_said, named_line
from ckpt_events.participants.cli.report.operations import (
    OperationRow,
    counted_figures,
    operation_columns,
    unknown_line,
)
from ckpt_events.participants.cli.report.paths import on_critical_path
from ckpt_events.participants.cli.report.stall_blame import WAITING
from ckpt_events.participants.cli.report.timeline import (
    Breakdown,
    breakdown,
    breakdown_columns,
    counts,
    shown_rows,
)
from ckpt_events.participants.cli.text import escape, short_id
from ckpt_events.participants.cli.words import counted, milliseconds
from ckpt_events.participants.workloads.registry import KINDS, KindRegistry, colour_of
from ckpt_events.vocab import CountedEvent

__all__ = ["COLOURS", "render", "render_attribution", "render_operations", "render_waterfall"]

#: Terminal colour of the controller and of each participant kind (``KINDS``; the HTML page
#: uses the same ones).
COLOURS: Final = KINDS.palette()
_CRITICAL = "▶"
#: A cancelled span's bar: grey shading, as the page's grey hatching, never a failure's red
#: full block (on a monochrome terminal the shade alone tells it).
_CANCELLED_BAR: Final = "▓"
_CANCELLED_STYLE: Final = "grey62"


def render(
    console: Console,
    events: Sequence[Event],
    *,
    title: str = "checkpoint",
    kinds: KindRegistry = KINDS,
    totals: tuple[list[Breakdown], Mapping[str, Counter[str]]] | None = None,
    note: str | None = None,
    operations: Sequence[OperationRow] = (),
    named: Sequence[Sequence[CheckpointEvent]] = (),
    earlier: int = 0,
) -> None:
    """Print the breakdown, then for the checkpoint and the restore: the attribution line and
    the waterfall; then the counted events. Each kind is drawn in its colour in ``kinds``.
    ``named``, the traces of one checkpoint id of logs with no controller (``Whole.named``),
    are drawn instead, each its line and waterfall in time order, ``earlier`` more counted.
    ``totals``, the breakdown and counted events of more than ``events`` (whole logs streamed
    past, ``events`` only the trace drawn), are shown instead of ``events``' own. ``note``, a
    line under the title (``title``'s trace is shared with other rows: ``Run.shared_line``).
    ``operations``, the per-operation table of the whole logs (``Whole.operations``), is shown
    under the breakdown, which then says it sums every request."""
    rows = breakdown(events) if totals is None else totals[0]
    # The legend names the kinds these logs hold (a user's own too), not the registry's.
    colours = kinds.palette_for({e.kind for e in events} | {r.kind for r in rows})
    summed = ", every request summed" if operations else ""
    console.print(
        Text(f"{escape(title)}: time per participant (ms{summed}), records and bytes", style="italic")
    )
    if note is not None:
        console.print(Text(escape(note), style="yellow"))
    console.print(_breakdown_table(rows, console.width, colours))
    if operations:
        render_operations(console, operations)
    if named:
        _render_named(console, named, earlier, kinds)
    checkpoint, restore = checkpoint_and_restore(events) if not named else (None, None)
    for label, trace_id in (("checkpoint", checkpoint), ("restore", restore)):
        if trace_id is None:
            continue
        spans = trace_spans(events, trace_id)
        attribution = attribute(spans)
        render_attribution(console, label, attribution)
        # Its heading names the checkpoint too: a wide fleet's waterfall scrolls its attribution away.
        heading = label
        if attribution is not None and attribution.checkpoint_id is not None:
            heading = f"{label} {short_id(attribution.checkpoint_id)}"
        console.print(render_waterfall(spans, console.width, title=heading, kinds=kinds))
        # Why its failed spans failed: each exception's message once (a row names its type only).
        for line in failure_lines(spans):
            console.print(_failure_text(line))
    console.print(
        Text.assemble(
            "who: ",
            *((Text(f"█ {escape(kind)}  ", style=colour)) for kind, colour in colours.items()),
            f"{_CRITICAL} critical path  ░ transit  ▒ queued in participant  "
            f"─ +N more: parallel calls folded (the slowest shown; ≤ their longest ms)",
            *_cancelled_legend(events),
        )
    )
    console.print(_counts_table(counts(events) if totals is None else totals[1]))


def _failure_text(line: str) -> Text:
    """A failure line (``failures.failure_lines``) in red, a cancellation's (``⊘ ...``) in the
    cancelled bars' grey: a server's stop cut it, no failure of its own."""
    return Text(escape(line), style=_CANCELLED_STYLE if line.startswith(CANCELLED_MARK) else "red")


def _cancelled_legend(events: Sequence[Event]) -> tuple[Text, ...]:
    """The legend's word for a cancelled span's bar, when ``events`` hold one (else nothing: a
    report without one prints as it did)."""
    if not any(is_cancelled(getattr(e, "error_type", None)) for e in events):
        return ()
    return (Text("  "), Text(f"{_CANCELLED_BAR} cancelled", style=_CANCELLED_STYLE))


def _render_named(
    console: Console, named: Sequence[Sequence[CheckpointEvent]], earlier: int, kinds: KindRegistry
) -> None:
    """Each trace of one checkpoint id: its line (operation, outcome, where its time went),
    then its waterfall, in time order."""
    checkpoint = short_id(checkpoint_of(named[0]))
    console.print(Text(escape(heading_said(named)), style="bold"))
    if (left_out := earlier_said(named, earlier)) is not None:
        console.print(Text(escape(left_out), style="yellow"))
    for number, events in enumerate(named, earlier + 1):
        line = named_line(events)
        console.print(Text(f"#{number} {escape(line.title)}: {escape(line.figures)}", style="bold"))
        if line.spans:
            heading = f"#{number} {line.operation} {checkpoint}"
            console.print(render_waterfall(line.spans, console.width, title=escape(heading), kinds=kinds))
            for said in failure_lines(line.spans):  # as under any other waterfall
                console.print(_failure_text(said))


def render_operations(console: Console, rows: Sequence[OperationRow]) -> None:
    """One row per (kind, operation, step): how many ran and failed, and what one ok request
    took (p50, p95, max), where the breakdown sums them all."""
    table = Table(
        title="per operation and step (ms; p50, p95, max of the ok ones)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in ("kind", "operation", "step"):
        table.add_column(column, overflow="fold")
    counted_columns = operation_columns(rows)
    for column in (*counted_columns, "p50", "p95", "max"):
        table.add_column(column, justify="right", overflow="fold")
    for row in rows:
        # A key whose every span failed has no duration to show: "-", never a made-up 0.
        figures = ("-" if ms is None else _figure(ms) for ms in (row.p50_ms, row.p95_ms, row.max_ms))
        table.add_row(
            Text(escape(row.kind)),
            Text(escape(row.operation)),
            Text(escape(row.step)),
            *counted_figures(row, counted_columns),
            *figures,
        )
    console.print(table)
    if (unknown := unknown_line(list(rows))) is not None:
        console.print(Text(f"  {unknown}", style="dim"))


def render_attribution(console: Console, label: str, attribution: Attribution | None) -> None:
    """The line ``N ms total, M ms in participants' handlers, ...`` and its named parts."""
    if attribution is None:
        return
    # Which checkpoint: a restore's id is the checkpoint it restored.
    if attribution.checkpoint_id is not None:
        label = f"{label} {short_id(attribution.checkpoint_id)}"
    console.print(
        Text(f"{escape(label)} ({escape(attribution.root)}): {escape(attribution.line())}", style="bold")
    )
    # A line that would open with "; " (no part of 1% or more) or say nothing is left out.
    if parts := attribution.parts_line():
        console.print(Text("  " + escape(parts), style="dim"))


def _breakdown_table(rows: list[Breakdown], width: int, colours: Mapping[str, str]) -> Table:
    rows = shown_rows(rows)
    columns = breakdown_columns(rows)
    wide = 27 + sum(max(len(c), 8) + 3 for c in columns) + 2 * 20
    if wide <= width:
        table = Table(box=box.SIMPLE_HEAD)
        table.add_column("participant", overflow="fold")
        for column in (*columns, "records committed", "bytes written"):
            table.add_column(Text(escape(column)), justify="right", overflow="fold")
        for row in rows:
            cells = [_cell(row, c) for c in columns]
            table.add_row(Text(_who(row)), *cells, _amount(row.records), _amount(row.bytes))
        return table
    # Pivoted: one row per operation or step, one column per participant.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("ms", overflow="fold")
    for row in rows:
        header = Text(_who(row).replace("/", "\n", 1), style=colour_of(row.kind, colours))
        table.add_column(header, justify="right", overflow="fold")
    for column in columns:
        table.add_row(Text(escape(column)), *(_cell(r, column) for r in rows))
    table.add_row("records", *(_amount(r.records) for r in rows))
    table.add_row("bytes", *(_amount(r.bytes) for r in rows))
    return table


def _amount(value: int | None) -> str:
    """A count, or ``-`` where nothing said it (never a made-up 0)."""
    return "-" if value is None else f"{value:,}"


def _cell(row: Breakdown, column: str) -> str:
    """A breakdown cell: its ms, ``?`` where a duration is unknown (a clock went back), or blank."""
    if column in row.unknown:
        return "?"
    return _figure(row.ms[column]) if column in row.ms else ""


def _figure(ms: float) -> str:
    """A duration's figure in a ms column: a 56 us handler is ``0.056``, never ``0.0``."""
    return milliseconds(ms).removesuffix(" ms")


def _who(row: Breakdown) -> str:
    """The participant's name, its log strings escaped (for a ``Text``, never markup)."""
    # A worker's row sits right under its participant's (breakdown() orders them so).
    kind, instance = escape(row.kind), escape(row.instance)
    who = f"{kind}/{instance}" if row.worker is None else f"  └ worker {escape(row.worker)}"
    if row.folded:
        who = f"{kind} {instance}"
    return who + escape(row.errors_said)


#: The waterfall's ms column (``▶12345.6``) and its narrowest bar.
_MS_W: Final = 9
_MIN_BAR: Final = 10


def render_waterfall(
    spans: list[Span], width: int, *, title: str = "checkpoint", kinds: KindRegistry = KINDS
) -> Table:
    """One trace as a waterfall: indented span names (a participant's instance after its
    operation), milliseconds, and a bar on a time axis scaled to what is left of ``width``;
    bars in their kind's colour in ``kinds``, the critical path marked ``▶``. A stage's large
    group of parallel calls shows its slowest call and one ``+N more`` row (``folding``)."""
    colours = kinds.palette_for(s.who.split("/", 1)[0] for s in spans)
    critical = on_critical_path(spans)
    rows = waterfall_rows(spans, critical)
    # The names give way first on a narrow console (they fold): given 40 columns at 40, rich
    # squeezed the ms column to 3 and split its figures, ``▶99`` over ``.8``.
    room = max(8, min(width, 200) - _MS_W - 4 - _MIN_BAR)
    name_w = min(40, room, max(len("  " * r.depth + _label(r)) for r in rows))
    bar_w = max(_MIN_BAR, min(width, 200) - name_w - _MS_W - 4)
    t0, t1 = extent = drawn_extent(spans)
    total = max(1, t1 - t0)
    away = sum(outside(s, extent) for s in spans)
    # A span outside the root's own time (its clock stepped) is named, never drawn to scale.
    note = f"; {counted(away, 'span')} outside it not drawn: a clock that stepped?" if away else ""
    table = Table(
        title=Text(f"{escape(title)}: waterfall ({milliseconds(total / 1e6)}{note})", style="table.title"),
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    table.add_column("span", width=name_w, overflow="fold")
    table.add_column("ms", justify="right", width=_MS_W, overflow="fold")
    table.add_column(_axis(total, bar_w), width=bar_w, no_wrap=True, overflow="crop")
    by_id = {s.span_id: s for s in spans}

    def col(t: int) -> int:
        return min(bar_w - 1, max(0, int((t - t0) / total * bar_w)))

    for row in rows:
        bar = Text(" " * bar_w)
        if isinstance(row, Folded):
            start, end = col(row.start_ns), max(col(row.start_ns) + 1, col(row.end_ns))
            _paint(bar, "─", start, end)
            bar.stylize(colour_of(row.kind, colours), start, end)
            name = Text("  " * row.depth + _label(row), style="dim")
            if row.errors or row.cancelled:  # the failed calls past those drawn, counted in red
                name.append(f", {row.failed}", style="red" if row.errors else _CANCELLED_STYLE)
            table.add_row(name, Text(f"≤{_figure(row.max_ms)}", style="dim"), bar)
            continue
        s = row
        on_path = s.span_id in critical
        name = Text("  " * s.depth + _label(s), style="bold" if on_path else "")
        ms = _figure(s.ms) if s.known else "?"
        if outside(s, extent):
            table.add_row(name, f"{_CRITICAL if on_path else ''}{ms}", Text(OUTSIDE_BAR, style="dim"))
            continue
        parent = by_id.get(s.parent_span_id or -1)
        if s.participant and parent is not None and parent.client:
            arrived = s.received_ns if s.received_ns is not None else s.start_ns
            bar.stylize(colour_of(s.who, colours), col(parent.start_ns), col(parent.end_ns) + 1)
            _paint(bar, "░", col(parent.start_ns), col(arrived))
            _paint(bar, "▒", col(arrived), col(s.start_ns))
            _paint(bar, "░", col(s.end_ns), col(parent.end_ns) + 1)
        elif (queued := queued_on_row(s, parent)) is not None:
            # No controller's call to draw it (no caller in the logs, or a participant called it):
            # its wait in the server, counted as queued, is drawn all the same.
            bar.stylize(colour_of(s.who, colours), col(queued[0]), col(queued[1]) + 1)
            _paint(bar, "▒", col(queued[0]), col(queued[1]))
        cut = is_cancelled(error_type(s))
        _paint(bar, _CANCELLED_BAR if cut else "█", col(s.start_ns), max(col(s.start_ns) + 1, col(s.end_ns)))
        style = _CANCELLED_STYLE if cut else "red" if s.error else colour_of(s.who, colours)
        bar.stylize(style, col(s.start_ns), col(s.end_ns) + 1)
        # A span whose clock went back during it: its duration is unknown, never 0.0 (``ms``).
        table.add_row(name, f"{_CRITICAL if on_path else ''}{ms}", bar)
    return table


def _label(row: Row) -> str:
    if isinstance(row, Folded):
        return escape(row.label)
    label = f"{row.short} {row.who.split('/', 1)[-1]}" if row.participant else row.short
    # A failed span says how: a wide fleet's failure is drawn, never only counted (``folding``).
    failed = error_type(row)
    return escape(label if failed is None else f"{label} {mark(failed)} {failed}")


def _paint(bar: Text, char: str, start: int, end: int) -> None:
    if end > start:
        bar.plain = bar.plain[:start] + char * (end - start) + bar.plain[end:]


def _axis(total_ns: int, width: int) -> str:
    """``0 ms`` at the left, the total at the right, a middle tick when there is room."""
    right = f"{_tick(total_ns)} ms"
    mid = _tick(total_ns / 2)
    axis = [" "] * width
    axis[0] = "0"
    for i, ch in enumerate(right):
        axis[width - len(right) + i] = ch
    if width > 3 * len(right) + 4:
        start = width // 2 - len(mid) // 2
        axis[start : start + len(mid)] = mid
    return "".join(axis)


def _tick(ns: float) -> str:
    """An axis tick in ms, with the decimals its size needs: a trace of 0.1 ms was labelled
    ``0``, ``0`` and ``0 ms``."""
    ms = ns / 1e6
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2g}"


def _counts_table(tallies: Mapping[str, Counter[str]]) -> Table:
    summary = Table(title="counted events", title_justify="left", box=box.SIMPLE_HEAD)
    summary.add_column("event", overflow="fold")
    summary.add_column("by", overflow="fold")
    summary.add_column("count", justify="right", overflow="fold")
    for event_name in (*CountedEvent, WAITING):
        for key, value in sorted(tallies.get(event_name, Counter()).items()):
            summary.add_row(event_name, Text(escape(key)), f"{value:,}")
    if not summary.row_count:
        summary.add_row("(none)", "", "0")
    return summary
