"""``ckpt-events report`` (``participants.cli.report.command``): the breakdown from a log, a corrupt
line named by its number, the report file written; an ASCII stdout."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_a_picture_of_logs_with_no_row_draws_the_last_trace_as_the_terminal_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Participants' logs only (their roots are in a controller log not given): ``--report x.svg``
    draws the last trace (the restore), as the terminal does. (That the events are no longer all
    read into a list for it is the memory bound of ``tests/attacks/test_report_floods.py``.)"""
    import anyio

    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    events = [e for e in anyio.run(checkpoint_and_restore) if e.kind != "controller"]
    log = tmp_path / "participants.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(events)
    anyio.run(sink.aclose)
    traces = {getattr(e, "trace_id", None) for e in events} - {None}
    assert len(traces) == 2  # the checkpoint's and the restore's
    picture = tmp_path / "x.svg"
    assert main(["report", str(log), "--report", str(picture)]) == 0
    drawn = picture.read_text()
    # The restore's trace is drawn, nothing of the checkpoint's: no commit, no prepare.
    assert "restore" in drawn
    assert "commit" not in drawn and "prepare" not in drawn
    captured = capsys.readouterr()
    assert "report written to" in captured.out
    # What the page lacks is said: the checkpoints are named from the controller's log.
    assert "no controller's coordination in these logs" in captured.err
    assert "pass the controller's log too" in captured.err


def test_the_html_page_of_a_log_of_refusals_alone_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log holding only refusals: the terminal listed "refused stale_attempt 8", the HTML page
    an empty participant table and nothing of them. The page has the counted events too."""
    refusal = b'{"type":"refused","kind":"agent","instance":"agent-0","time_ns":%d,"code":"stale_attempt"}\n'
    log = tmp_path / "refusals.jsonl"
    log.write_bytes(b"".join(refusal % (1_000_000 * (n + 1)) for n in range(8)))
    page = tmp_path / "page.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert "stale_attempt" in out
    html = page.read_text()
    assert "<h2>counted events</h2>" in html
    assert "<tr><td>refused</td><td>stale_attempt</td><td>8</td></tr>" in html


def test_an_ascii_stdout_shows_what_it_cannot_encode_as_escapes(tmp_path: Path) -> None:
    """Under ``PYTHONIOENCODING=ascii`` a checkpoint id with an ``é`` (and the waterfall's bars)
    was a UnicodeEncodeError traceback half way through the report: shown escaped, as stderr does."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","checkpoint_id":"c\\u00e9"}\n'
    )
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", "report", str(log)],
        check=False,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"checkpoint c\\xe9 (commit)" in done.stdout
