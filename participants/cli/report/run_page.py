"""The run as one HTML page: the overview first, then each checkpoint's waterfall.

At the top a strip of the run's checkpoints and restores over time (x = start, width =
duration, colour = outcome; an open one reaches the end of the logs), each linked to its row,
and the outcome legend; then the table (one row per checkpoint and restore, its cause or
critical path, linked to its waterfall), the trend flags and the run-wide lines the terminal
prints under its table (the fleet's pause, the counted events that named no checkpoint); then
the waterfalls; last the
trends table, collapsed (``<details>``), so the first waterfall is on the first screen. Every
string from a log is escaped. A run of more than ``ALL_WATERFALLS`` rows draws the waterfalls
of the rows shown in detail only (the slowest published checkpoint and every one that did not
publish), so the page stays readable and the second pass over the logs stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from ckpt_events.participants.cli.report.attribution import attribute
from ckpt_events.participants.cli.report.html import (
    PAGE_POLICY,
    PAGE_SCRIPT,
    PAGE_STYLE,
    attribution_html,
    failures_html,
    waterfall_svg,
)
from ckpt_events.participants.cli.report.judge import ABORTED, FAILED, OPEN, PUBLISHED, RESTORED
from ckpt_events.participants.cli.report.model import trace_spans
from ckpt_events.participants.cli.report.overview import Run, RunRow
from ckpt_events.participants.cli.report.overview_terminal import DETAILED_UNPUBLISHED
from ckpt_events.participants.cli.report.run_totals import run_lines
from ckpt_events.participants.cli.report.trends import MIN_CHECKPOINTS
from ckpt_events.participants.cli.text import escape_html, short_id
from ckpt_events.participants.cli.words import counted

__all__ = ["ALL_WATERFALLS", "OUTCOME_FILLS", "run_page", "write_run_page"]

ALL_WATERFALLS: Final = 200
#: Outcome colours, none of them a participant kind's (``KINDS.palette()``: a test keeps the two
#: sets apart): dark and neutral for what went well, warm for what did not.
OUTCOME_FILLS = {
    PUBLISHED: "#334155",
    RESTORED: "#94a3b8",
    ABORTED: "#ea580c",
    FAILED: "#dc2626",
    OPEN: "#be185d",
}
_STRIP_W = 1200
_STRIP_H = 34
_RUN_STYLE = """
.strip a rect:hover { stroke: #111; stroke-width: 1.5; } .cause { text-align: left; }
.legend { font-size: 12px; color: #333; margin: 4px 0 8px; } .legend span { margin-right: 14px; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: -1px; margin-right: 4px; }
details > summary { cursor: pointer; font-weight: 600; font-size: 1.2em; margin: 8px 0; }
td.outcome { font-weight: 600; }
#overview td:nth-child(-n+3), #overview th:nth-child(-n+3), #overview td:nth-child(7),
#overview th:last-child, #trends td:nth-child(-n+3), #trends th:nth-child(-n+3) { text-align: left; }
:target { outline: 2px solid #2563eb; } .run-line { margin: 4px 0; }
.run-line.warning { color: #92400e; background: #fef3c7; padding: 2px 6px; }
#overview td:nth-child(3), #overview td:nth-child(4) { white-space: nowrap; }
"""


def _strip(run: Run) -> str:
    lo = min((r.start_ns for r in run.rows), default=run.first_ns)
    hi = max([run.last_ns, *(r.end_ns or run.last_ns for r in run.rows)])
    total = max(1, hi - lo)
    out = [
        f'<svg class="strip" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_STRIP_W} {_STRIP_H + 16}" '
        f'width="100%" role="img" aria-label="checkpoints over time" font-size="11" '
        f'font-family="system-ui, sans-serif">',
        f'<rect x="0" y="0" width="{_STRIP_W}" height="{_STRIP_H}" fill="#f5f5f5"/>',
    ]
    for number, row in enumerate(run.rows, 1):
        end = row.end_ns if row.end_ns is not None else row.logs_end_ns or hi
        x = (row.start_ns - lo) / total * _STRIP_W
        width = max(2.0, (end - row.start_ns) / total * _STRIP_W)
        fill = OUTCOME_FILLS.get(row.outcome, "#6b7280")
        ms = "open" if row.end_ns is None else "duration unknown" if row.ms is None else f"{row.ms:.1f} ms"
        tip = escape_html(f"#{number} {row.what} {short_id(row.checkpoint_id)}: {row.outcome}, {ms}")
        out.append(
            f'<a href="#row-{number}"><rect class="checkpoint" data-row="{number}" '
            f'data-outcome="{escape_html(row.outcome)}" x="{x:.1f}" y="4" width="{width:.1f}" '
            f'height="{_STRIP_H - 8}" fill="{fill}"><title>{tip}</title></rect></a>'
        )
    out.append(f'<text x="0" y="{_STRIP_H + 13}" fill="#555">{_when(lo)} UTC</text>')
    out.append(
        f'<text x="{_STRIP_W}" y="{_STRIP_H + 13}" text-anchor="end" fill="#555">'
        f"+{total / 1e9:.1f} s</text></svg>"
    )
    return "\n".join(out)


def _strip_legend(run: Run) -> str:
    """The outcome colours of the strip (and of the table's outcome column), with their counts."""
    seen: dict[str, int] = {}
    for row in run.rows:
        seen[row.outcome] = seen.get(row.outcome, 0) + 1
    items = "".join(
        f'<span data-outcome="{escape_html(outcome)}"><i class="swatch" style="background:{fill}"></i>'
        f"{escape_html(outcome)} ({seen.get(outcome, 0)})</span>"
        for outcome, fill in OUTCOME_FILLS.items()
    )
    return f'<div class="legend" id="strip-legend">outcome: {items}</div>'


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]


def _table(run: Run, drawn: set[int]) -> str:
    head = "".join(
        f"<th>{c}</th>"
        for c in ("#", "what", "id", "start (UTC)", "ms", "paused ms", "outcome", "cause or critical path")
    )
    body = []
    for number, row in enumerate(run.rows, 1):
        said = "; ".join(row.causes) if row.causes else row.critical_path
        said = "; ".join(x for x in (said, row.never_finished) if x)
        link = f' <a href="#detail-{number}">waterfall</a>' if id(row) in drawn else ""
        if row.what == "restore":
            source = (
                f'<a href="#row-{row.source_row}">#{row.source_row}</a>'
                if row.source_row
                else "not in these logs"
            )
            said = "; ".join(x for x in (said, row.dominated, row.episodes_text) if x)
            link = f" (restored from {source}){link}"
        colour = OUTCOME_FILLS.get(row.outcome, "#6b7280")
        body.append(
            f'<tr id="row-{number}"><td>{number}</td><td>{escape_html(row.what)}</td>'
            f"<td>{escape_html(short_id(row.checkpoint_id))}</td>"
            f"<td>{_when(row.start_ns)}</td><td>{row.ms_text}</td>"
            f"<td>{'' if row.paused_ms is None else f'{row.paused_ms:.1f}'}</td>"
            f'<td class="outcome" style="color:{colour}">{escape_html(row.outcome)}</td>'
            f'<td class="cause">{escape_html(said)}{link}</td></tr>'
        )
    rows = "\n".join(body)
    return f'<div class="wrap"><table id="overview"><tr>{head}</tr>\n{rows}</table></div>'


def _run_lines(run: Run) -> str:
    """The terminal's run-wide lines (the fleet's pause, the episodes after the restores, the
    counted events that named no checkpoint), a warning marked as the terminal colours it."""
    return "\n".join(
        f'<p class="run-line{" warning" if line.warning else ""}">{escape_html(line.text)}</p>'
        for line in run_lines(run)
    )


def _trends(run: Run) -> str:
    trends = run.trends.table()
    if sum(r.what == "checkpoint" for r in run.rows) < MIN_CHECKPOINTS or not trends:
        return ""
    head = "".join(f"<th>{c}</th>" for c in ("kind", "operation", "step", "n", "p50 ms", "p95 ms", "max ms"))
    body = "\n".join(
        "<tr>"
        + "".join(f"<td>{escape_html(part)}</td>" for part in t.key)
        + f"<td>{t.count}</td><td>{t.p50:.1f}</td><td>{t.p95:.1f}</td><td>{t.max:.1f}</td></tr>"
        for t in trends
    )
    flags = run.trends.flags()
    listed = "".join(f'<li class="flag">{escape_html(f)}</li>' for f in flags)
    said = counted(len(trends), "row") + (f", {counted(len(flags), 'flag')}" if flags else ", no flags")
    # Collapsed, and after the waterfalls: a long table must not push them off the first screen.
    return (
        '<details id="trends-details"><summary>trends over the run\'s checkpoints (slowest instance '
        f"per checkpoint): {said}</summary>\n"
        + (f"<ul>{listed}</ul>" if listed else "")
        + f'<div class="wrap"><table id="trends"><tr>{head}</tr>\n{body}</table></div></details>'
    )


def _waterfalls(run: Run, details: dict[int, list[Any]]) -> list[str]:
    out = []
    for number, row in enumerate(run.rows, 1):
        events = details.get(id(row))
        if events is None:
            continue
        label = f"#{number} {row.what} {short_id(row.checkpoint_id)} ({row.outcome})"
        parts = [
            f'<section id="detail-{number}"><h2>{escape_html(label)} <a href="#row-{number}">↑ row</a></h2>'
        ]
        if row.causes:
            parts.append(f'<p class="line">{escape_html("; ".join(row.causes))}</p>')
        if (shared := run.shared_line(row)) is not None:
            parts.append(f'<p class="line">{escape_html(shared)}</p>')
        for trace in sorted(row.trace_ids, key=lambda t: min(s for tr, s in row.roots if tr == t)):
            spans = trace_spans(events, trace)
            if spans:
                parts.append(attribution_html(attribute(spans)))
                parts.append(waterfall_svg(spans, title=f"{row.what} {short_id(row.checkpoint_id)}"))
                if failed := failures_html(spans):
                    parts.append(failed.lstrip("\n"))
        if len(parts) == 1 + bool(row.causes) + (shared is not None):
            parts.append("<p>no finished span to draw (every span of it is still open)</p>")
        out.append("\n".join(parts) + "</section>")
    return out


def run_page(run: Run, details: dict[int, list[Any]], *, title: str) -> str:
    """The page for ``run``; ``details`` (from ``Run.details``) holds the rows to draw."""
    drawn = set(details)
    not_all = (
        f"<p>{len(drawn)} of {len(run.rows)} waterfalls drawn (the slowest published checkpoint and "
        f"the first {DETAILED_UNPUBLISHED} that did not publish); <code>--checkpoint ID</code> draws "
        "any other.</p>"
        if len(drawn) < len(run.rows)
        else ""
    )
    rows = counted(len(run.rows), "checkpoint or restore", "checkpoints and restores")
    trends = _trends(run)
    flags = (
        f'<p class="flags">{counted(len(run.trends.flags()), "trend flag")}: '
        + "; ".join(escape_html(f) for f in run.trends.flags())
        + ' (<a href="#trends-details">trends table</a>, below the waterfalls)</p>'
        if trends and run.trends.flags()
        else ""
    )
    return (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>{PAGE_POLICY}"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape_html(title)}</title><style>{PAGE_STYLE}{_RUN_STYLE}</style></head><body>\n"
        f"<h1>{escape_html(title)}</h1>\n"
        f"<section id='run'><h2>run overview: {rows}</h2>\n"
        f"{_strip(run)}\n{_strip_legend(run)}\n{_table(run, drawn)}\n{not_all}{flags}"
        f"{_run_lines(run)}</section>\n"
        + "\n".join(_waterfalls(run, details))
        + f"\n{trends}\n<div id='tip'></div>\n<script>{PAGE_SCRIPT}</script>\n</body></html>\n"
    )


def rows_to_draw(run: Run, chosen: Sequence[RunRow]) -> list[RunRow]:
    """Every row for a run of at most ``ALL_WATERFALLS`` rows, else the chosen ones."""
    return list(run.rows) if len(run.rows) <= ALL_WATERFALLS else list(chosen)


def write_run_page(path: Path, run: Run, chosen: Sequence[RunRow], *, title: str) -> str:
    """Write the page (one more pass over the logs for the rows drawn) and say what was written."""
    details = run.details(rows_to_draw(run, chosen))
    path.write_text(run_page(run, details, title=title))
    return f"report written to {path} (HTML page: the run overview and {counted(len(details), 'waterfall')})"
