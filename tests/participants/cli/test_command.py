"""What every command shares (``participants.cli.command``): argument types refused when parsed, in
one line; an OTLP base URL; a path checked for writing before any work; a reachability probe."""

from __future__ import annotations

import argparse
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_events.participants.cli.command import (
    check_reachable,
    existing_file,
    fraction,
    instance_name,
    otlp_base_from_env,
    otlp_base_url,
    port_number,
    positive_int,
    positive_number,
    writable_path,
)
from ckpt_events.participants.errors import CommandError


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318"),
        (" https://collector/ ", "https://collector"),
        ("http://c:4318/v1/traces", "http://c:4318"),
        ("http://c:4318/otlp/v1/metrics/", "http://c:4318/otlp"),
    ],
)
def test_an_otlp_endpoint_is_cut_back_to_its_base(given: str, base: str) -> None:
    """A per-signal URL pasted into the flag becomes its base, never doubled; slashes trimmed."""
    assert otlp_base_url(given) == base


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("127.0.0.1:4318", "not an http(s) URL"),
        ("grpc://c:4317", "not an http(s) URL"),
        ("http://c:99999", "invalid port"),
        ("http://c:4318?x=1", "no ?query"),
    ],
)
def test_a_bad_otlp_endpoint_is_one_line(given: str, said: str) -> None:
    """Each mistake is an ArgumentTypeError saying what is wrong."""
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        otlp_base_url(given)


def test_the_environment_endpoint_is_checked_as_the_flag_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: None; set: its base; bad: a CommandError naming the variable."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert otlp_base_from_env() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/v1/traces")
    assert otlp_base_from_env() == "http://c:4318"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")
    with pytest.raises(CommandError, match=r"^\$OTEL_EXPORTER_OTLP_ENDPOINT: "):
        otlp_base_from_env()


@pytest.mark.parametrize(
    ("parse", "good", "bad"),
    [
        (positive_int, [("1", 1), ("40", 40)], ["0", "-2", "1.5", "x"]),
        (fraction, [("0.5", 0.5), ("0.01", 0.01)], ["0", "1", "1.5", "x"]),
        (port_number, [("0", 0), ("65535", 65535)], ["-1", "65536", "http"]),
        (positive_number, [("0.5", 0.5), ("30", 30.0)], ["0", "-1", "inf", "nan", "x"]),
        (instance_name, [("agent-0", "agent-0"), ("a.b_c", "a.b_c")], ["", "a b", "x" * 129, "../etc"]),
    ],
    ids=lambda p: getattr(p, "__name__", ""),
)
def test_argument_types_take_what_they_say_and_refuse_the_rest(
    parse: Callable[[str], object], good: list[tuple[str, object]], bad: list[str]
) -> None:
    """Each type returns the parsed value, or an ArgumentTypeError on one line quoting the value."""
    assert [parse(text) for text, _ in good] == [value for _, value in good]
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        assert "\n" not in str(refused.value)


def test_a_path_is_checked_for_writing_before_any_work(tmp_path: Path) -> None:
    """A file to write goes through the write probe (``participants.writable``, tested there);
    a file to read must be one."""
    (tmp_path / "kept.txt").write_text("kept")
    assert writable_path(str(tmp_path / "kept.txt")) == tmp_path / "kept.txt"
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        writable_path(str(tmp_path / "missing" / "x.txt"))
    assert existing_file(str(tmp_path / "kept.txt")) == tmp_path / "kept.txt"
    with pytest.raises(argparse.ArgumentTypeError, match="not a readable file"):
        existing_file(str(tmp_path))


async def test_reachable_is_one_line_when_nothing_listens() -> None:
    """A listening port passes; a closed one is a CommandError naming the URL."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        await check_reachable(f"http://127.0.0.1:{listening.getsockname()[1]}", timeout=2)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        with pytest.raises(CommandError, match=re.escape(f"nothing answers at {url}")):
            await check_reachable(url, timeout=2)


async def test_what_main_raises_comes_out_of_run_interruptibly_as_raised() -> None:
    """run_interruptibly's task group wrapped the body's error in an ExceptionGroup: the demo's
    ``except DemoFailed`` missed it, and `demo --fault slow` that failed its check printed a
    traceback (exit 1) instead of its one line."""
    from ckpt_events.participants.cli.command import run_interruptibly
    from ckpt_events.participants.cli.demo.runner import DemoFailed

    async def fails(stopping: object) -> int:
        raise DemoFailed("environment-1 writes 5x slower, but the stragglers flagged are: none")

    with pytest.raises(DemoFailed, match="stragglers flagged are: none") as caught:
        await run_interruptibly(fails)
    assert type(caught.value) is DemoFailed


def test_our_error_inside_an_exception_group_is_found() -> None:
    """A command-line error (not a library error) in nested groups is what the command line
    reports as one line and exit 2; ``_first_leaf`` looked for library errors only, and the
    group was re-raised as a traceback."""
    import importlib

    main_module = importlib.import_module("ckpt_events.participants.cli.main")
    error = CommandError("the run went wrong")
    group = BaseExceptionGroup("outer", [ValueError("other"), ExceptionGroup("inner", [error])])
    assert main_module._first_leaf(group) is error


@pytest.mark.parametrize(
    "argv",
    [
        ["ops", "--write", "{long}"],
        ["demo", "--workdir", "{long}"],
        ["demo", "--jsonl", "{long}"],
        ["demo", "--report", "{long}.html"],
        ["serve", "resources", "--port", "0", "--checkpoint-root", "{long}"],
        ["serve", "resources", "--port", "0", "--token-file", "{long}"],
    ],
    ids=["ops", "workdir", "jsonl", "report", "checkpoint-root", "token-file"],
)
def test_a_path_the_system_cannot_look_up_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A file name past the system's limit (300 characters; 255 on Linux) was a traceback of
    ``OSError: [Errno 36] File name too long`` from ``Path.exists`` in every command taking a
    path (as was a path under a folder the user may not search: ``Permission denied``). It is
    refused when parsed, in one line naming the path."""
    from ckpt_events.participants.cli.main import main

    long = str(tmp_path / ("a" * 300))
    with pytest.raises(SystemExit) as info:
        main([part.format(long=long) for part in argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "File name too long" in err and "Traceback" not in err, err


#: ``run_interruptibly`` in its own process, with a ``main`` whose graceful stop takes the seconds
#: given first; prints ``ready``, then the ``Interrupted`` it ended with (its signal, its cut).
INTERRUPTIBLE = """
import functools
import sys

import anyio

from ckpt_events.participants.cli.command import run_interruptibly
from ckpt_events.participants.errors import Interrupted

STOP = float(sys.argv[1])


async def main(stopping):
    print("ready", flush=True)
    await stopping.wait()
    await anyio.sleep(STOP)  # a graceful stop this long


try:
    anyio.run(functools.partial(run_interruptibly, main, forcing=lambda: "what was cut"))
except Interrupted as exc:
    print(exc.signum, exc.cut, flush=True)
"""


def _interrupt(stop: float, signals: list[tuple[float, int]]) -> tuple[list[str], float]:
    """Run ``INTERRUPTIBLE`` with a ``stop`` s graceful stop; send each signal after its delay
    (from the first); what it printed after ``ready``, and its time from the first signal."""
    import os
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[3]
    with subprocess.Popen(
        [sys.executable, "-c", INTERRUPTIBLE, str(stop)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.1)  # into the signal receiver (opened before main's first line runs)
        started = time.monotonic()
        for delay, signum in signals:
            time.sleep(max(0.0, started + delay - time.monotonic()))
            proc.send_signal(signum)
        out = proc.stdout.read().splitlines()
        proc.wait(10)
        return out, time.monotonic() - started


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_within_the_repeat_window_is_the_same_interrupt(second: int) -> None:
    """Ctrl-C, then 50 ms later Ctrl-C again (or SIGTERM): the graceful stop (0.5 s) runs to its
    end, and the interrupt is the first signal's (exit 130), nothing cut. The second forced it:
    the demo's servers were cancelled at once, each logging what it lost."""
    out, took = _interrupt(0.5, [(0.0, signal.SIGINT), (0.05, second)])
    assert out == [f"{int(signal.SIGINT)} None"]
    assert took >= 0.5


def test_a_second_signal_after_the_repeat_window_forces_and_says_what_it_cut() -> None:
    """Ctrl-C, then again 1.2 s later while the stop still runs (its 10 s): the exit is forced at
    once, with what it cut."""
    out, took = _interrupt(10.0, [(0.0, signal.SIGINT), (1.2, signal.SIGINT)])
    assert out == [f"{int(signal.SIGINT)} what was cut"]
    assert took < 3.0


def test_sigterm_alone_is_an_interrupt_by_sigterm() -> None:
    """SIGTERM alone: a graceful stop, reported as SIGTERM's (exit 143, where it said 130)."""
    out, _ = _interrupt(0.1, [(0.0, signal.SIGTERM)])
    assert out == [f"{int(signal.SIGTERM)} None"]
