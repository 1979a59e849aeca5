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
    """``demo --jsonl`` on a full disk (a process that may write no file past 16 kB, its stand-in):
    it printed the bus's traceback mid-run, "wrote N JSON lines" at the end, and exited 0 with
    most of the events lost. Now the sink's failure is one line, and the demo exits 2 saying how
    many events were lost and why."""
    import resource
    import signal
    import subprocess
    import sys

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, 16_000))

    log = tmp_path / "run.jsonl"
    argv = ["demo", "--jsonl", str(log), "--rollouts", "12", "--concurrency", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", *argv, "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=limit,
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("sink 'jsonl' failed to handle a batch of ") and lines[0].endswith(
        "events; its failures are counted in bus.stats() and not logged again: [Errno 27] File too large"
    ), lines
    assert lines[-1].startswith(f"ckpt-events demo: error: --jsonl {log}: ") and lines[-1].endswith(
        "events could not be written ([Errno 27] File too large): free space there, or name another file"
    ), lines
    # Between them, the sink's own one-line notes ("writing again after 3 write errors ...").
    assert all(line.startswith(f"{log}: ") for line in lines[1:-1]), lines


def test_a_jsonl_that_is_not_a_regular_file_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --processes --jsonl /dev/null`` ran, then merged the servers' logs into PATH by
    writing ``/dev/null.merging`` and renaming it over ``/dev/null``: as root, the device became
    a file (``/dev/zero`` was read until memory ran out). Tried here through a link in tmp_path,
    so that the rename, if it came, replaced the link and nothing else."""
    link = tmp_path / "events.jsonl"
    link.symlink_to("/dev/null")
    argv = ["demo", "--processes", "--rollouts", "12", "--concurrency", "4", "--jsonl", str(link)]
    assert main([*argv, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ckpt-events demo: error: --jsonl {link} is not a regular file (a device, a pipe): the demo "
        "rewrites its log at the end, merging every process's log into it: name a file\n"
    )
    assert link.is_symlink() and not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", ["run", "logs", "token"])
def test_a_jsonl_named_as_the_demos_own_workdir_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """--jsonl WORKDIR/run (or logs, token) is refused in one line: the demo made that path itself
    and the run ended in a FileExistsError traceback."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    assert main(["demo", "--rollouts", "8", "--workdir", str(workdir), "--jsonl", str(workdir / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"keeps its own '{name}'" in err
    assert list(workdir.iterdir()) == []
