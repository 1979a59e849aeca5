"""What is not a log, however much of it: a few lines named and the rest counted, and exit 2 when
nothing was a log (``report``, ``replay``, and the demo folding its processes' logs in)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ckpt_events.participants.cli.command import load_events
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.run_logs import SHOWN

GOOD = (
    b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
    b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
)


def test_a_thousand_corrupt_lines_after_a_good_one_are_a_few_lines_and_a_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """report names the first corrupt lines by number and counts the rest in one line."""
    log = tmp_path / "cut.jsonl"
    log.write_bytes(GOOD + b"{not json\n" * 1000)
    assert main(["report", str(log)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        *(
            f"{log}:{n}: corrupt line skipped: JSON is malformed: object keys must be strings (byte 1)"
            for n in range(2, 2 + SHOWN)
        ),
        f"... and {1000 - SHOWN:,} more lines skipped",
    ]


def test_a_folder_of_non_logs_is_a_few_refusals_a_count_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forty files that are not logs: the first few refused by name, the others counted, then
    the one error line."""
    for n in range(40):
        (tmp_path / f"note{n:02}.txt").write_text("prose\n")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == SHOWN + 2
    assert all("not a ckpt-events JSON-lines log" in line for line in err[:SHOWN])
    assert err[SHOWN] == f"... and {40 - SHOWN} more files refused"
    assert err[-1] == f"ckpt-events report: error: {tmp_path} holds no checkpoint events (40 files read)"


def test_random_bytes_and_prose_are_refused_in_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5 MB of random bytes (20,176 corrupt lines once) and a README: one refusal and the error."""
    noise = tmp_path / "noise.bin"
    noise.write_bytes(random.Random(21).randbytes(5_000_000))
    readme = tmp_path / "README.md"
    readme.write_text("# ckpt-events\n\n" + "Some prose, not an event.\n" * 586)
    for path in (noise, readme):
        assert main(["report", str(path)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 2 and err[0].startswith(f"{path}:"), err
        assert err[1] == f"ckpt-events report: error: {path} holds no checkpoint events (1 file read)"


def test_the_demo_reading_its_processes_logs_counts_corrupt_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """load_events (the demo's processes' and workers' logs) reports as report does: it printed
    one line per corrupt line."""
    log = tmp_path / "environment-0.gen1.jsonl.w0"
    log.write_bytes(GOOD + b"\x00\x01garbage\n" * 100)
    events = load_events([log])
    assert len(events) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == SHOWN + 1 and err[-1] == f"... and {100 - SHOWN} more lines skipped"
