"""A checkpoint across 64 participants (16 servers of each kind) stays readable: each stage's
parallel calls of one kind fold to the slowest call and a ``+N more`` row, in the terminal at
80 and 160 columns and in the SVG waterfall."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.report.folding import Folded, waterfall_rows
from ckpt_events.participants.cli.report.html import waterfall_svg
from ckpt_events.participants.cli.report.model import Span, trace_spans
from ckpt_events.participants.cli.report.paths import on_critical_path
from ckpt_events.participants.cli.report.terminal import render_waterfall
from ckpt_events.vocab import CollectionAction, Kind, Operation, Step

MS = 1_000_000
T = 11
KINDS = (Kind.ENVIRONMENT, Kind.MODEL, Kind.AGENT, Kind.RESOURCES)
SERVERS = 16


def _fleet() -> list[Any]:
    """Prepare, commit (each with a write step) and resume on 64 participants, calls staggered
    as a controller sends them; environment-11's commit (120 ms) is the slowest call."""
    events: list[Any] = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 300 * MS, CollectionAction.CHECKPOINT, "k")
    ]
    span = 100
    for stage, (operation, lo, hi) in enumerate(
        ((Operation.PREPARE, 0, 100), (Operation.COMMIT, 100, 250), (Operation.RESUME, 250, 300)), 2
    ):
        events.append(CoordinateFinished(Kind.CONTROLLER, "c", T, stage, lo * MS, hi * MS, operation, "k", 1))
        for k, kind in enumerate(KINDS):
            for i in range(SERVERS):
                start = lo + 1 + i * 0.5 + k * 0.1
                ms = {Operation.PREPARE: 3 + (i % 5) * 0.2, Operation.COMMIT: 50 + i, Operation.RESUME: 2}[
                    operation
                ]
                if operation is Operation.COMMIT and kind is Kind.ENVIRONMENT and i == 11:
                    ms = 120
                span += 1
                a, b = int(start * MS), int((start + ms) * MS)
                events.append(
                    OperationFinished(kind, f"{kind.value}-{i}", T, span, a, b, operation, "k", stage)
                )
                if operation is Operation.COMMIT:
                    events.append(
                        StepFinished(
                            kind, f"{kind.value}-{i}", T, span + 10_000, a + MS, b - MS, Step.WRITE, "k", span
                        )
                    )
    return events


def _operations(rows: list[Any]) -> list[Span]:
    return [r for r in rows if isinstance(r, Span) and r.details["type"] == "OperationFinished"]


def test_each_stage_keeps_its_slowest_call_and_counts_the_rest() -> None:
    """Per stage and kind: the kept calls plus the folded count are the 16 calls; the slowest
    call of each group is kept; nothing else is lost (every operation is drawn or counted)."""
    spans = trace_spans(_fleet(), T)
    assert len(_operations(spans)) == 3 * 64
    rows = waterfall_rows(spans, on_critical_path(spans))
    folded = [r for r in rows if isinstance(r, Folded)]
    assert len(folded) == 3 * 4
    kept = _operations(rows)
    for f in folded:
        mine = [s for s in kept if s.short == f.name and s.who.startswith(f"{f.kind}/")]
        assert f.count + len(mine) == SERVERS, (f.label, [s.who for s in mine])
        group = [s for s in spans if s.short == f.name and s.who.startswith(f"{f.kind}/") and s.participant]
        assert max(group, key=lambda s: s.ms) in mine
        assert f.max_ms <= max(s.ms for s in mine)
    assert len(rows) < 60 < len(spans)


def test_terminal_waterfall_of_64_participants_at_80_and_160_columns() -> None:
    """Bounded lines, nothing cut, the slowest call named with its instance, each folded row
    saying how many calls it holds."""
    spans = trace_spans(_fleet(), T)
    for width in (80, 160):
        console = Console(file=io.StringIO(), width=width, record=True)
        console.print(render_waterfall(spans, width, title="fleet"))
        text = console.export_text()
        lines = text.splitlines()
        assert len(lines) < 70, (width, len(lines))
        assert max(len(line) for line in lines) <= width and "…" not in text
        assert "commit environment-11" in text and "120.0" in text
        counts = [int(n) for n in re.findall(r"\+(\d+) more (?:prepare|commit|resume) on", text)]
        assert len(counts) == 12 and all(n in (14, 15) for n in counts), counts


def test_svg_waterfall_of_64_participants_folds_the_same_way() -> None:
    """The SVG draws the same rows: one bar per kept span, one pale bar per folded group whose
    ``data-count`` adds up with the kept calls to every call."""
    spans = trace_spans(_fleet(), T)
    svg = waterfall_svg(spans, title="fleet")
    drawn = len(re.findall(r'<rect class="span"', svg))
    counts = [int(n) for n in re.findall(r'<rect class="folded" data-count="(\d+)"', svg)]
    rows = waterfall_rows(spans, on_critical_path(spans))
    assert drawn == sum(isinstance(r, Span) for r in rows) < 70
    assert len(counts) == 12 and sum(counts) + len(_operations(rows)) == 3 * 64
    assert "+15 more commit on model" in svg or "+14 more commit on model" in svg
    assert 'class="legend"' in svg and "critical path" in svg
