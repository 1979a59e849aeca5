"""A stop signal after a forced exit has ended ``serve()``, before the command has said its line;
and one after the line, as the process exits."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from ckpt_events.participants.server.interrupts import REPEATED_SIGNAL
from tests.participants.cli.sessions import accepts, session, wait_for

pytestmark = pytest.mark.e2e

#: ``ckpt-events`` sending itself a signal (``$THEN_SIGNAL``) as ``asyncio.run`` starts its cleanup
#: after uvicorn's ``serve()`` ended by a forced exit (its lifespan's task left to cancel): a
#: signal landing in that window, made certain. The cleanup itself still runs, unchanged.
SIGTERM_AS_SERVE_HAS_ENDED = """
import asyncio.runners, os, signal, sys
from ckpt_events.participants.cli.main import main

cleanup = asyncio.runners._cancel_all_tasks

def signalled(loop):
    if any(t.get_coro().__qualname__.startswith("LifespanOn.") for t in asyncio.all_tasks(loop)):
        os.kill(os.getpid(), int(os.environ["THEN_SIGNAL"]))
    return cleanup(loop)

asyncio.runners._cancel_all_tasks = signalled
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("then", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_after_a_forced_exit_ended_serve_leaves_its_line_said(tmp_path: Path, then: int) -> None:
    """Ctrl-C, Ctrl-C again while a request holds the graceful stop, then another signal as
    ``asyncio.run`` cleans up after ``serve()``, the handlers Python's again: a SIGTERM killed
    the process (-15) and nothing was said of the request the forced exit cut; a SIGINT's
    ``KeyboardInterrupt`` took the place of the forced exit's, the line only "interrupted". Now
    the forced exit's line is said, exit 130 (the first signal's)."""
    token = write_token_file(tmp_path / "token", "signal-test-token")
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token)]
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl"), "THEN_SIGNAL": str(int(then))}
    program = [sys.executable, "-c", SIGTERM_AS_SERVE_HAS_ENDED]
    with session(argv, tmp_path, env, stdout=subprocess.DEVNULL, command=program) as proc:
        wait_for(lambda: proc.poll() is not None or accepts(port), 30, "serve to listen")
        assert proc.poll() is None, (tmp_path / "err").read_text()
        with socket.create_connection(("127.0.0.1", port), 5) as held:
            held.sendall(
                b"POST /work/start HTTP/1.1\r\nhost: x\r\nauthorization: Bearer signal-test-token\r\n"
                b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{"
            )
            time.sleep(0.1)
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the graceful stop, held by the request
            time.sleep(REPEATED_SIGNAL + 0.1)
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C again: the exit is forced
            proc.wait(20)
    lines = (tmp_path / "err").read_text().splitlines()
    assert (proc.returncode, lines) == (
        130,
        [
            "ckpt-events serve: interrupted; a second signal forced the exit: 1 request in flight was cut "
            "(POST /work/start); the app's lifespan was cancelled before it closed its sinks: events not "
            "yet written or exported may be lost"
        ],
    )


def test_a_second_ctrl_c_as_serve_exits_after_its_line_is_the_same_stop(tmp_path: Path) -> None:
    """Ctrl-C, then Ctrl-C again 0.1 s after serve said its line (pressed twice quickly): the
    second landed in the interpreter's exit (about 0.17 s after the line), where ``main`` had
    given Python's handler back and the interpreter's end the default: the process died of
    SIGINT (-2, 4 runs of 4). Now it is the same stop: the one line, exit 130."""
    token = write_token_file(tmp_path / "token", "signal-test-token")
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token)]
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    with session(argv, tmp_path, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        wait_for(lambda: proc.poll() is not None or accepts(port), 30, "serve to listen")
        assert proc.poll() is None, "serve ended before it listened"
        assert proc.stderr is not None
        os.kill(proc.pid, signal.SIGINT)
        line = proc.stderr.readline()  # its line said: the process is on its way out
        time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(20)
    assert (proc.returncode, line, rest) == (130, b"ckpt-events serve: interrupted\n", b"")
