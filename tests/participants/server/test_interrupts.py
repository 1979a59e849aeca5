"""once_per_interrupt: a forced exit (a second Ctrl-C) cuts the requests still running at once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import anyio
import pytest
import uvicorn
from fastapi import FastAPI, Request

from ckpt_events.participants.errors import Interrupted
from ckpt_events.participants.server.interrupts import REPEATED_SIGNAL, forced_exit_cut, once_per_interrupt
from ckpt_events.participants.server.limits import (
    SHUTDOWN_CUT_LOGGER,
    log_shutdown_cuts_in_one_line,
    server_limits,
)

#: Far longer than the forced exit may take: a run that waited for it is plain to see.
GRACE = 5


def _reading_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    return app


async def test_a_forced_exit_cuts_a_request_still_reading_its_body_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ctrl-C, then Ctrl-C again while a request still waits for its body: the request is
    cancelled (its client answered) before ``serve()`` returns. On Python
    3.12 and later, uvicorn's ``wait_closed()`` waited for its connection, so the forced exit
    took the whole graceful deadline; on 3.11 ``serve()`` returned with the request still
    running, its client unanswered. ``serve()`` raises ``Interrupted`` saying what it cut (the
    command's one line); the cut request's own record is DEBUG (it was an ERROR line of its own)."""
    installed = log_shutdown_cuts_in_one_line()
    caplog.set_level(logging.DEBUG, SHUTDOWN_CUT_LOGGER)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: uvicorn leaves its loggers propagating, to caplog.
    config = uvicorn.Config(
        _reading_app(), lifespan="off", log_config=None, timeout_graceful_shutdown=GRACE, **server_limits()
    )
    server = once_per_interrupt(uvicorn.Server)(config)
    # uvicorn raises each signal it took again once it has stopped, to the handler it found:
    # this one raises it, as Python's own does, inside ``serve()`` only.
    raised_again: list[int] = []

    def raise_again(sig: int, frame: object) -> None:
        raised_again.append(sig)
        raise KeyboardInterrupt

    interrupted: list[Interrupted] = []
    previous = signal.signal(signal.SIGINT, raise_again)
    try:
        async with anyio.create_task_group() as tg:

            async def serve_and_time() -> None:
                try:
                    await server.serve([sock])
                except Interrupted as exc:
                    interrupted.append(exc)
                took.append(time.monotonic() - forced_at[0])

            took: list[float] = []
            forced_at = [0.0]
            tg.start_soon(serve_and_time)
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            held = await anyio.connect_tcp("127.0.0.1", port)
            async with held:
                await held.send(
                    b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 100\r\n\r\n{"
                )
                await anyio.sleep(0.2)
                signal.raise_signal(signal.SIGINT)  # Ctrl-C: the graceful shutdown
                await anyio.sleep(REPEATED_SIGNAL + 0.2)
                forced_at[0] = time.monotonic()
                signal.raise_signal(signal.SIGINT)  # Ctrl-C again: the exit is forced
                with anyio.fail_after(GRACE + 5):
                    while not took:
                        await anyio.sleep(0.01)
                # The request was cut, not left running: its client has its answer by now.
                with anyio.fail_after(1):
                    answer = await held.receive()
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.getLogger(SHUTDOWN_CUT_LOGGER).removeFilter(installed)
        sock.close()
    # Not raised again: after a SIGTERM, that SIGTERM killed the process, the cut unsaid (-15).
    assert server.force_exit and raised_again == []
    assert [(e.signum, e.cut) for e in interrupted] == [
        (signal.SIGINT, "1 request in flight was cut (POST /echo)")
    ]
    assert took[0] < 1.0, f"the forced exit took {took[0]:.1f} s, the graceful deadline is {GRACE} s"
    assert answer.startswith(b"HTTP/1.1 500 ")
    cut = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == SHUTDOWN_CUT_LOGGER]
    assert cut.count(("DEBUG", "a request still running when the exit was forced was cancelled")) == 1, cut
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], cut
    assert not any("graceful shutdown exceeded" in line for line in cut), cut


def test_what_a_forced_exit_cut_is_said_in_words_for_one_line() -> None:
    """Counted, the most frequent requests named first (two alike once, "x2"), at most three
    kinds, the rest "and N more"; a request not known counted, never named; the lifespan said
    only when it was cut."""
    many = ["POST /work/start"] * 2 + ["GET /b", "", "POST /commit", "POST /prepare", "POST /z"]
    assert forced_exit_cut(many, lifespan_cut=False) == (
        "7 requests in flight were cut (POST /work/start x2, GET /b, POST /commit and 3 more)"
    )
    assert (
        forced_exit_cut(["POST /commit"], lifespan_cut=False) == "1 request in flight was cut (POST /commit)"
    )
    assert forced_exit_cut(["", ""], lifespan_cut=False) == "2 requests in flight were cut"
    assert forced_exit_cut([], lifespan_cut=True) == (
        "no request was in flight; the app's lifespan was cancelled before it closed its sinks: "
        "events not yet written or exported may be lost"
    )


def _holding_app(entered: anyio.Event, cancels: list[int]) -> FastAPI:
    """``GET /hold`` waits on an event never set; when cancelled, how many cancellations its task
    had pending is noted in ``cancels``."""
    app = FastAPI()
    never = anyio.Event()

    @app.get("/hold")
    async def hold() -> None:
        entered.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancels.append(task.cancelling() if task is not None else -1)
            raise

    return app


class _ForceAsServeEnds(logging.Handler):
    """On uvicorn's "Waiting for connections to close" (logged in ``serve()``'s own step, just
    before it sleeps 0.1 s between looks), arranges a second SIGINT in the one loop iteration
    where that sleep has ended and ``serve()`` has not yet resumed: the loop is blocked past the
    sleep's end and past a timer due just after it (``REPEATED_SIGNAL`` after the first SIGINT, so
    not taken for the same one); then the sleep's timer queues ``serve()``'s step and the SIGINT,
    raised from the later timer, queues the cancellation after it: ``serve()`` runs to its end
    before the loop runs what the signal handler scheduled."""

    def __init__(self, served: list[float]) -> None:
        super().__init__(logging.INFO)
        self.served = served
        #: Whether ``serve()`` had ended when the loop ran the calls the handler scheduled.
        self.ended_first: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith("Waiting for connections to close"):
            return
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, self._second_interrupt, loop)
        loop.call_soon(time.sleep, REPEATED_SIGNAL + 0.3)  # serve() sleeps by then: it blocks the loop

    def _second_interrupt(self, loop: asyncio.AbstractEventLoop) -> None:
        signal.raise_signal(signal.SIGINT)  # its handler runs here, between two of the loop's calls
        loop.call_soon(lambda: self.ended_first.append(bool(self.served)))


async def test_a_forced_exit_whose_serve_ends_before_the_loop_runs_its_cancellation_says_the_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second Ctrl-C's handler schedules the cancellation of the running requests on the loop,
    and ``serve()`` can end before the loop runs it (a clean-clone CI run): nothing was cancelled
    or said, and uvicorn raised the SIGINTs it took again, a ``KeyboardInterrupt`` past the
    one-line ``Interrupted``. Forced here: the request is cancelled once (its task saw one
    cancellation, not the late scheduled call's second) and named in ``Interrupted``'s one line."""
    caplog.set_level(logging.INFO, "uvicorn.error")  # the "Waiting for connections" line is made
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    entered = anyio.Event()
    cancels: list[int] = []
    config = uvicorn.Config(
        _holding_app(entered, cancels),
        lifespan="off",
        log_config=None,
        timeout_graceful_shutdown=GRACE,
        **server_limits(),
    )
    server = once_per_interrupt(uvicorn.Server)(config)
    # What uvicorn raised again on its way out, noted (the process's KeyboardInterrupt).
    raised_again: list[int] = []
    served: list[float] = []
    forcing = _ForceAsServeEnds(served)
    interrupted: list[Interrupted] = []
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(forcing)
    previous = signal.signal(signal.SIGINT, lambda sig, frame: raised_again.append(sig))
    try:
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                try:
                    await server.serve([sock])
                except Interrupted as exc:
                    interrupted.append(exc)
                finally:
                    served.append(time.monotonic())

            tg.start_soon(serve)
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            held = await anyio.connect_tcp("127.0.0.1", port)
            async with held:
                await held.send(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
                with anyio.fail_after(5):
                    await entered.wait()
                signal.raise_signal(signal.SIGINT)  # Ctrl-C: the graceful shutdown
                with anyio.fail_after(GRACE):
                    while not (served and forcing.ended_first and cancels):
                        await anyio.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
        uvicorn_log.removeHandler(forcing)
        sock.close()
    if sys.version_info < (3, 12):
        # The interleaving was made: on 3.12 and later, wait_closed() waits for the connection,
        # so the loop runs the scheduled cancellation before serve() ends in any case.
        assert forcing.ended_first == [True]
    assert server.force_exit and raised_again == []
    assert [(e.signum, e.cut) for e in interrupted] == [
        (signal.SIGINT, "1 request in flight was cut (GET /hold)")
    ]
    assert cancels == [1]


#: A server stopped by a Ctrl-C and then, while it stops, by ``$THEN_SIGNAL`` (as a supervisor's
#: SIGTERM, or a terminal closed); how the process ended is its exit status.
_STOPPED_TWICE = """
import asyncio, os, signal, socket, sys
import uvicorn
from fastapi import FastAPI
from ckpt_events.participants.server.interrupts import once_per_interrupt

server = once_per_interrupt(uvicorn.Server)(uvicorn.Config(FastAPI(), lifespan="off", log_level="warning"))
sock = socket.socket()
sock.bind(("127.0.0.1", 0))

async def main():
    async def stop():
        while not server.started:
            await asyncio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(int(os.environ["THEN_SIGNAL"]))

    task = asyncio.get_running_loop().create_task(stop())
    await server.serve([sock])
    await task

try:
    asyncio.run(main())
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("then", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_a_ctrl_c_stops_the_server_ends_it_as_the_ctrl_c(then: int) -> None:
    """Ctrl-C, then a SIGTERM or SIGHUP while the server stops: uvicorn raised both again on its
    way out, the later first, so the process died of it (-15, -1), the Ctrl-C's line never said;
    now it ends of the Ctrl-C (130), as the first signal decides the exit elsewhere."""
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED_TWICE],
        check=False,
        env={**os.environ, "THEN_SIGNAL": str(int(then))},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stderr) == (130, "")


async def _stopped_with_a_request_held(
    stop: object,
) -> tuple[list[Interrupted], list[int], list[logging.LogRecord]]:
    """Serve ``_reading_app`` (a 1 s graceful deadline) with a request still reading its body,
    stop it with ``stop(server)``; what ``serve()`` raised, the signals raised again, and what
    ``uvicorn.error`` logged (``log_shutdown_cuts_in_one_line`` installed, as ``serve`` does).
    The server's own filter is gone once it has stopped: a user's app later served is untouched."""
    before = list(logging.getLogger(SHUTDOWN_CUT_LOGGER).filters)
    installed = log_shutdown_cuts_in_one_line()
    records: list[logging.LogRecord] = []
    catch = logging.Handler()
    catch.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(SHUTDOWN_CUT_LOGGER)
    logger.addHandler(catch)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        _reading_app(), lifespan="off", log_config=None, timeout_graceful_shutdown=1, **server_limits()
    )
    server = once_per_interrupt(uvicorn.Server)(config)
    raised_again: list[int] = []
    interrupted: list[Interrupted] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: raised_again.append(sig))
    try:
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                try:
                    await server.serve([sock])
                except Interrupted as exc:
                    interrupted.append(exc)

            tg.start_soon(serve)
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            async with await anyio.connect_tcp("127.0.0.1", port) as held:
                await held.send(
                    b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 100\r\n\r\n{"
                )
                await anyio.sleep(0.2)
                stop(server)  # type: ignore[operator]
                with anyio.fail_after(5):
                    await held.receive()  # cut at the deadline: answered 500
    finally:
        signal.signal(signal.SIGTERM, previous)
        logger.removeHandler(catch)
        logger.removeFilter(installed)
        sock.close()
    assert logger.filters == [f for f in before if f is not installed]
    return interrupted, raised_again, records


async def test_a_stop_by_a_signal_whose_deadline_cuts_a_request_says_it_once() -> None:
    """SIGTERM while a request reads its body: cut at the graceful deadline. uvicorn's "Cancel 1
    running task(s), timeout graceful shutdown exceeded" was an ERROR line of its own, and the
    SIGTERM raised again then killed the process, nothing of ours said (-15). Now ``serve()``
    raises ``Interrupted`` saying the cut (the request named), the signal not raised again, and
    nothing is logged at WARNING or above."""
    interrupted, raised_again, records = await _stopped_with_a_request_held(
        lambda server: signal.raise_signal(signal.SIGTERM)
    )
    assert [(e.signum, e.stopped, e.cut) for e in interrupted] == [
        (signal.SIGTERM, "at the 1 s shutdown deadline, 1 request in flight was cut (POST /echo)", None)
    ]
    assert raised_again == []
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


async def test_a_stop_of_the_apps_own_whose_deadline_cuts_a_request_leaves_uvicorns_line() -> None:
    """A stop with no signal (``serve``'s workers' restart budget spent sets ``should_exit``): no
    line of ours follows, so uvicorn's line of the cut is still logged (in ``serve``'s words)."""
    interrupted, raised_again, records = await _stopped_with_a_request_held(
        lambda server: setattr(server, "should_exit", True)
    )
    assert (interrupted, raised_again) == ([], [])
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == [
        "1 request(s) still running at the shutdown deadline (timeout_graceful_shutdown) were cancelled"
    ]
