"""The run overview in a terminal: one row per checkpoint and restore, causes under the row."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ckpt_events.participants.cli.report.judge import ABORTED, FAILED, OPEN, PUBLISHED, RESTORED
from ckpt_events.participants.cli.report.overview import Run, RunRow
from ckpt_events.participants.cli.report.run_totals import run_lines
from ckpt_events.participants.cli.report.trends import MIN_CHECKPOINTS
from ckpt_events.participants.cli.text import escape, short_id
from ckpt_events.participants.cli.words import counted

__all__ = ["DETAILED_UNPUBLISHED", "OUTCOME_COLOURS", "chosen_rows", "not_detailed_line", "render_overview"]

#: Colour of each outcome: the one place the overview picks colours.
OUTCOME_COLOURS = {PUBLISHED: "green", RESTORED: "green", ABORTED: "yellow", FAILED: "red", OPEN: "red"}
#: Consoles narrower than this get the compact overview table.
_ROOMY = 100
#: Ids up to this long are never wrapped (the demo's are 29 characters).
_WHOLE_ID = 36


#: Rows that did not publish detailed by default, the first in time order; the rest are counted
#: (``not_detailed_line``): 2,100 open checkpoints were each detailed, 26 MB on the terminal.
DETAILED_UNPUBLISHED: Final = 20


def chosen_rows(run: Run, checkpoint: str | None) -> list[RunRow]:
    """The rows shown in detail: the named checkpoint's, else the slowest published checkpoint
    and the first ``DETAILED_UNPUBLISHED`` rows that did not publish, in time order."""
    if checkpoint is not None:
        named = [r for r in run.rows if r.checkpoint_id == checkpoint]
        # ``ID#N``: row N of the overview, when ID names several (two fleets' ``c1``).
        checkpoint_id, sep, number = checkpoint.rpartition("#")
        if named or not sep or not number.isdigit() or not 1 <= int(number) <= len(run.rows):
            return named
        row = run.rows[int(number) - 1]
        return [row] if row.checkpoint_id == checkpoint_id else []
    published = [r for r in run.rows if r.published and r.what == "checkpoint"]
    slowest = max(published, key=lambda r: r.ms or 0.0, default=None)
    unpublished = {id(r) for r in [r for r in run.rows if not r.published][:DETAILED_UNPUBLISHED]}
    return [r for r in run.rows if r is slowest or id(r) in unpublished]


def reused_id_line(run: Run, rows: list[RunRow]) -> str | None:
    """The line saying that the ``--checkpoint`` id of ``rows`` names several checkpoints (or
    several restores) of the run, by row number, and how to pick one; ``None`` if it names one."""
    numbers = {id(r): n for n, r in enumerate(run.rows, 1)}
    for what in ("checkpoint", "restore"):
        same = [numbers[id(r)] for r in rows if r.what == what]
        if len(same) > 1:
            cid = escape(short_id(rows[0].checkpoint_id))
            listed = ", ".join(f"#{n}" for n in same[:-1]) + f" and #{same[-1]}"
            return (
                f"{what} id {cid} was used by {len(same)} {what}s (rows {listed}): each is detailed "
                f"under its row number, and --report draws #{numbers[id(rows[0])]}; pick one with "
                f"--checkpoint {cid}#{same[-1]}"
            )
    return None


def not_detailed_line(run: Run) -> str | None:
    """The line counting the rows that did not publish past ``DETAILED_UNPUBLISHED``, or ``None``."""
    left = sum(not r.published for r in run.rows) - DETAILED_UNPUBLISHED
    if left <= 0:
        return None
    more = counted(left, "more checkpoint or restore", "more checkpoints and restores")
    return (
        f"{more} that did not publish {'is' if left == 1 else 'are'} not detailed (the first "
        f"{DETAILED_UNPUBLISHED} are): pass --checkpoint ID for one"
    )


def render_overview(console: Console, run: Run, *, title: str) -> None:
    """The table of the run's checkpoints and restores, then each one's cause or critical path."""
    rows = counted(len(run.rows), "checkpoint or restore", "checkpoints and restores")
    heading = f"run overview ({escape(title)}): {rows}"
    console.print(Text(heading, style="bold"))
    table = _rows_table(run, compact=console.width < _ROOMY)
    if _natural_width(console, table) <= console.width:
        console.print(table)
    else:
        # Narrower than the compact table (a split pane, ``COLUMNS=40``), rich gave a column a
        # width of 0 or cut it: at 50 columns the ms and outcome columns were gone, at 40 every
        # id was cut to 25 characters (two checkpoints' ids read alike), at 60 ``99.8`` was
        # ``99.`` over ``8``. One labelled line a row instead, wrapped between its fields.
        for line in _row_lines(run):
            console.print(line)
    _render_totals(console, run)
    _render_trends(console, run)
    _render_row_notes(console, run)


def _natural_width(console: Console, table: Table) -> int:
    """The width ``table`` takes with every cell on its lines as given (nothing folded); a
    measurement against the console's own width is capped at it."""
    return Measurement.get(console, console.options.update_width(1_000_000), table).maximum


def _start_text(row: RunRow) -> str:
    return datetime.fromtimestamp(row.start_ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]


def _paused_text(row: RunRow) -> str:
    """The paused ms cell: ``unknown`` when it is (or a checkpoint has none), ``""`` for a restore."""
    if row.pause_unknown or (row.paused_ms is None and row.what == "checkpoint"):
        return "unknown"
    return "" if row.paused_ms is None else f"{row.paused_ms:.1f}"


def _row_lines(run: Run) -> list[Text]:
    """The overview table's rows as lines, each field named: ``#1 checkpoint ID, start
    18:48:40.232 UTC, 99.8 ms, paused 62.0 ms, published``."""
    lines = []
    for number, row in enumerate(run.rows, 1):
        line = Text(f"#{number} {row.what} ")
        line.append(escape(short_id(row.checkpoint_id)))
        line.append(f", start {_start_text(row)} UTC")
        if row.ms_text:
            line.append(f", {row.ms_text} ms")
        if paused := _paused_text(row):
            line.append(f", paused {paused}" if paused == "unknown" else f", paused {paused} ms")
        line.append(", ")
        line.append(escape(row.outcome), style=OUTCOME_COLOURS.get(row.outcome, "white"))
        lines.append(line)
    return lines


def _rows_table(run: Run, *, compact: bool) -> Table:
    """One line per checkpoint and restore: number, what, id, start, ms, paused ms, outcome."""
    # Under 100 columns one space between columns (no edges) keeps a checkpoint id and its
    # start time on one line each at 80; an id too long for that folds rather than being cut.
    table = Table(box=box.SIMPLE_HEAD, show_edge=not compact, padding=(0, 0) if compact else (0, 1))
    whole = max((len(escape(short_id(r.checkpoint_id))) for r in run.rows), default=0) <= _WHOLE_ID
    for column, justify in (
        ("#", "right"),
        ("what", "left"),
        ("id", "left"),
        ("start (UTC)", "left"),
        ("ms", "right"),
        ("paused\nms" if compact else "paused ms", "right"),
        ("outcome", "left"),
    ):
        no_wrap = column == "start (UTC)" or (column == "id" and whole)
        table.add_column(column, justify=justify, overflow="fold", no_wrap=no_wrap)  # type: ignore[arg-type]
    for number, row in enumerate(run.rows, 1):
        table.add_row(
            str(number),
            row.what,
            Text(escape(short_id(row.checkpoint_id))),
            _start_text(row),
            row.ms_text,
            _paused_text(row),
            Text(escape(row.outcome), style=OUTCOME_COLOURS.get(row.outcome, "white")),
        )
    return table


def _render_totals(console: Console, run: Run) -> None:
    """Run-wide lines: the fleet's pause over the logs' time, the episodes after the restores,
    and the counted events that named no checkpoint (``run_lines``, as the HTML page says them)."""
    for line in run_lines(run):
        console.print(Text(escape(line.text), style="yellow" if line.warning else ""))


def _render_row_notes(console: Console, run: Run) -> None:
    """Under the table, by row number: a cause or critical path, and where a restore came from."""
    for number, row in enumerate(run.rows, 1):
        if row.causes:
            console.print(Text(f"#{number} {row.what} {row.outcome}: " + escape("; ".join(row.causes))))
        elif row.critical_path:
            console.print(Text(f"#{number} {row.what}, {escape(row.critical_path)}", style="dim"))
        if row.never_finished:
            console.print(Text(f"#{number} {row.what} {row.outcome}: {escape(row.never_finished)}"))
        if row.what == "restore":
            source = (
                f"from #{row.source_row} checkpoint {escape(short_id(row.checkpoint_id))}"
                if row.source_row is not None
                else f"of checkpoint {escape(short_id(row.checkpoint_id))} (not in these logs)"
            )
            said = "".join(f"; {escape(x)}" for x in (row.dominated, row.episodes_text) if x)
            console.print(Text(f"#{number} restore {source}{said}"))


def _render_trends(console: Console, run: Run) -> None:
    """Per (kind, operation, step) over the run's checkpoints, then the flags in words."""
    trends = run.trends.table()
    if sum(r.what == "checkpoint" for r in run.rows) < MIN_CHECKPOINTS or not trends:
        return
    title = "trends over the run's checkpoints (slowest instance per checkpoint)"
    table = Table(box=box.SIMPLE_HEAD, title=title)
    for column, justify in (
        ("kind", "left"),
        ("operation", "left"),
        ("step", "left"),
        ("n", "right"),
        ("p50 ms", "right"),
        ("p95 ms", "right"),
        ("max ms", "right"),
    ):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in trends:
        kind, operation, step = t.key
        table.add_row(
            Text(escape(kind)),
            Text(escape(operation)),
            Text(escape(step)),
            str(t.count),
            f"{t.p50:.1f}",
            f"{t.p95:.1f}",
            f"{t.max:.1f}",
        )
    console.print(table)
    for flag in run.trends.flags():
        console.print(Text("flag: " + escape(flag), style="yellow"))
