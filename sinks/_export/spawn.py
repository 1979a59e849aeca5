"""The export process's child started and ended: spawned with ``configure``'s arguments on its
first input line, its ``ready`` reply awaited within the start timeout (its failure raised as one
``ConfigurationError`` saying why), the close budget it is given, and its end by force.

``ExportProcess.start`` builds the sink from what ``spawn`` returns; the child's side is
``ckpt_events.sinks._export.child``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from ckpt_events import ConfigurationError
from ckpt_events.sinks._export.replies import read_reply
from ckpt_events.sinks._export.reports import ReportListener

__all__ = ["child_budget", "kill", "kill_and_reap", "spawn"]


def spawn(
    arguments: Mapping[str, Any], close_timeout: float, start_timeout: float
) -> tuple[subprocess.Popen[bytes], ReportListener, dict[str, Any]]:
    """Start the child with ``configure``'s ``arguments`` and wait, at most ``start_timeout``
    seconds, until it built its sinks: the child, the listener of its report pipe and its
    ``ready`` reply; ``ConfigurationError`` (the child's message) if it could not."""
    fields = {"arguments": dict(arguments), "close_timeout": child_budget(close_timeout)}
    try:
        msgspec.json.encode(fields)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ConfigurationError(f"export_process: the arguments must be plain values ({exc})") from None
    # The child imports the ckpt_events this process runs, wherever it was found.
    path = os.pathsep.join(entry for entry in sys.path if entry)
    # Its counters and log lines come back on a pipe of their own (``reports``).
    reports, child_end = os.pipe()
    level = logging.getLogger("ckpt_events").getEffectiveLevel()
    head = msgspec.json.encode({**fields, "reports": child_end, "log_level": level}) + b"\n"
    started = time.monotonic()
    # The child inherits SIGINT blocked and ignores it once it runs: a Ctrl-C in the
    # server's terminal while it imported killed it ("exited (code 1) before its sinks
    # were up", a KeyboardInterrupt traceback), though the server may close in order.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread only
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "ckpt_events.sinks._export.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            pass_fds=(child_end,),
        )
    except OSError as exc:
        os.close(reports)
        os.close(child_end)
        # An embedded interpreter (uWSGI, mod_wsgi) has no Python at sys.executable (or an
        # empty one), or the system is out of processes: a bare OSError naming only a path.
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise _not_started(exc) from None
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(reports)
        os.close(child_end)
        raise
    os.close(child_end)  # the child's now: its exit (or _kill) ends the listener's reading
    listener = ReportListener(reports, process.pid)
    try:
        # A Ctrl-C meanwhile is raised here, in this try: the child is killed, not left.
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        assert process.stdin is not None
        try:
            process.stdin.write(head)
            process.stdin.flush()
        except BrokenPipeError:  # it exited at once: said below, with its exit code
            ready = None
        else:
            ready = read_reply(process, started + start_timeout)
        waited = time.monotonic() - started  # as the reply came, or the output ended
    except BaseException:
        kill(process)
        raise
    if ready is None:
        # Its stdout ended (it is exiting: give it a moment to be reaped) or it said nothing.
        try:
            exited: int | None = process.wait(1.0)
        except subprocess.TimeoutExpired:
            exited = None
        kill(process)
        if exited is None:
            if waited < start_timeout:  # its output ended, yet it runs on: not a slow start
                raise ConfigurationError(
                    f"the export process stopped answering after {waited:.1f} s without saying "
                    "its sinks were up, and did not exit; run without export_process to see "
                    "the sinks start here"
                )
            raise ConfigurationError(
                f"the export process did not start within {start_timeout:g} s; run without "
                "export_process to see the sinks start here"
            )
        raise ConfigurationError(
            f"the export process exited (code {exited}) before its sinks were up; its error is "
            "on stderr above"
        )
    if not ready.get("ready"):
        kill(process)  # it is exiting on its own: this reaps it and closes the pipes
        raise ConfigurationError(str(ready.get("error") or "export process: it could not start"))
    return process, listener, ready


def _not_started(exc: OSError) -> ConfigurationError:
    """Why the export process could not be started, and the fix: out of descriptors is said
    as such (under ``ulimit -n`` 12 it blamed the interpreter, "an embedded interpreter may
    lack" it: a false cause); anything else names the Python it runs."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return ConfigurationError(
            f"the export process could not be started: out of file descriptors ({exc.strerror}; "
            f"the limit is {soft}): raise it (ulimit -n 1024), or run without export_process"
        )
    return ConfigurationError(
        f"the export process could not be started: {sys.executable!r} ({exc.strerror or exc}); "
        "it runs this process's Python (sys.executable), which an embedded interpreter may "
        "lack: run without export_process"
    )


def child_budget(close_timeout: float) -> float:
    """The seconds the child may take to close: most of ours, so its last reply is in time."""
    return round(close_timeout * 0.8, 3)


def kill_and_reap(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` (if it still runs) and reap it, within 5 s; its pipes stay open."""
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5.0)


def kill(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` (if it still runs), reap it, close our ends of its pipes."""
    kill_and_reap(process)
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
