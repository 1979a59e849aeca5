"""The report's terminal view (``participants.cli.report.terminal``): both waterfalls and the
attribution line, within 80 columns, nothing cut."""

from __future__ import annotations

import io

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
        assert "checkpoint: waterfall" in text and "restore: waterfall" in text
        assert text.count("ms unattributed") == 2
        for kind in ("environment-0", "model-0", "agent-0", "resources-0"):
            assert kind in text
