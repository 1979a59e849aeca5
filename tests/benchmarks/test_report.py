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


@pytest.mark.parametrize(("columns", "widest"), [("80", 80), ("", 110), ("12", 110)])
def test_a_piped_table_keeps_to_columns(
    columns: str, widest: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped, the table was drawn 110 columns wide whatever ``$COLUMNS`` said (a narrow CI log
    wrapped every line); too small a number keeps the default."""
    monkeypatch.setenv("COLUMNS", columns)
    row = ("server CPU/request: ckpt-events, every sink in configure()'s export process / uninstrumented",)
    report.print_table("a table", [(*row, 1.108, "<= 1.08", False)] * 3)
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= widest
    assert max(map(len, lines)) > widest - 10  # the long row fills the width it has


def test_a_long_hint_in_a_narrow_table_wraps_and_is_never_cut(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """At 80 columns a skipped row's variable name was cut to 'CKPT_EVENTS_BENCH_NEMO_LENS_…':
    the row no longer said how to get it."""
    monkeypatch.setenv("COLUMNS", "80")
    why = "skipped: no interpreter given (--nemo-lens-python PATH or CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON)"
    rows = [
        ("added CPU/request, ours (OTLP) / the SDK's", "0.156 (0.106-0.201 over 7 rounds)", "<= 0.15", False),
        (f"nemo-lens / uninstrumented ({why})", None, "", None),
    ]
    report.print_table("a table", rows)
    printed = capsys.readouterr().out
    assert "…" not in printed
    cells = "".join(line.split("│")[1].strip() for line in printed.splitlines() if line.startswith("│"))
    assert "CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON" in cells
