"""The report's terminal view (``participants.cli.report.terminal``): both waterfalls and the
attribution line, within 80 columns, nothing cut."""

from __future__ import annotations

import io
import re

from rich.console import Console

from ckpt_events.participants.cli.report.terminal import render
from tests.participants.cli.report_events import checkpoint_and_restore as emit


async def test_terminal_report_fits_80_columns_with_nothing_cut() -> None:
    """At 80 columns no line is longer and no cell is ellipsized; both waterfalls and the line are there."""
    events = await emit()
    for width in (80, 120, 200):
        console = Console(file=io.StringIO(), width=width, record=True)
        render(console, events, title="a report")
        text = console.export_text()
        assert "…" not in text, width
        assert max(len(line) for line in text.splitlines()) <= width
        # Each heading names its checkpoint (a restore's: the checkpoint it restored).
        assert "checkpoint c1: waterfall" in text and "restore c1: waterfall" in text
        assert text.count("ms unattributed") == 2
        for kind in ("environment-0", "model-0", "agent-0", "resources-0"):
            assert kind in text


def _figures(table: object, width: int) -> list[str]:
    """The ms figures of a rendered waterfall, each as printed (a split one in parts)."""
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    # The ms column (9 wide, right-justified) ends with the header's "ms".
    end = lines[1].index(" ms ") + 3
    return [line[end - 9 : end].strip() for line in lines[2:] if line[end - 9 : end].strip()]


async def test_narrow_waterfalls_keep_every_figure_whole() -> None:
    """At 40 to 60 columns the span names fold, never the ms figures: given the names' 40
    columns at 40, the ms column was squeezed to 3 and ``▶99.8`` printed as ``▶99`` over ``.8``."""
    from ckpt_events.participants.cli.report.model import checkpoint_and_restore, trace_spans
    from ckpt_events.participants.cli.report.terminal import render_waterfall

    events = await emit()
    for trace_id in checkpoint_and_restore(events):
        assert trace_id is not None
        spans = trace_spans(events, trace_id)
        wide = _figures(render_waterfall(spans, 200), 200)
        # Whole figures: one decimal from 1 ms, two significant digits under it (``0.56``).
        assert len(wide) == len(spans) and all(re.fullmatch(r"▶?\d+\.\d+", f) for f in wide), wide
        for width in (40, 50, 60):
            assert _figures(render_waterfall(spans, width), width) == wide, width
