"""One interrupt, one stop: uvicorn's server for ``serve`` and for a worker's own port.

uvicorn takes a second SIGINT for a second Ctrl-C and forces the exit: requests in flight are
cut, and ``serve``'s lifespan is cancelled before its sinks close, unless its shutdown is
already running: uvicorn then waits for it (``serve``'s sinks close within ``SHUTDOWN_TIMEOUT``,
2 s), and the force cuts only what is still in flight. ``timeout -s INT`` and
supervisors signal a process and then its group, so one interrupt often arrives twice, a few
milliseconds apart; ``once_per_interrupt`` takes a SIGINT that soon after the first stop
signal for that one. It also takes SIGHUP (the terminal closed, an ssh session dropped) as
SIGTERM: uvicorn leaves it to its default action, which killed the server at once, its sinks
never closed (the spans an OTLP sink held never sent).

A forced exit cancels the requests still running at once. uvicorn only stops waiting for them
and then awaits ``asyncio.Server.wait_closed()``, which since Python 3.12 waits for every
connection to close: a request still reading its body held the "forced" exit until the
graceful-shutdown deadline (without one, until the request ended), where on 3.11 it ended at once.

What a forced exit cut is said once, by the ``Interrupted`` the server then raises (its
``cut``: how many requests were in flight, the first few named, and whether the app's lifespan
was cut before it closed its sinks), where each cut was a line of the log. So is what the
graceful-shutdown deadline of a stop by a signal cut (its ``stopped``): uvicorn's own "Cancel N
running task(s), timeout graceful shutdown exceeded" was an ``ERROR:`` line next to ours after
a Ctrl-C, and the only line after a SIGTERM or SIGHUP (the process then died of the signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from ckpt_events.checks import fit_text
from ckpt_events.participants.errors import Interrupted

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "FORCED_EXIT",
    "REPEATED_SIGNAL",
    "UVICORN_CANCELS",
    "cut_in_flight",
    "forced_exit_cut",
    "once_per_interrupt",
]

#: A second SIGINT this soon after the first is the same interrupt: the same one delivered twice
#: (``timeout -s INT`` and supervisors signal the process and then its group), or Ctrl-C pressed
#: twice quickly by someone who wants the stop, not its force. Forced, the exit cancels the
#: lifespan, its events unwritten; the graceful stop is bounded (``timeout_graceful_shutdown``).
#: As ``ckpt-events demo`` takes a second signal (``REPEATED_INTERRUPT``, 1 s).
REPEATED_SIGNAL: Final = 1.0

#: The message of the cancellation a forced exit sends each running request (uvicorn's own, at
#: its graceful-shutdown deadline, names that deadline; the two are logged apart).
FORCED_EXIT: Final = "Task cancelled, the exit was forced"

#: uvicorn's line (its format) saying how many requests it cancels at the graceful deadline.
UVICORN_CANCELS: Final = "Cancel %s running task(s), timeout graceful shutdown exceeded"
#: The logger uvicorn says it on.
_UVICORN_LOGGER: Final = "uvicorn.error"

#: Requests named in the one line of a forced exit; the rest are counted ("and 7 more").
NAMED_CUTS: Final = 3
#: Characters of a request's path shown in that line (a path may be up to a request head long).
_PATH_SHOWN: Final = 60


def once_per_interrupt(base: type[uvicorn.Server]) -> type[uvicorn.Server]:
    """uvicorn's server (``base``), taking a SIGINT within ``REPEATED_SIGNAL`` of the first stop
    signal for that one (uvicorn forces the exit on a second SIGINT); a later one still forces it.
    A stop by a signal whose graceful-shutdown deadline cut requests in flight ends ``serve()``
    with ``Interrupted`` too (its ``stopped``: how many, the first few named), in place of
    uvicorn's "Cancel N running task(s)" line and of the signal raised again.
    SIGHUP stops it gracefully as SIGTERM does (and, as after SIGTERM, the process then ends of
    it), unless it was ignored (``nohup``): then it still is. A SIGTERM or SIGHUP once a stop is
    under way is that stop: the process ends of the first signal. A forced exit cancels the requests
    still running then, on every Python (see the module's docstring), and ``serve()`` then raises
    ``Interrupted`` (the first stop signal's number, what was cut) in place of the signals
    uvicorn would raise again on its way out."""

    class OncePerInterrupt(base):  # type: ignore[misc,valid-type]  # uvicorn is imported lazily
        _first_stop: float | None = None
        _first_signal: int = signal.SIGINT
        _cut: bool = False
        #: The requests the forced exit cancelled ("POST /work/start"; "" for one not known), once forced.
        _cut_requests: list[str] | None = None
        #: What the graceful-shutdown deadline of a stop by a signal cut, in words, once it has.
        _deadline_cut: str | None = None
        #: The ``Interrupted`` ``serve()`` ended with, once it has (a signal after that, while
        #: ``asyncio.run`` cleans up, is the same stop: ``serve`` says this one's line).
        interrupted: Interrupted | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                with self._hangup_as_terminate(), self._deadline_said_by_us():
                    yield
                if self._cut:
                    # Forced: serve() may end before the loop runs the cancellation the signal
                    # handler scheduled (the signal uvicorn took was then raised again, a
                    # KeyboardInterrupt past this line, in a clean-clone run); made here if so.
                    self._cancel_running()
                # Raised here, so uvicorn does not raise the signals it took again.
                ended = self._ended()
                if ended is not None:
                    self.interrupted = ended
                    raise ended

        def _ended(self) -> Interrupted | None:
            """What ``serve()`` ends with in place of the signals uvicorn would raise again, if
            the stop cut anything: ``None`` if not (the process then ends of the signal)."""
            if self._cut_requests is not None:
                # Forced: after a SIGTERM, the forcing SIGINT went to asyncio's handler (which
                # only cancels) and the SIGTERM then killed the process, what was cut never said (-15).
                return self._forced()
            if self._deadline_cut is not None:
                # As for a forced exit: said in the command's one line (after a SIGTERM the
                # process died of the signal, -15, that line unsaid).
                return Interrupted(self._first_signal, stopped=self._deadline_cut)
            if self._first_stop is not None and self.cut_elsewhere():
                # Nothing cut here, but the stop cut requests served elsewhere: said in the
                # command's one line too (SIGHUP's handler is the default by the time uvicorn
                # raises it again: the process died of it, -1).
                return Interrupted(self._first_signal)
            return None

        def cut_elsewhere(self) -> bool:
            """Whether the stop cut requests this server does not serve (then it ends with
            ``Interrupted``, as when it cuts its own): never, here; ``serve --workers`` asks
            whether its workers' own ports cut any."""
            return False

        @contextlib.contextmanager
        def _deadline_said_by_us(self) -> Iterator[None]:
            # First of the logger's filters: ``log_shutdown_cuts_in_one_line``'s rewrites the record.
            logger = logging.getLogger(_UVICORN_LOGGER)
            logger.filters.insert(0, self._said_at_the_deadline)
            try:
                yield
            finally:
                logger.removeFilter(self._said_at_the_deadline)

        def _said_at_the_deadline(self, record: logging.LogRecord) -> bool:
            """Whether ``record`` is to be logged: not uvicorn's "Cancel N running task(s)" of a
            stop by a signal, kept (with the requests it cancels, named) for the one line.
            Asked before uvicorn cancels them: they are still in flight. A stop of the app's own
            (``should_exit``) leaves it logged: no line of ours follows."""
            if record.msg != UVICORN_CANCELS or self._first_stop is None:
                return True
            args = record.args if isinstance(record.args, tuple) else ()
            count = args[0] if len(args) == 1 and isinstance(args[0], int) else len(self.server_state.tasks)
            named = _requests_in_flight(self.server_state.connections)
            requests = _each_cut(named, count)
            deadline = self.config.timeout_graceful_shutdown
            self._deadline_cut = (
                f"at the {deadline} s shutdown deadline, {forced_exit_cut(requests, lifespan_cut=False)}"
            )
            return False

        def _forced(self) -> Interrupted:
            # Asked before ``serve()`` returns: then asyncio.run cancels the lifespan task,
            # which then counts as shut down.
            ended = getattr(getattr(self, "lifespan", None), "shutdown_event", None)
            lifespan_cut = ended is not None and not ended.is_set()
            cut = forced_exit_cut(self._cut_requests or [], lifespan_cut=lifespan_cut)
            return Interrupted(self._first_signal, cut, stopped=self._deadline_cut)

        @contextlib.contextmanager
        def _hangup_as_terminate(self) -> Iterator[None]:
            # As uvicorn does for its signals: only the main thread may set handlers.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            if signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL:
                yield  # ignored (nohup) or the embedder's own handler: left as it is
                return
            signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, signal.SIG_DFL)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            first = self._first_stop
            if first is not None and sig == signal.SIGINT and now - first < REPEATED_SIGNAL:
                return
            if first is not None and sig != signal.SIGINT:
                # A SIGTERM or SIGHUP once a stop is under way is that stop (neither forces it):
                # uvicorn raised it again first on its way out, so the process ended of it, not
                # of the first (after a Ctrl-C: -15 or -1, its line never said).
                return
            if first is None:
                self._first_stop = now
                self._first_signal = sig
            super().handle_exit(sig, frame)
            if self.force_exit and not self._cut:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # not serving (yet or any more): no request to cut
                self._cut = True
                # A signal handler runs between two bytecodes of whatever the loop was doing:
                # the cancellations are scheduled, not made from here.
                loop.call_soon_threadsafe(self._cancel_running)

        def _cancel_running(self) -> None:
            if self._cut_requests is not None:
                return  # made already: as serve() left, or by the loop before that
            self._cut_requests = _cancel_in_flight(self)

    return OncePerInterrupt


def cut_in_flight(server: uvicorn.Server) -> list[str]:
    """Stop ``server`` taking requests and cancel those it still serves, now (as a forced exit
    does: their tracebacks are DEBUG records); returns each one cut (``"METHOD /path"``, ``""``
    for one not known). A ``--workers`` worker's port, as its server stops: those requests were
    cut as the worker ended, counted nowhere."""
    server.should_exit = True
    return _cancel_in_flight(server)


def _cancel_in_flight(server: uvicorn.Server) -> list[str]:
    """Cancel the requests ``server`` still serves (their tracebacks are DEBUG records, by
    ``FORCED_EXIT``); each one cut, named as ``_each_cut`` names them."""
    running = [task for task in server.server_state.tasks if not task.done()]
    cut = _each_cut(_requests_in_flight(server.server_state.connections), len(running))
    for task in running:
        task.cancel(msg=FORCED_EXIT)
    return cut


def _each_cut(named: list[str], count: int) -> list[str]:
    """``count`` requests cut, each ``"METHOD /path"`` as ``named`` (those still in flight on a
    connection) says, ``""`` for one not known; all of ``named`` if it holds more."""
    return (named + [""] * count)[: max(count, len(named))]


def _requests_in_flight(connections: Iterable[Any]) -> list[str]:
    """``"METHOD /path"`` of each request still being served on ``connections`` (uvicorn's HTTP
    protocols: a request's cycle, with its ASGI scope, until its response is complete); a
    connection of another shape is skipped (counted by its task alone)."""
    found = []
    for connection in connections:
        cycle = getattr(connection, "cycle", None)
        scope = getattr(cycle, "scope", None)
        if not isinstance(scope, dict) or getattr(cycle, "response_complete", True):
            continue
        method, path = scope.get("method"), scope.get("path")
        if isinstance(method, str) and isinstance(path, str):
            found.append(f"{method[:16]} {fit_text(path, _PATH_SHOWN, sized=False)}")
    return found


def forced_exit_cut(requests: list[str], *, lifespan_cut: bool) -> str:
    """What a forced exit cut, in words for one line: how many ``requests`` were in flight, the
    first ``NAMED_CUTS`` kinds of those known named (the most frequent first, "x2" for two alike;
    ``""`` is a request not known), the rest counted; and, if ``lifespan_cut``, that events not
    yet written or exported may be lost."""
    count = len(requests)
    if count == 0:
        said = "no request was in flight"
    else:
        said = f"{count} request{'s' if count != 1 else ''} in flight {'were' if count != 1 else 'was'} cut"
        alike = sorted(Counter(r for r in requests if r).items(), key=lambda item: (-item[1], item[0]))
        shown = alike[:NAMED_CUTS]
        if shown:
            more = count - sum(times for _, times in shown)
            names = [name if times == 1 else f"{name} x{times}" for name, times in shown]
            said += f" ({', '.join(names)}{f' and {more} more' if more else ''})"
    if lifespan_cut:
        said += (
            "; the app's lifespan was cancelled before it closed its sinks: events not yet "
            "written or exported may be lost"
        )
    return said
