"""What a ``ckpt-events`` subcommand is, and the argument types and helpers the commands share."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import anyio

from ckpt_events.participants.cli.text import say
from ckpt_events.participants.errors import CommandError, Interrupted, shown
from ckpt_events.participants.writable import unwritable
from ckpt_events.vocab import SAFE_NAME

__all__ = [
    "Command",
    "CommandError",
    "check_reachable",
    "console",
    "existing_file",
    "file_descriptor",
    "filtered",
    "fraction",
    "given_path",
    "http_url",
    "instance_name",
    "load_events",
    "otlp_base_from_env",
    "otlp_base_url",
    "otel_environ",
    "port_number",
    "positive_int",
    "positive_number",
    "run_interruptibly",
    "sigterm_as_interrupt",
    "writable_path",
]

T = TypeVar("T")

#: After Ctrl-C, how long servers get to finish the requests in flight before all is cancelled.
INTERRUPT_GRACE: Final = 3.0

#: A second stop signal this soon after the first is the same interrupt, not a wish to force the
#: exit: Ctrl-C pressed twice quickly, a supervisor's SIGTERM right after a terminal's SIGINT.
#: Forced, the demo's five servers each logged their lifespan and every request cut (6 to 16
#: lines) where the graceful stop, bounded by ``INTERRUPT_GRACE``, ends in about 1 s.
REPEATED_INTERRUPT: Final = 1.0


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_arguments(parser)`` declares it, ``run(args)`` returns the exit status.

    ``needs`` names the modules of the ``cli`` extra it imports: checked before ``run``, so a
    missing one is one line naming the extra, never a traceback after part of the work.
    ``extra`` is the smallest extra that has them (``server`` for ``serve``), named when one of
    its modules is missing; a module outside it is named with ``cli``.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    needs: tuple[str, ...] = ()
    extra: str = "cli"


def given_path(value: str) -> Path:
    """``--flag PATH``: any path but an empty (or blank) one, which ``Path`` takes as ``.``: ``ops
    --write ''`` wrote the pack into the current folder, ``demo --workdir ''`` its run.

    A path the system cannot look up (a name past its limit, a folder on the way that may not be
    searched, a loop of links) is refused too: ``Path.exists`` raised it, a traceback in every
    command. One that does not exist (yet) is taken."""
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"{shown(value)} is an empty path (stray quotes?): name a file or folder"
        )
    path = Path(value)
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # not there (yet), or under a file: each command says what that means to it
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{shown(value)}: {exc.strerror or exc}: name another path"
        ) from None
    return path


def existing_file(value: str) -> Path:
    path = given_path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{shown(value)} is not a readable file")
    return path


def writable_path(value: str) -> Path:
    """``--flag PATH`` for a file to write: refused when parsed, before any work
    (``participants.writable.unwritable``, the benchmarks' probe too)."""
    path = given_path(value)
    if (refusal := unwritable(path)) is not None:
        raise argparse.ArgumentTypeError(refusal)
    return path


def console() -> Any:
    """A rich console: a terminal's own width; piped output ``$COLUMNS`` if set, else 170.

    Once stdout's reader has gone (``| head -1``) it writes nothing more and raises
    ``BrokenPipeError``, which ``main`` ends quietly: rich's own ``SystemExit`` out of a task
    (the demo's) was asyncio's "unhandled exception" traceback, three times over. With no
    stdout at all (started with it closed) it raises ``CommandError``."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "stdout's reader has gone")

    if sys.stdout is None:
        # Started with stdout closed (``>&-``): an AttributeError traceback, as ``cat >&-`` says
        # a write error; before any work, so the demo's fleet never starts for nothing.
        raise CommandError("stdout is closed: nothing to print to (run it without '>&-', or '>/dev/null')")
    if sys.stdout.isatty():
        return _Console()
    columns = os.environ.get("COLUMNS", "")
    return _Console(width=int(columns) if columns.isdigit() and int(columns) >= 40 else 170)


def load_events(paths: Sequence[Path]) -> list[Any]:
    """Every event of JSON-lines logs in time order; what is not a log is reported on stderr as
    ``run_logs.LogProblems`` says it (a file refused in one line, corrupt lines counted with
    the first few named), never one line per bad line. An event in two files counts once,
    whatever their order (``read_logs``)."""
    from ckpt_events.participants.cli.report.logs import read_logs

    events, problems = read_logs(paths, list)
    for line in problems.summary():
        say(line)
    return events


def otel_environ() -> dict[str, str]:
    """The ``OTEL_*`` variables, for ``ckpt_events.sinks.configure``: commands whose flags stand in for
    ``CKPT_EVENTS_*`` still have the OpenTelemetry settings checked, and refused if bad (a
    protocol other than OTLP/HTTP is an error, never silently exported over HTTP)."""
    return {key: value for key, value in os.environ.items() if key.startswith("OTEL_")}


def _whole_number(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not {what}") from None


def positive_int(value: str) -> int:
    number = _whole_number(value, "a whole number")
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be at least 1")
    return number


def fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not a number") from None
    if not 0.0 < number < 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return number


#: Where OTLP/HTTP posts each signal under a base URL (the OpenTelemetry rule for
#: ``OTEL_EXPORTER_OTLP_ENDPOINT``); a ``--otlp-endpoint`` ending in one is taken as its base.
SIGNAL_PATHS: Final = ("/v1/traces", "/v1/metrics")
ENV_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"


def otlp_base_url(value: str) -> str:
    """``--otlp-endpoint URL``: an http(s) URL with a host, as the collector's OTLP/HTTP base.

    OpenTelemetry appends ``/v1/traces`` (``/v1/metrics``) to a base; a URL already ending in
    one (a per-signal URL pasted into the flag) is cut back to its base, never doubled.
    """
    url = http_url(value, example="http://127.0.0.1:4318")
    parsed = urlsplit(url)
    if parsed.query or parsed.fragment:
        raise argparse.ArgumentTypeError(f"{shown(value)}: an OTLP endpoint takes no ?query or #fragment")
    base = url.rstrip("/")
    for path in SIGNAL_PATHS:
        base = base.removesuffix(path)
    return base.rstrip("/")


def http_url(value: str, example: str = "http://127.0.0.1:8000") -> str:
    """``--flag URL`` (``serve model --inference-url``): an http(s) URL with a host and a valid
    port, surrounding blanks removed. Without its scheme (``127.0.0.1:8000``) a model was served,
    and every call to its inference worker failed 502, one by one."""
    url = value.strip()
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not an http(s) URL, e.g. {example}")
    try:
        parsed.port  # noqa: B018  # raises on a port that is not one
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(value)} has an invalid port") from None
    return url


def otlp_base_from_env() -> str | None:
    """``$OTEL_EXPORTER_OTLP_ENDPOINT`` checked as ``--otlp-endpoint`` is (``None`` if unset);
    a bad value is one line naming the variable."""
    raw = os.environ.get(ENV_OTLP_ENDPOINT, "").strip()
    if not raw:
        return None
    try:
        return otlp_base_url(raw)
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"${ENV_OTLP_ENDPOINT}: {exc}") from None


async def check_reachable(url: str, timeout: float = 3.0) -> None:
    """Fail fast with one line when nothing listens at an endpoint's host and port."""
    parsed = urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_tcp(parsed.hostname or "127.0.0.1", port)
    except (OSError, TimeoutError):
        raise CommandError(
            f"nothing answers at {url}: start a collector there, or fix the endpoint"
        ) from None
    await stream.aclose()


def instance_name(value: str) -> str:
    if SAFE_NAME.fullmatch(value) is None:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not 1-128 characters of [A-Za-z0-9._-]")
    return value


def port_number(value: str) -> int:
    port = _whole_number(value, "a port number")
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in 0-65535")
    return port


def file_descriptor(value: str) -> int:
    fd = _whole_number(value, "a file descriptor number")
    if fd < 0:
        raise argparse.ArgumentTypeError(f"{fd} is not a file descriptor number")
    return fd


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not a number") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{shown(value)} must be a finite number > 0")
    return number


def seconds_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds in ``[low, high]`` (a 1e308 s timeout never returned;
    a 1e-300 s interval redrew 600 times a second)."""

    def parse(value: str) -> float:
        number = positive_number(value)
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{shown(value)} must be from {low:g} to {high:g} seconds")
        return number

    return parse


async def run_interruptibly(
    main: Callable[[anyio.Event], Awaitable[T]],
    grace: float = INTERRUPT_GRACE,
    *,
    forcing: Callable[[], str] | None = None,
) -> T:
    """Run ``main(stopping)``; on Ctrl-C (or SIGTERM) set ``stopping``, give it ``grace`` seconds,
    then cancel it. What ``main`` raises comes out as raised.

    ``stopping`` tells the servers ``main`` started to shut down gracefully: cancelled at once,
    each request in flight would log a traceback. What ``main`` raises once ``stopping`` is
    set (its calls to those servers failing) is the interrupt's doing: ``Interrupted`` (a
    ``KeyboardInterrupt``, with the first signal) is raised instead, for the command line to
    report in one line. A second signal within ``REPEATED_INTERRUPT`` of the first is the same
    interrupt; a later one cancels at once, after ``forcing()`` (which quiets what the cut would
    log and returns what it cuts short, said in the same one line).
    """
    stopping = anyio.Event()
    done = anyio.Event()
    results: list[T] = []
    failed: list[Exception] = []
    first: list[tuple[int, float]] = []  # the signal that started the stop, and when
    cut: list[str] = []

    async def body() -> None:
        try:
            results.append(await main(stopping))
        except Exception as exc:
            if not stopping.is_set():
                # Raised below, out of the task group: as ``main`` raised it, not wrapped in an
                # ExceptionGroup (a DemoFailed in one was a traceback, not its one line).
                failed.append(exc)
        finally:
            done.set()
            tg.cancel_scope.cancel()

    async def cancel_after_grace() -> None:
        with anyio.move_on_after(grace):
            await done.wait()
        tg.cancel_scope.cancel()

    async def watch() -> None:
        # SIGTERM (``kill``, ``timeout``, a supervisor) as Ctrl-C: the servers started are
        # stopped (it left every server of ``demo --processes`` running, reparented to init).
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                now = anyio.current_time()
                if not first:
                    first.append((int(signum), now))
                    stopping.set()
                    tg.start_soon(cancel_after_grace)
                elif now - first[0][1] >= REPEATED_INTERRUPT:
                    cut.append("what was still stopping was cancelled" if forcing is None else forcing())
                    tg.cancel_scope.cancel()
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        tg.start_soon(body)
    if first:
        raise Interrupted(first[0][0], cut[0] if cut else None)
    if failed:
        try:
            raise failed[0]
        finally:
            failed.clear()  # no reference cycle through the traceback
    return results[0]


@contextlib.contextmanager
def filtered(log_filter: logging.Filter, *loggers: str) -> Iterator[None]:
    """``log_filter`` on each of ``loggers`` for the block (a command's own word, in one line, in
    place of what the library would log there)."""
    found = [logging.getLogger(name) for name in loggers]
    for each in found:
        each.addFilter(log_filter)
    try:
        yield
    finally:
        for each in found:
            each.removeFilter(log_filter)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, ``timeout``, a cancelled CI job, a supervisor) does what Ctrl-C does, so
    a command cleans up on the way out: ``bench`` stops the servers and collectors a suite
    started (SIGTERM ended it at once and left them running, reparented to init), ``watch``
    gives the terminal its cursor back (SIGTERM left it hidden)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        # Through SIGINT's handler of the moment: inside an event loop (the httpx driver) that
        # is the loop's, which cancels its main task; raising here, inside one of its tasks,
        # had asyncio print "unhandled exception during asyncio.run() shutdown" and a traceback.
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # SIGINT ignored (a background job) or left to the default
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler (``main`` run in a thread, by a test)
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
