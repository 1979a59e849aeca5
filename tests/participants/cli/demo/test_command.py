"""``ckpt-events demo`` and its neighbours on the command line (``participants.cli.demo.command``):
a mistake is one line and a non-zero exit, never a traceback. The demo run itself: ``test_runner.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.main import main


def test_user_mistakes_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad flags, paths and endpoints exit non-zero with one line, never a traceback."""
    for argv in (
        ["demo", "--rollouts", "zero"],
        ["demo", "--otlp-endpoint", "127.0.0.1:4318"],
        ["demo", "--jsonl", str(tmp_path / "missing" / "t.jsonl")],
        ["bench", "--only", "everything"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, argv
    for argv in (
        ["report", str(tmp_path / "nope.jsonl")],
        ["replay", str(tmp_path / "nope.jsonl"), "--otlp-endpoint", "http://127.0.0.1:9"],
    ):
        assert main(argv) == 2  # paths may be globs: checked when expanded, not by argparse
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "no such file, directory or matching glob" in err, argv
    # --report is checked with its extension, by the command, before any work
    assert main(["demo", "--report", str(tmp_path / "missing" / "t.svg")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert main(["report", str(empty)]) == 2
    assert "holds no checkpoint events" in capsys.readouterr().err


@pytest.mark.slow
def test_a_jsonl_log_that_cannot_be_written_fails_the_demo_in_one_line(tmp_path: Path) -> None:
    """``demo --jsonl`` on a full disk (``/dev/full``): it printed the bus's traceback mid-run,
    "wrote 0 JSON lines" at the end, and exited 0 with none of the events kept. Now the sink's
    failure is one line, and the demo exits 2 saying how many events were lost and why."""
    import subprocess
    import sys

    argv = ["demo", "--jsonl", "/dev/full", "--rollouts", "12", "--concurrency", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", *argv, "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("sink 'jsonl' failed to handle a batch of ") and lines[0].endswith(
        "events; its failures are counted in bus.stats() and not logged again: [Errno 28] No space "
        "left on device"
    ), lines
    assert lines[-1].startswith("ckpt-events demo: error: --jsonl /dev/full: ") and lines[-1].endswith(
        "events could not be written ([Errno 28] No space left on device): free space there, or name "
        "another file"
    ), lines
    assert len(lines) == 2, lines
