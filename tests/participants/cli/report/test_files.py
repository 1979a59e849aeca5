"""Where a report is written (``participants.cli.report.files``): a path refused up front when it cannot
be written as asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.report.files import check_report_path, holds_the_run


def test_png_without_a_browser_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no Chromium on PATH, a .png report is refused up front, in one line naming what to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CKPT_EVENTS_CHROMIUM", raising=False)
    refusal = check_report_path(tmp_path / "t.png")
    assert refusal is not None and "\n" not in refusal and "chromium" in refusal
    assert check_report_path(tmp_path / "t.html") is None and check_report_path(tmp_path / "t.svg") is None


def test_a_folder_or_an_unknown_ending_is_refused_and_perfetto_holds_the_run(tmp_path: Path) -> None:
    """The file name's ending picks the format: a folder or another ending is one line naming the
    endings; a Perfetto trace is the one format that holds every trace of the run."""
    for bad in (tmp_path, tmp_path / "report.pdf"):
        refusal = check_report_path(bad)
        assert refusal is not None and "\n" not in refusal and ".html" in refusal
    assert check_report_path(tmp_path / "run.perfetto.json") is None
    assert holds_the_run(tmp_path / "Run.Perfetto.JSON") and not holds_the_run(tmp_path / "r.html")
