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
