"""``ckpt-events report`` (``participants.cli.report.command``): the breakdown from a log, a corrupt
line named by its number, the report file written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.main import main


def test_report_skips_a_corrupt_line_with_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """report prints the breakdown from a log and names a corrupt line by number."""
    log = tmp_path / "log.jsonl"
    good = (
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
    )
    log.write_bytes(good + b"{not json\n" + good)
    assert main(["report", str(log), "--report", str(tmp_path / "t.html")]) == 0
    captured = capsys.readouterr()
    assert f"{log}:2: corrupt line skipped" in captured.err
    assert "model/m0" in captured.out
    assert "<svg" in (tmp_path / "t.html").read_text()
