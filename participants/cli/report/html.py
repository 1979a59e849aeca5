"""The report as a picture: SVG waterfalls and one self-contained HTML page.

Each waterfall is an SVG with a ``viewBox`` and ``width="100%"``, so it scales to its
container (readable from 1000 to 1920 px): a time axis with ticks, one row per span (children
under their parents, in start order), the participant's request transit and queueing drawn
as pale segments around its handler, the critical path underlined (and its spans' names
bold), a stage's large group of parallel calls folded to its slowest call, and a legend on
top. Each bar has a ``<title>`` (native tooltip) and ``data-details`` (every field of its
event) that the page's own small script shows on hover. No external resource: the page opens offline.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ckpt_events import CheckpointEvent, Event
from ckpt_events.participants.cli.report.attribution import Attribution, attribute
from ckpt_events.participants.cli.report.cancels import CANCELLED_MARK, is_cancelled, mark
from ckpt_events.participants.cli.report.failures import failure_lines, said
from ckpt_events.participants.cli.report.folding import Folded, error_type, waterfall_rows
from ckpt_events.participants.cli.report.model import (
    OUTSIDE_BAR,
    Span,
    checkpoint_and_restore,
    drawn_extent,
    outside,
    queued_on_row,
    trace_spans,
)
from ckpt_events.participants.cli.report.named import earlier_said, heading_said, named_line
from ckpt_events.participants.cli.report.operations import (
    OperationRow,
    counted_figures,
    operation_columns,
    unknown_line,
)
from ckpt_events.participants.cli.report.paths import Section, critical_path, on_critical_path
from ckpt_events.participants.cli.report.stall_blame import WAITING
from ckpt_events.participants.cli.report.timeline import (
    Breakdown,
    breakdown,
    breakdown_columns,
    counts,
    shown_rows,
    spans_of,
    summed_over,
)
from ckpt_events.participants.cli.text import escape, escape_html, short_id
from ckpt_events.participants.cli.words import counted, milliseconds
from ckpt_events.participants.workloads.registry import KINDS, KindRegistry, colour_of
from ckpt_events.vocab import CountedEvent

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import Whole

__all__ = [
    "FILLS",
    "PAGE_POLICY",
    "PAGE_SCRIPT",
    "PAGE_STYLE",
    "attribution_html",
    "failures_html",
    "html_page",
    "waterfall_svg",
    "write_timeline",
]

#: Fill of the controller's and each participant kind's bars (``KINDS``; the terminal uses the
#: same colours).
FILLS: Final = KINDS.palette()
_ERROR = "#dc2626"
#: A cancelled span's bar: grey hatching in a dark grey outline, never the failure's red.
_CANCELLED_STROKE = "#4b5563"
_CANCELLED_HATCH = (
    '<pattern id="{id}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    '<rect width="6" height="6" fill="#e5e7eb"/><rect width="2.5" height="6" fill="#9ca3af"/></pattern>'
)
_CRITICAL = "#111"
_ROW = 20
_LABEL_W = 380
_BAR_W = 900
#: Title, legend and axis above the first row.
_TOP = 70


def _label(s: Span) -> str:
    label = f"{s.short}  {s.who}" if s.participant else s.short
    # A failed span says how: a wide fleet's failure is drawn, never only counted (``folding``).
    failed = error_type(s)
    return label if failed is None else f"{label} {mark(failed)} {failed}"


#: A generous width of one character of the labels (12 px system-ui, bold), to cut a label
#: before it reaches the bars: SVG text never wraps, and a 60-character instance name ran over them.
_CHAR_W = 7.2


def _label_text(label: str, indent: int) -> str:
    """``label`` as the escaped content of its ``<text>``, fitted to the label column from
    ``indent``: a longer one keeps its start (span and kind) and its end (where instance names
    differ) around a ``…``, and holds its whole self in a ``<title>`` (shown on hover)."""
    shown = escape(label)  # cut as shown: a control character is four characters wide
    most = max(8, int((_LABEL_W - 8 - indent) / _CHAR_W))
    if len(shown) <= most:
        return escape_html(shown)
    tail = most // 2
    cut = f"{shown[: most - 1 - tail]}…{shown[-tail:]}"
    return f"<title>{escape_html(shown)}</title>{escape_html(cut)}"


def failures_html(spans: Sequence[Span]) -> str:
    """Under a waterfall, why its failed spans failed: each exception's message once, one
    ``<p class="line">`` each (``failures.failure_lines``); ``""`` when none holds a message."""
    return "".join(f'\n<p class="line">{escape_html(line)}</p>' for line in failure_lines(spans))


def waterfall_svg(spans: list[Span], *, title: str, kinds: KindRegistry = KINDS) -> str:
    """One trace's waterfall as an SVG that scales to its container, each kind's bars in its
    colour in ``kinds``, the critical path's stretches underlined and its spans' names bold; a
    stage's large group of parallel calls shows its slowest call and one ``+N more`` row."""
    fills = kinds.palette_for(s.who.split("/", 1)[0] for s in spans)  # the legend: the kinds drawn
    critical_sections = critical_path(spans)
    critical = on_critical_path(spans)
    rows = waterfall_rows(spans, critical)
    t0, t1 = extent = drawn_extent(spans) if spans else (0, 1)
    total = max(1, t1 - t0)
    away = sum(outside(s, extent) for s in spans)
    # A span outside the root's own time (its clock stepped) is named, never drawn to scale.
    note = f"; {counted(away, 'span')} outside it not drawn: a clock that stepped?" if away else ""
    width, height = _LABEL_W + _BAR_W + 70, _TOP + _ROW * len(rows) + 14
    by_id = {s.span_id: s for s in spans}
    y_of: dict[int, int] = {}

    def x(t: int) -> float:
        return _LABEL_W + (min(t1, max(t0, t)) - t0) / total * _BAR_W

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet" font-family="system-ui, sans-serif" font-size="12" '
        f'role="img" aria-label="{escape_html(title)}">',
        f'<text x="4" y="16" font-weight="bold" font-size="14">{escape_html(title)} '
        f"({milliseconds(total / 1e6)}{escape_html(note)})</text>",
    ]
    # A hatch only where a cancelled span is drawn (a page without one is as it was), its id
    # the trace's own: a page holds several waterfalls.
    cut = any(isinstance(r, Span) and is_cancelled(error_type(r)) for r in rows)
    hatch = f"cancelled-{spans[0].span_id:016x}" if cut else None
    if hatch is not None:
        out.append(f"<defs>{_CANCELLED_HATCH.format(id=hatch)}</defs>")
    out += _legend(36, fills, hatch)
    out += _axis(total, height)
    folded_y: dict[int, int] = {}
    for i, row in enumerate(rows):
        y = _TOP + _ROW * i
        if i % 2:
            out.append(f'<rect x="0" y="{y}" width="{width}" height="{_ROW}" fill="#f5f5f5"/>')
        if isinstance(row, Folded):
            folded_y.update(dict.fromkeys(row.span_ids, y))
            out += _folded(row, y, x, fills)
            continue
        if outside(row, extent):
            indent = 4 + 14 * row.depth
            out.append(
                f'<text x="{indent}" y="{y + 14}">{_label_text(_label(row), indent)}</text>'
                f'<text class="outside" x="{_LABEL_W}" y="{y + 14}" fill="#888">'
                f"{escape_html(OUTSIDE_BAR)}</text>"
            )
            continue
        y_of[row.span_id] = y
        parent = by_id.get(row.parent_span_id or -1)
        out += _span_row(row, parent, y, x, fills, bold=row.span_id in critical, hatch=hatch)
    out += _critical_marks(critical_sections, y_of, _under_folded(spans, folded_y), x)
    out.append("</svg>")
    return "\n".join(out)


def _span_row(
    s: Span,
    parent: Span | None,
    y: int,
    x: Callable[[int], float],
    fills: Mapping[str, str],
    *,
    bold: bool,
    hatch: str | None = None,
) -> list[str]:
    """A span's row: its label (bold on the critical path), the transit and queueing around a
    participant's handler of a controller's call (``parent``), or its queueing alone, at the root
    or called by another participant (``queued_on_row``), its bar and its duration; a cancelled
    span's bar filled with the pattern ``hatch`` in a grey outline, a failed one's red."""
    out = []
    indent = 4 + 14 * s.depth
    weight = ' font-weight="bold"' if bold else ""
    out.append(f'<text x="{indent}" y="{y + 14}"{weight}>{_label_text(_label(s), indent)}</text>')
    gaps: tuple[tuple[int, int, str], ...] = ()
    if s.participant and parent is not None and parent.client:
        arrived = s.received_ns if s.received_ns is not None else s.start_ns
        gaps = (
            (parent.start_ns, arrived, "request transit"),
            (arrived, s.start_ns, "queued in participant"),
            (s.end_ns, parent.end_ns, "reply transit"),
        )
    elif (queued := queued_on_row(s, parent)) is not None:
        # No controller's call to draw it (no caller in the logs, or a participant called it):
        # its wait in the server, counted as queued, is drawn all the same.
        gaps = ((*queued, "queued in participant"),)
    for a, b, what in gaps:
        if b > a:
            out.append(
                f'<rect class="gap" x="{x(a):.1f}" y="{y + 7}" width="{max(0.5, x(b) - x(a)):.1f}" '
                f'height="6" fill="{colour_of(s.who, fills)}" opacity="0.3"><title>{what}: '
                f"{(b - a) / 1e6:.2f} ms</title></rect>"
            )
    fill = _ERROR if s.error else colour_of(s.who, fills)
    outline = ""
    if hatch is not None and is_cancelled(error_type(s)):
        fill, outline = f"url(#{hatch})", f' stroke="{_CANCELLED_STROKE}"'
    # JSON escapes every control character (ensure_ascii), so the attribute holds none.
    details = escape_html(json.dumps(s.details, default=str))
    # A span whose clock went back during it: its duration is unknown, never 0.0.
    ms, short_ms = (f"{s.ms:.2f}", milliseconds(s.ms).removesuffix(" ms")) if s.known else ("?", "?")
    why = "" if s.known else " (its clock went back during it)"
    # A failed span's tooltip says why too: its exception's type and message, clipped.
    failed = said(s)
    marked = "" if failed is None else f" {mark(error_type(s))} {failed}"
    tip = escape_html(f"{s.name} {s.who}: {ms} ms{why}{marked}")
    out.append(
        f'<rect class="span" data-span-id="{s.span_id:016x}" data-ms="{ms}" '
        f'data-details="{details}" x="{x(s.start_ns):.1f}" y="{y + 3}" '
        f'width="{max(1.0, x(s.end_ns) - x(s.start_ns)):.1f}" height="14" rx="2" fill="{fill}"{outline}>'
        f"<title>{tip}</title></rect>"
    )
    out.append(f'<text x="{x(s.end_ns) + 4:.1f}" y="{y + 14}" fill="#444">{short_ms} ms</text>')
    return out


def _under_folded(spans: Sequence[Span], folded_y: Mapping[int, int]) -> dict[int, int]:
    """Each span not drawn because its call was folded (the call and its subtree), by span id:
    the ``y`` of its group's ``Folded`` row. ``spans`` come parents first."""
    out = dict(folded_y)
    for s in spans:
        if s.span_id not in out and s.parent_span_id is not None and s.parent_span_id in out:
            out[s.span_id] = out[s.parent_span_id]
    return out


def _critical_marks(
    sections: Sequence[Section[Span]],
    y_of: Mapping[int, int],
    folded_y: Mapping[int, int],
    x: Callable[[int], float],
) -> list[str]:
    """The critical path as Jaeger draws it: a dark line over the stretch each span held it.

    A folded group's calls hold it on their ``Folded`` row, one stretch from the first to the
    last; the stretches of a drawn row that only calls of folded groups held the path between
    are one (a prepare calling 5,000 participants in turn: the controller's row is one mark
    over its 5,001 stretches, not one per pixel column, 395 kB of SVG then 45 kB at 1,000
    calls). Stretches of one row that share a pixel column are one mark over their union too.
    A mark of more than one stretch says how many (``data-count``) and the longest (its
    ``<title>``)."""
    # (start, end, how many, longest) per row, the sections taken in time order.
    stretches: dict[int, list[tuple[int, int, int, int]]] = {}
    last_drawn: int | None = None  # the drawn row that held the path last
    folded_since = False  # a folded call held it since
    for section in sorted(sections, key=lambda s: s.start_ns):
        span_id, ns = section.span.span_id, section.end_ns - section.start_ns
        if ns <= 0:
            continue
        if (row_y := y_of.get(span_id)) is not None:
            joined = folded_since and last_drawn == row_y
            last_drawn, folded_since = row_y, False
        elif (row_y := folded_y.get(span_id)) is not None:
            joined = row_y in stretches
            folded_since = True
        else:
            continue
        row = stretches.setdefault(row_y, [])
        if joined:
            first, _, count, longest = row[-1]
            row[-1] = (first, section.end_ns, count + 1, max(longest, ns))
        else:
            row.append((section.start_ns, section.end_ns, 1, ns))
    rows: dict[int, list[tuple[int, int, int, int]]] = {}
    for row_y, held in stretches.items():
        for start_ns, end_ns, count, longest_ns in held:
            # In tenths of a pixel, as drawn, so that which column a mark reaches is exact.
            left = round(x(start_ns) * 10)
            width = max(5, round((x(end_ns) - x(start_ns)) * 10))
            rows.setdefault(row_y, []).append((left, left + width, count, longest_ns))
    out = []
    for row_y, marks in rows.items():
        for left, right, count, longest_ns in _merged(marks):
            mark = (
                f'x="{left / 10:.1f}" y="{row_y + 9}" width="{(right - left) / 10:.1f}" height="2" '
                f'fill="{_CRITICAL}"'
            )
            if count == 1:
                out.append(f'<rect class="critical" {mark}/>')
            else:
                tip = f"critical path: {count:,} stretches merged, the longest {longest_ns / 1e6:.2f} ms"
                out.append(f'<rect class="critical" data-count="{count}" {mark}><title>{tip}</title></rect>')
    return out


def _merged(marks: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """``marks`` (left, right in tenths of a pixel, how many stretches, longest ns) of one row as
    the union of those that share a pixel column: (left, right, how many, longest ns), no two
    sharing a column."""
    out: list[tuple[int, int, int, int]] = []
    for left, right, many, ns in sorted(marks):
        # Columns left // 10 to (right - 1) // 10: shared when this one starts in the last one's.
        if out and left // 10 <= (out[-1][1] - 1) // 10:
            first, last, count, longest = out[-1]
            out[-1] = (first, max(last, right), count + many, max(longest, ns))
        else:
            out.append((left, right, many, ns))
    return out


def _folded(row: Folded, y: int, x: Callable[[int], float], fills: Mapping[str, str]) -> list[str]:
    """A folded group: its label, a pale bar from the first start to the last end, its summary."""
    fill = colour_of(row.kind, fills)
    tip = escape_html(f"{row.label}: {row.summary}")
    indent = 4 + 14 * row.depth
    return [
        f'<text class="folded" x="{indent}" y="{y + 14}" fill="#555" font-style="italic">'
        f"{_label_text(row.label, indent)}</text>",
        f'<rect class="folded" data-count="{row.count}" x="{x(row.start_ns):.1f}" y="{y + 5}" '
        f'width="{max(1.0, x(row.end_ns) - x(row.start_ns)):.1f}" height="10" fill="{fill}" opacity="0.35" '
        f'stroke="{fill}" stroke-dasharray="3 2"><title>{tip}</title></rect>',
        f'<text x="{x(row.end_ns) + 4:.1f}" y="{y + 14}" fill="#555">{escape_html(row.summary)}</text>',
    ]


def _axis(total_ns: int, height: int) -> list[str]:
    """Ticks at a round step (1, 2 or 5 x 10^n ms), about eight of them."""
    total_ms = total_ns / 1e6
    step = 1.0
    for candidate in (10.0**e * m for e in range(-2, 6) for m in (1, 2, 5)):
        step = candidate
        if total_ms / candidate <= 8:
            break
    out = [f'<line x1="{_LABEL_W}" y1="{_TOP - 6}" x2="{_LABEL_W + _BAR_W}" y2="{_TOP - 6}" stroke="#888"/>']
    tick = 0.0
    ticks = 0
    while tick <= total_ms + 1e-9 and ticks < 50:
        tx = _LABEL_W + tick / total_ms * _BAR_W if total_ms else _LABEL_W
        out.append(f'<line x1="{tx:.1f}" y1="{_TOP - 9}" x2="{tx:.1f}" y2="{height - 10}" stroke="#ddd"/>')
        out.append(f'<text x="{tx:.1f}" y="{_TOP - 12}" text-anchor="middle" fill="#555">{tick:g} ms</text>')
        tick, ticks = tick + step, ticks + 1
    return out


def _legend(y: int, fills: Mapping[str, str], hatch: str | None = None) -> list[str]:
    """What the colours and marks mean, on one line under the title; ``cancelled`` after
    ``error`` when a cancelled span is drawn, in its ``hatch``."""
    out, x = ['<g class="legend">'], 4
    for who, fill in (*fills.items(), ("error", _ERROR)):
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{fill}"/>')
        out.append(f'<text x="{x + 16}" y="{y}">{escape_html(who)}</text>')
        x += 30 + 7 * len(who)
    if hatch is not None:
        out.append(
            f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="url(#{hatch})" '
            f'stroke="{_CANCELLED_STROKE}"/>'
        )
        said = f"cancelled {CANCELLED_MARK}"
        out.append(f'<text x="{x + 16}" y="{y}">{said}</text>')
        x += 30 + 7 * len(said)
    out.append(f'<rect x="{x}" y="{y - 10}" width="22" height="12" fill="#bbb"/>')
    out.append(f'<rect x="{x}" y="{y - 5}" width="22" height="2" fill="{_CRITICAL}"/>')
    out.append(f'<text x="{x + 28}" y="{y}" font-weight="bold">critical path</text>')
    x += 120
    out.append(f'<rect x="{x}" y="{y - 7}" width="22" height="6" fill="#2563eb" opacity="0.3"/>')
    out.append(f'<text x="{x + 28}" y="{y}">request/reply transit, queued</text>')
    x += 225
    out.append(
        f'<rect x="{x}" y="{y - 9}" width="22" height="10" fill="#888" opacity="0.35" stroke="#888" '
        'stroke-dasharray="3 2"/>'
    )
    out.append(f'<text x="{x + 28}" y="{y}">+N more: parallel calls folded, the slowest drawn</text>')
    out.append("</g>")
    return out


#: The page's style and tooltip script, shared with the run page (``run_page``).
PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #111; max-width: 1880px; }
section { margin-bottom: 28px; } svg { display: block; }
.line { font-weight: 600; } .parts { color: #555; font-size: 13px; }
.wrap { overflow-x: auto; } table { border-collapse: collapse; font-size: 12px; width: 100%; }
td, th { padding: 3px 5px; text-align: right; } th { white-space: normal; vertical-align: bottom; }
td:first-child, th:first-child { text-align: left; } tr:nth-child(even) { background: #f5f5f5; }
#tip { position: fixed; display: none; background: #fff; border: 1px solid #999; padding: 6px 8px;
  font: 12px ui-monospace, monospace; white-space: pre; pointer-events: none; max-width: 640px;
  box-shadow: 0 2px 8px rgba(0,0,0,.2); z-index: 2; }
"""
PAGE_SCRIPT = """
const tip = document.getElementById('tip');
document.querySelectorAll('rect.span').forEach(function (r) {
  r.addEventListener('mousemove', function (ev) {
    const d = JSON.parse(r.dataset.details);
    tip.textContent = Object.keys(d).map(function (k) { return k + ': ' + d[k]; }).join('\\n');
    tip.style.display = 'block';
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 660) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  });
  r.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
});
document.body.dataset.ready = String(document.querySelectorAll('rect.span').length);
"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(PAGE_SCRIPT.encode()).digest()).decode()
#: The pages' Content-Security-Policy, first in their ``<head>``: every string from a log is
#: escaped, and should one escape be missed, a script it smuggled in still would not run (only
#: the page's own script, by its hash) nor fetch anything. Styles stay inline: the page is one file.
PAGE_POLICY: Final = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
    f"script-src 'sha256-{_SCRIPT_HASH}'; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'\">"
)


def attribution_html(attribution: Attribution | None) -> str:
    if attribution is None:
        return ""
    root, line = escape_html(attribution.root), escape_html(attribution.line())
    page = f'<p class="line" data-attribution="{root}">{line}</p>'
    # Left out when it has nothing to say, as in the terminal (it opened with "; ").
    if parts := attribution.parts_line():
        page += f'\n<p class="parts">{escape_html(parts)}</p>'
    return page


def _table_html(rows: list[Breakdown]) -> str:
    """The breakdown table, the terminal's rows and figures: past ``FLEET`` participants one row
    per kind (``shown_rows``; 5,000 participants made a table of 5,000 rows, 486 kB), a line
    under it saying how many participants each such row folds."""
    rows = shown_rows(rows)
    columns = breakdown_columns(rows)
    head = "".join(
        f"<th>{escape_html(c)}</th>" for c in ("participant", *columns, "records committed", "bytes written")
    )
    body = []
    for r in rows:
        # ``?`` where a duration is unknown (a clock went back), blank where there is none.
        cells = "".join(
            "<td>?</td>"
            if c in r.unknown
            else f"<td>{milliseconds(r.ms[c]).removesuffix(' ms')}</td>"
            if c in r.ms
            else "<td></td>"
            for c in columns
        )
        who = f"{escape_html(r.kind)}/<wbr>{escape_html(r.instance)}"
        who = who if r.worker is None else f"&nbsp;&nbsp;└ worker {escape_html(r.worker)}"
        if r.folded:
            who = f"{escape_html(r.kind)} {escape_html(r.instance)}"
        who += escape_html(r.errors_said)
        amounts = "".join(f"<td>{'-' if v is None else f'{v:,}'}</td>" for v in (r.records, r.bytes))
        body.append(f"<tr><td>{who}</td>{cells}{amounts}</tr>")
    rows_html = "\n".join(body)
    page = f'<div class="wrap"><table id="participants"><tr>{head}</tr>\n{rows_html}</table></div>'
    if folded := [r for r in rows if r.folded]:
        each = "; ".join(f"{escape_html(r.kind)}: {counted(r.folded, 'participant')}" for r in folded)
        page += (
            f'\n<p class="parts" id="folded">{counted(sum(r.folded for r in folded), "participant")} '
            f"folded into one row per kind ({each}): each column its longest participant's ms, "
            "records and bytes summed</p>"
        )
    return page


def _operations_html(rows: list[OperationRow]) -> str:
    """The per-operation table (``OperationRow``), as the terminal's: ``-`` where no ok span
    gives a figure."""
    counted_columns = operation_columns(rows)
    head = "".join(
        f"<th>{c}</th>" for c in ("kind", "operation", "step", *counted_columns, "p50 ms", "p95 ms", "max ms")
    )
    body = []
    for r in rows:
        names = "".join(f"<td>{escape_html(v)}</td>" for v in (r.kind, r.operation, r.step))
        figures = "".join(
            f"<td>{'-' if ms is None else milliseconds(ms).removesuffix(' ms')}</td>"
            for ms in (r.p50_ms, r.p95_ms, r.max_ms)
        )
        figured = "".join(f"<td>{c}</td>" for c in counted_figures(r, counted_columns))
        body.append(f"<tr>{names}{figured}{figures}</tr>")
    rows_html = "\n".join(body)
    page = f'<div class="wrap"><table id="operations"><tr>{head}</tr>\n{rows_html}</table></div>'
    if (unknown := unknown_line(rows)) is not None:
        page += f'\n<p class="parts">{escape_html(unknown)}</p>'
    return page


def _counts_html(tallies: Mapping[str, Counter[str]]) -> str:
    """The counted events (refusals by code, lease expiries, ...), as the terminal's table."""
    body = [
        f"<tr><td>{escape_html(name)}</td><td>{escape_html(key)}</td><td>{value:,}</td></tr>"
        for name in (*CountedEvent, WAITING)
        for key, value in sorted(tallies.get(name, Counter()).items())
    ]
    rows = "\n".join(body) or "<tr><td>(none)</td><td></td><td>0</td></tr>"
    return (
        '<div class="wrap"><table id="counted"><tr><th>event</th><th>by</th><th>count</th></tr>\n'
        f"{rows}</table></div>"
    )


def _named_html(named: Sequence[Sequence[CheckpointEvent]], earlier: int, kinds: KindRegistry) -> list[str]:
    """One section per trace of a checkpoint id of logs with no controller (``Whole.named``),
    in time order: its line (operation, outcome, where its time went) and its waterfall."""
    said = heading_said(named)
    if (left_out := earlier_said(named, earlier)) is not None:
        said += f"; {left_out}"
    sections = [f'<section id="named"><h2>{escape_html(said)}</h2></section>']
    for number, events in enumerate(named, earlier + 1):
        line = named_line(events)
        title = f"#{number} {line.title}"
        drawn = (
            waterfall_svg(line.spans, title=f"#{number} {line.operation}", kinds=kinds)
            + failures_html(line.spans)
            if line.spans
            else ""
        )
        sections.append(
            f'<section id="trace-{number}"><h2>{escape_html(title)}</h2>\n'
            f'<p class="line">{escape_html(line.figures)}</p>\n{drawn}</section>'
        )
    return sections


def html_page(
    events: Sequence[Event],
    *,
    title: str = "checkpoint report",
    kinds: KindRegistry = KINDS,
    tallies: Mapping[str, Counter[str]] | None = None,
    whole: Whole | None = None,
) -> str:
    """The whole report as one HTML page: attribution and waterfall of the checkpoint and of
    the restore, then of any other trace, then the per-participant table (each kind in its
    colour in ``kinds``), then the counted events (``tallies``, default those of ``events``:
    a log of refusals alone showed an empty table and nothing of them). ``whole``, the tables
    of logs with no controller's row (``Run.whole``, ``events`` its drawn trace alone): its
    breakdown, per-operation table and counted events are shown instead of ``events``'."""
    traces = whole.named if whole is not None else []
    checkpoint, restore = checkpoint_and_restore(events) if not traces else (None, None)
    sections = [] if not traces else _named_html(traces, whole.earlier if whole is not None else 0, kinds)
    for label, trace_id in (("checkpoint", checkpoint), ("restore", restore)):
        if trace_id is None:
            continue
        spans = trace_spans(events, trace_id)
        attribution = attribute(spans)
        # Which checkpoint: a restore's id is the checkpoint it restored.
        named = label
        if attribution is not None and attribution.checkpoint_id is not None:
            named = f"{label} {escape_html(short_id(attribution.checkpoint_id))}"
        sections.append(
            f'<section id="{label}"><h2>{named}</h2>\n{attribution_html(attribution)}\n'
            f"{waterfall_svg(spans, title=label, kinds=kinds)}{failures_html(spans)}</section>"
        )
    # The table adds up every checkpoint and restore of ``events``: say so, as the terminal does.
    if whole is not None:
        # The whole logs' sums (was: the drawn trace's alone, one restore's 20.5 ms where the
        # terminal showed every commit's too), then what one request takes.
        heading = "time per participant (ms, every request summed)"
        sections.append(f"<section><h2>{heading}</h2>\n{_table_html(whole.breakdown)}</section>")
        if whole.operations:
            heading = "per operation and step (ms; p50, p95, max of the ok ones)"
            sections.append(f"<section><h2>{heading}</h2>\n{_operations_html(whole.operations)}</section>")
        tallies = whole.counts if tallies is None else tallies
    else:
        summed = summed_over(events)
        heading = f"time per participant (ms), {summed}" if summed else "time per participant (ms)"
        sections.append(f"<section><h2>{heading}</h2>\n{_table_html(breakdown(events))}</section>")
    counted_html = _counts_html(counts(events) if tallies is None else tallies)
    sections.append(f"<section><h2>counted events</h2>\n{counted_html}</section>")
    return (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>{PAGE_POLICY}"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape_html(title)}</title><style>{PAGE_STYLE}</style></head><body>\n"
        f"<h1>{escape_html(title)}</h1>\n"
        + "\n".join(sections)
        + f"\n<div id='tip'></div>\n<script>{PAGE_SCRIPT}</script>"
        "\n</body></html>\n"
    )


def write_timeline(
    path: Path,
    spans: list[Span] | None = None,
    *,
    events: Sequence[Event] = (),
    title: str = "checkpoint timeline",
    tallies: Mapping[str, Counter[str]] | None = None,
    whole: Whole | None = None,
) -> None:
    """Write ``.svg`` (one waterfall: ``spans``, else the checkpoint of ``events``) or, for any
    other suffix, the HTML page of ``events`` (``.png`` is ``report_png``'s)."""
    if path.suffix.lower() == ".svg":
        path.write_text(waterfall_svg(spans if spans is not None else spans_of(events), title=title) + "\n")
    else:
        path.write_text(html_page(events, title=title, tallies=tallies, whole=whole))
