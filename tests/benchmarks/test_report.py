"""``report.print_table``: what a row says is printed as it is, brackets included."""

from __future__ import annotations

import pytest

from ckpt_events.benchmarks import report, rotel


def test_a_skipped_rows_install_hint_keeps_its_extra(capsys: pytest.CaptureFixture[str]) -> None:
    """rich took ``[dev]`` in "pip install 'ckpt-events[dev]'" for markup and printed 'ckpt-events'."""
    why = rotel.why_missing({})
    assert "'ckpt-events[dev]'" in why
    report.print_table("a [bold]title[/bold]", [(f"otlp ({why})", None, "<= [1.15]", None)])
    printed = capsys.readouterr().out  # wrapped at spaces: none of these holds one
    assert "'ckpt-events[dev]'" in printed
    assert "a [bold]title[/bold]" in printed and "<= [1.15]" in printed
