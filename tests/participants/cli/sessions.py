"""The command line run as a process, as the signal and lifecycle tests share it: ``CLI``, the
tree it runs on, a session led by it, a bounded wait, and whether a port accepts a connection."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

#: The checkout the command runs in (its cwd), so that it imports this tree.
ROOT = Path(__file__).resolve().parents[3]
#: The command line as ``ckpt-events`` runs it, without the console script.
CLI = [
    sys.executable,
    "-c",
    "import sys; from ckpt_events.participants.cli.main import main; sys.exit(main())",
]

#: Where a session's output goes: a file descriptor or an open file (``tmp_path / "out"`` and
#: ``"err"`` when not given).
Output = int | IO[bytes]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.05 s until it holds; fail saying ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def accepts(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 accepts a connection (within 0.2 s)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@contextlib.contextmanager
def session(
    argv: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    prefix: tuple[str, ...] = (),
    stdout: Output | None = None,
    stderr: Output | None = None,
    command: list[str] = CLI,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (the CLI unless given; behind ``prefix``, e.g. ``nohup``) with ``argv`` as
    the leader of its own process group, ``env`` over this environment; stdout and stderr to
    ``tmp_path / "out"`` and ``"err"`` unless given (``subprocess.PIPE`` gives a pipe, closed on
    the way out). The group is killed on the way out."""
    with contextlib.ExitStack() as files:
        out = stdout if stdout is not None else files.enter_context(open(tmp_path / "out", "wb"))
        err = stderr if stderr is not None else files.enter_context(open(tmp_path / "err", "wb"))
        proc = subprocess.Popen(
            [*prefix, *command, *argv],
            cwd=ROOT,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
