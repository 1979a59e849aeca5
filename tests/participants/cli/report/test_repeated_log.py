"""A log repeated in one file (each copy going back in time): the report's work grows with its lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report import folding, model

DEMO_STALL = Path(__file__).parent / "data" / "demo-fault-stall-checkpoint.jsonl"


def _work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], copies: int
) -> int:
    """Calls of the waterfall's per-span helpers (a sort key in ``trace_spans``, a group key in
    ``waterfall_rows``) while ``report`` reads the demo's log repeated ``copies`` times."""
    log = tmp_path / f"repeated-{copies}.jsonl"
    log.write_bytes(DEMO_STALL.read_bytes() * copies)
    calls = 0
    start, kind = model._start, folding._kind

    def counted_start(e: model.FinishedSpan) -> tuple[int, int]:
        nonlocal calls
        calls += 1
        return start(e)

    def counted_kind(s: model.Span) -> str:
        nonlocal calls
        calls += 1
        return kind(s)

    monkeypatch.setattr(model, "_start", counted_start)
    monkeypatch.setattr(folding, "_kind", counted_kind)
    assert main(["report", str(log)]) == 0
    capsys.readouterr()
    return calls


def test_repeated_log_work_grows_with_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four times the copies cost at most ~4x the work: a span's copies share its id, and each
    copy's children were every copy's, sorted and folded again per copy (1,000 copies: 36 s)."""
    small = _work(tmp_path, monkeypatch, capsys, 10)
    large = _work(tmp_path, monkeypatch, capsys, 40)
    assert small > 0
    # Linear: 4x (the log's own spans, once each, keep it a little under); n^2 was 15.9x.
    assert large / small < 6, (small, large)


def test_a_repeated_logs_cause_is_said_once_with_its_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's stall log 100 times in one file: its ``prepare_not_ready`` (no id: its copies
    are kept) was said 4 times then "... and 96 more", the same clause each time; it is said once,
    counted, in the terminal and on the HTML run page (100 copies: past ``KEPT_CAUSES`` too)."""
    log = tmp_path / "repeated.jsonl"
    log.write_bytes(DEMO_STALL.read_bytes() * 100)
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    cause = (
        "not ready at its deadline: environment/environment-0 blocked by 1 episode "
        "(x100 in the logs: copies, or events alike)"
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#1 ")]
    assert lines == [f"#1 checkpoint aborted: {cause}"]
    html = page.read_text()
    assert html.count("not ready at its deadline") == html.count(cause) == 2, html.count("not ready")
    assert "more" not in html.split(cause)[1][:40]
