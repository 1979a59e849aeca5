"""How a stop of ``serve`` is said: what its workers' own ports cut, in the command's one line,
and a stop signal that comes as it winds down (``asyncio.run`` cleaning up) taken as that stop.

``serve``'s uvicorn server (``once_per_interrupt``'s) ends ``serve()`` with ``Interrupted`` when a
stop cut requests; these add what a ``--workers`` server's workers cut on their own ports
(``WorkerCoordinator.port_cuts``), and keep its line said whatever signal comes after.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from ckpt_events.participants.errors import Interrupted

__all__ = ["counting_ports_cut", "ports_cut", "stop_signals_said_as_the_end", "with_ports_cut"]


def counting_ports_cut(base: type[Any]) -> type[Any]:
    """uvicorn's server (``base``, made by ``once_per_interrupt``), whose stop by a signal
    ends ``serve()`` with ``Interrupted`` when the workers' own ports cut requests, even if
    its own port cut none (``with_ports_cut`` then says them)."""

    class CountingPortsCut(base):  # type: ignore[misc]  # uvicorn is imported lazily
        def cut_elsewhere(self) -> bool:
            return ports_cut(self.config.app) is not None

    return CountingPortsCut


def ports_cut(app: Any) -> str | None:
    """What the workers' own ports cut as the server stopped, in words for its one line: how
    many requests, the first few named with their worker, and the workers that did not say
    (their cuts unknown, never counted as none); ``None`` if nothing, or no workers."""
    from ckpt_events.participants.server.interrupts import forced_exit_cut

    cuts = getattr(getattr(app.state, "coordinator", None), "port_cuts", None)
    if cuts is None:
        return None
    said = []
    if cuts.requests:
        said.append(f"on its workers' own ports, {forced_exit_cut(cuts.requests, lifespan_cut=False)}")
    if cuts.unreported:
        many = len(cuts.unreported) > 1
        said.append(
            f"worker{'s' if many else ''} {', '.join(map(str, cuts.unreported))} did not say what "
            f"{'their' if many else 'its'} own port{'s' if many else ''} cut (not counted)"
        )
    return "; ".join(said) or None


def with_ports_cut(exc: Interrupted, app: Any) -> Interrupted:
    """``exc``, saying what the workers' own ports cut too (after the forced exit's cut if the
    exit was forced: they were cut after it, as the server's lifespan ended)."""
    clause = ports_cut(app)
    if clause is None:
        return exc
    if exc.cut is not None:
        return Interrupted(exc.signum, f"{exc.cut}; {clause}", exc.stopped)
    return Interrupted(exc.signum, None, clause if exc.stopped is None else f"{exc.stopped}; {clause}")


@contextlib.contextmanager
def stop_signals_said_as_the_end(server: Any) -> Iterator[None]:
    """Around ``server.run()``: a SIGINT or SIGTERM once ``serve()`` has ended with
    ``Interrupted`` (a forced exit, or a stop that cut requests: the server's ``interrupted``),
    while ``asyncio.run`` cancels what is left, before the command says its line, ends the
    command with that ``Interrupted``, its one line said. Their handlers were Python's
    again there: a SIGTERM killed the process, what the forced exit cut never said (-15, no
    line), a SIGINT's ``KeyboardInterrupt`` took the place of the ``Interrupted`` (the line said
    only "interrupted", and 130 after a SIGTERM's stop). Any other is handled as before (uvicorn
    stops gracefully on one while serving, and then raises it again: the process ends of it)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # as uvicorn does for its signals: only the main thread may set handlers
        return
    stops = (signal.SIGINT, signal.SIGTERM)
    previous: dict[int, Any] = {signum: signal.getsignal(signum) for signum in stops}

    def stop(signum: int, frame: FrameType | None) -> None:
        ended = getattr(server, "interrupted", None)  # once_per_interrupt's
        if ended is not None:
            raise ended
        before = previous[signum]
        if callable(before):
            before(signum, frame)  # Python's for SIGINT: a KeyboardInterrupt
        elif before != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    for signum in stops:
        signal.signal(signum, stop)
    try:
        yield
    except KeyboardInterrupt:
        # The command now says its line and ends: another stop signal is the same stop.
        for signum in stops:
            signal.signal(signum, signal.SIG_IGN)
        raise
    finally:
        for signum in stops:
            if signal.getsignal(signum) is stop:
                before = previous[signum]
                signal.signal(signum, signal.SIG_DFL if before is None else before)
