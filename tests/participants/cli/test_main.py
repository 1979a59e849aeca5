"""``ckpt-events`` itself: a missing extra is one line naming it, ``--version``, no abbreviated options."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from ckpt_events.participants.cli.main import build_parser, main
from ckpt_events.participants.cli.ops import OPS_FILES
from tests.not_installed import run_without

ROOT = Path(__file__).resolve().parents[3]

#: The command line in an interpreter where ``rich`` is not installed: a meta-path finder
#: refuses it as the import system does when no finder has it.
#: The command line as the ``ckpt-events`` script runs it, in an interpreter without rich.
MAIN = """
import sys
from ckpt_events.participants.cli.main import main
sys.exit(main())
"""


def _without_rich(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_without(tmp_path, "rich", [MAIN, *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--rollouts", "2"],
        ["report", "run.jsonl"],
        ["bench", "--only", "core", "--quick"],
        ["watch", "--participant", "http://127.0.0.1:9", "--once"],
        ["diff", "a.jsonl", "b.jsonl"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_command_without_the_cli_extra_names_it_in_one_line(tmp_path: Path, argv: list[str]) -> None:
    """Without rich, the commands that draw with it exit 2 with one line naming the extra, before
    any work (bench ran its suite first, then failed at the table)."""
    done = _without_rich(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"ckpt-events {argv[0]}: error: 'rich' is not installed: this command needs the cli extra: "
        "pip install 'ckpt-events[cli]'"
    ]
    assert done.stdout == ""


@pytest.mark.parametrize("blocked", ["fastapi", "uvicorn", "httpx"])
def test_serve_without_fastapi_names_the_server_extra(tmp_path: Path, blocked: str) -> None:
    """``serve`` needs only the server extra (it runs without rich, the SDK and
    prometheus-client): its one line names ``[server]`` (was: ``[cli]``, three packages more)."""
    done = run_without(tmp_path, blocked, [MAIN, "serve", "environment", "--port", "0"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"ckpt-events serve: error: {blocked!r} is not installed: this command needs the server "
        "extra: pip install 'ckpt-events[server]'"
    ]


def test_demo_without_fastapi_still_names_the_cli_extra(tmp_path: Path) -> None:
    """``demo`` draws with rich too: a missing server package there names ``[cli]``."""
    done = run_without(tmp_path, "fastapi", [MAIN, "demo", "--rollouts", "2"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "ckpt-events demo: error: 'fastapi' is not installed: this command needs the cli extra: "
        "pip install 'ckpt-events[cli]'"
    ]


def test_help_and_the_commands_without_rich_still_run(tmp_path: Path) -> None:
    """``--help`` and ``ops`` need nothing from the extra: they run without rich."""
    helped = _without_rich(tmp_path, "--help")
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr
    ops = _without_rich(tmp_path, "ops", "--write", str(tmp_path / "ops"))
    assert ops.returncode == 0, ops.stderr
    assert any((tmp_path / "ops").iterdir())


def test_version_prints_the_installed_distributions_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``ckpt-events --version`` prints the version the package metadata holds, and exits 0."""
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"ckpt-events {version('ckpt-events')}\n"


def _path_options(a_file: Path) -> list[tuple[str, str]]:
    """Every (command, option) of the parser whose type makes a ``Path`` of ``a_file``."""
    found = []
    for action in build_parser()._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            for option in sub._actions:
                try:
                    made = option.type(str(a_file)) if callable(option.type) else None
                except (argparse.ArgumentTypeError, ValueError):
                    continue  # a number, a URL, a name: not a path
                if isinstance(made, Path):
                    found.append((name, option.option_strings[0] if option.option_strings else option.dest))
    return found


def test_no_path_option_takes_an_empty_string_as_the_current_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``''`` given as any PATH or DIR is refused when parsed, in one line naming the option:
    ``Path('')`` is ``.``, and ``ops --write ''`` wrote the pack into the current folder."""
    (a_file := tmp_path / "a.txt").write_text("x")
    options = _path_options(a_file)
    assert ("ops", "--write") in options and ("serve", "--checkpoint-root") in options
    for command, option in options:
        parsed = build_parser().parse_known_args  # parse the option alone: no other work
        with pytest.raises(SystemExit) as info:
            parsed([command, option, ""])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.endswith(
            f"argument {option}: '' is an empty path (stray quotes?): name a file or folder\n"
        ), err
        assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "unbuffered"),
    [
        (["ops", "--write", "ops"], ""),
        (["ops", "--write", "ops"], "1"),
        (["--help"], ""),
        (["--help"], "1"),
        (["demo", "--rollouts", "1"], ""),
    ],
    ids=lambda p: p[0] if isinstance(p, list) else f"unbuffered={p}",
)
def test_output_to_a_closed_pipe_is_a_quiet_exit(tmp_path: Path, argv: list[str], unbuffered: str) -> None:
    """``ckpt-events ops --write DIR | true`` (the reader gone before we write) was a
    BrokenPipeError traceback, or "Exception ignored" and status 120 at the interpreter's last
    flush; ``demo | head -1`` asyncio's "unhandled exception" traceback (rich's SystemExit out of
    a task): now nothing on stderr and status 1, as rich's tables do; buffered or not (argparse
    itself drops a help it could not write unbuffered, and exits 0)."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before anything is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ckpt_events.participants.cli", *argv],
            check=False,
            cwd=tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": unbuffered},
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == (0 if argv == ["--help"] and unbuffered else 1)


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a disk that is full)")
def test_stdout_on_a_full_disk_is_one_line_naming_the_pack_written(tmp_path: Path, unbuffered: str) -> None:
    """``ops --write DIR > /dev/full`` wrote the pack, then ended in an OSError traceback (from
    ``print``, or the last flush): now one line saying the pack is written and stdout failed."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "ckpt_events.participants.cli", "ops", "--write", "pack"],
            check=False, cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": unbuffered},
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "ckpt-events ops: error: --write pack: the pack is written, but listing it on stdout "
        "failed: No space left on device; send stdout elsewhere\n"
    )
    assert sorted(p.name for p in (tmp_path / "pack").iterdir()) == sorted(OPS_FILES)


@pytest.mark.parametrize("argv", [["ops", "--write", "pack"], ["--version"]], ids=lambda a: a[0])
def test_a_closed_stdout_is_no_traceback(tmp_path: Path, argv: list[str]) -> None:
    """Started with stdout closed (``ops --write DIR >&-``, as a daemon may be), Python has no
    ``sys.stdout``: the last flush was an AttributeError traceback after the pack was written."""
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", *argv],
        check=False, cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0
    if argv[0] == "ops":
        assert sorted(p.name for p in (tmp_path / "pack").iterdir()) == sorted(OPS_FILES)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    found = [parser]
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_parser_takes_an_abbreviation(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse took ``--check`` for ``--checkpoint-root`` (and any unique prefix of a long
    option); every parser of the command line refuses them, in one line."""
    parsers = _parsers(build_parser())
    assert len(parsers) > 5 and all(p.allow_abbrev is False for p in parsers)
    for argv, said in (
        (
            ["serve", "environment", "--instance", "e0", "--port", "1", "--check", "/tmp/x"],
            "--check /tmp/x (did you mean --checkpoint-root?)",
        ),
        (["report", "run.jsonl", "--checkp", "c1"], "--checkp c1 (did you mean --checkpoint?)"),
        # A log given to watch as report takes one (a new user's first watch said only this
        # log's name): the flag that takes it is named.
        (["watch", "--once", "run.jsonl"], "run.jsonl (logs are given with --follow: --follow run.jsonl)"),
        # A participant's URL is not a log (it was told --follow http://h:9000), and a "--" is
        # no option that keeps the hint away.
        (
            ["watch", "--once", "http://h:9000"],
            "http://h:9000 (participants are given with --participant: --participant http://h:9000)",
        ),
        (
            ["watch", "--once", "http://h:9000", "run.jsonl"],
            "http://h:9000 run.jsonl (participants are given with --participant, logs with --follow:"
            " --participant http://h:9000 --follow run.jsonl)",
        ),
        (["watch", "--", "run.jsonl"], "-- run.jsonl (logs are given with --follow: --follow run.jsonl)"),
    ):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(argv)
        assert info.value.code == 2
        assert capsys.readouterr().err == f"ckpt-events: error: unrecognized arguments: {said}\n"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["reprot", "run.jsonl"],
            "ckpt-events: error: argument COMMAND: invalid choice: 'reprot' (choose from ",
        ),
        (
            ["report", "run.jsonl", "--chekpoint", "c1"],
            "ckpt-events: error: unrecognized arguments: --chekpoint c1",
        ),
        (["bench", "--only", "sink"], "ckpt-events bench: error: argument --only: invalid choice: 'sink'"),
        (["serve", "agnt", "--port", "1"], "ckpt-events serve: error: argument kind: invalid choice: 'agnt'"),
        (["demo", "--instance", "3"], "ckpt-events: error: unrecognized arguments: --instance 3"),
        (
            ["report", "run.jsonl", "--chekpoint=c1", "--reprot", "r.html"],
            "ckpt-events: error: unrecognized arguments: --chekpoint=c1 --reprot r.html",
        ),
    ],
)
def test_a_typo_of_a_command_choice_or_option_names_the_one_meant(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt subcommand, choice or option is refused in one line naming the one meant (it
    was only refused: ``reprot`` got the list of commands, ``--chekpoint`` nothing)."""
    meant = {
        "reprot": ": did you mean 'report'?",
        "--chekpoint": " (did you mean --checkpoint?)",
        "sink": ": did you mean 'sinks'?",
        "agnt": ": did you mean 'agent'?",
        "--instance": " (did you mean --instances?)",
        "--chekpoint=c1": " (did you mean --checkpoint for --chekpoint, --report for --reprot?)",
    }
    (typo,) = [meant[each] for each in argv if each in meant][:1]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.endswith(typo + "\n") and err.count("\n") == 1, err


def test_an_unknown_option_like_none_is_said_without_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    """No option resembles ``--frobnicate``, no choice ``nosuch``: nothing is guessed."""
    for argv in (["report", "run.jsonl", "--frobnicate"], ["bench", "--only", "nosuch"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ckpt-events: error: unrecognized arguments: --frobnicate"
    assert err[1].endswith("'fleet_trace', 'curves')") and len(err) == 2
