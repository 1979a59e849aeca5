"""The flush protocol of the export process: ``ExportProcess.force_flush`` and how the child answers.

The server writes a flush request on the child's input (a JSON object with its number, never
inside a batch's line), then waits for ``Flushed`` with that number on the report pipe
(``reports``). The child answers once its bus delivered what it read before the request
and each sink's ``force_flush`` returned. Its ``ready`` says whether it answers at all (a child
of a version before flush requests does not: it is never asked), and the fewest spans a sink of
it queues (``queue_bound``), which bounds what replay hands it between two flushes.

``FlushRequests`` is the server's half, an object ``ExportProcess`` owns (``force_flush`` asks
it); ``answer_flush`` and ``queue_bound`` are the child's (``child``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ckpt_events import Bus
from ckpt_events._logs import library_logger
from ckpt_events.sinks._export.reports import Flushed, Progress, ReportListener, ReportWriter, sink_counters
from ckpt_events.sinks._export.spawn import child_budget

if TYPE_CHECKING:
    from ckpt_events.sinks._configured import Configured

__all__ = ["FLUSH_TIMEOUT", "FlushRequests", "answer_flush", "queue_bound"]

logger: Final = library_logger("ckpt_events.sinks")

#: Seconds ``force_flush`` waits for the child's answer by default: its bus's delivery (10 s at
#: most) and each sink's own flush (OTLP's 10 s timeout) fit in it.
FLUSH_TIMEOUT: Final = 30.0
#: Seconds between two looks for the child's answer to a flush (the report thread takes it).
_FLUSH_POLL: Final = 0.002
#: Seconds a flush may wait for the bus to deliver what was read before it (each sink's
#: ``force_flush`` after that is bounded by the sink's own timeout: 10 s for OTLP).
_FLUSH_DELIVERY: Final = 10.0


class FlushRequests:
    """The server's half, a part ``ExportProcess`` owns: a flush request written to the child's
    input, its ``Flushed`` awaited on the report pipe, an unanswered flush said once.

    ``answers``: the child answers flush requests (its ``ready`` said so, and it has a report
    pipe). The owner checks its own state first (the child gone, the close begun, another
    process's copy) and passes what a request reads of it while it waits (``ask``): nothing here
    is on the per-batch path."""

    def __init__(self, pid: int, pipe: int, reports: ReportListener | None, answers: bool) -> None:
        self._pid = pid
        self._pipe = pipe
        self._reports = reports
        self.answers = answers and reports is not None
        self._number = 0
        self._said = False

    async def ask(
        self,
        timeout: float | None,
        close_timeout: float,
        mid_line: Callable[[], bool],
        closing: Callable[[], bool],
    ) -> bool:
        """``ExportProcess.force_flush`` once its own checks passed: the request written whole
        when the owner is not ``mid_line`` (writing a batch's line), with the child's close
        budget of ``close_timeout``; ``Flushed`` with its number awaited. ``closing`` says the
        owner's close began, which says what the child's sinks lost: an answer lost to it is not
        said here."""
        seconds = FLUSH_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + seconds
        reports = self._reports
        if not self.answers or reports is None:
            self._unanswered("it does not answer flush requests (a ckpt_events before them runs it)")
            return False
        self._number += 1
        number = self._number
        request = {"close_timeout": child_budget(close_timeout), "flush": number}
        line = msgspec.json.encode(request) + b"\n"
        # Written whole or not at all (shorter than PIPE_BUF), never inside a batch's line.
        while True:
            if not mid_line():
                try:
                    os.write(self._pipe, line)
                    break
                except BlockingIOError:
                    pass
                except OSError:  # the child is gone: the next batch says it, with its counts
                    return False
            if time.monotonic() >= deadline:
                self._unanswered(f"its input stayed full for {seconds:g} s")
                return False
            await anyio.sleep(_FLUSH_POLL)
        while (answer := reports.flushed) is None or answer.number < number:
            # The listener ends once the child exited and every report it sent was read.
            if not reports.running:
                answer = reports.flushed
                if answer is not None and answer.number >= number:
                    break
                if not closing():  # a close under way says what the child's sinks lost
                    self._unanswered("it ended before it answered")
                return False
            if time.monotonic() >= deadline:
                self._unanswered(f"no answer within {seconds:g} s")
                return False
            await anyio.sleep(_FLUSH_POLL)
        return answer.done

    def _unanswered(self, why: str) -> None:
        """Say once that a flush could not be waited for; what its sinks drop, they count."""
        if self._said:
            return
        self._said = True
        logger.warning(
            "ckpt_events: the export process (pid %d) could not be flushed: %s; what was written "
            "to it is not known to be exported (its sinks count what they drop: "
            "ExportProcess.stats().sinks; further such flushes are not logged)",
            self._pid,
            why,
        )


async def answer_flush(
    number: int, bus: Bus, configured: Configured, writer: ReportWriter, lock: anyio.Lock
) -> None:
    """Answer the flush request ``number``: the bus's delivery of what was read before it, then
    each sink's ``force_flush`` (in a worker thread: ours block up to their own timeout), then
    the counters and ``Flushed`` on the report pipe."""
    async with lock:
        done = await bus.flush(_FLUSH_DELIVERY)
        for sub in configured.subscriptions:
            force_flush = getattr(sub.sink, "force_flush", None)  # no part of the Sink Protocol
            if not callable(force_flush):
                continue
            try:
                exported = await anyio.to_thread.run_sync(force_flush, abandon_on_cancel=True)
            except Exception:  # a sink's failure: logged to the server, the flush said not done
                logger.exception("ckpt_events: the export process's sink %s failed to flush", sub.name)
                exported = False
            done = done and exported is not False
        writer.progress(Progress(bus.stats(), sink_counters(configured.subscriptions)))
        writer.flushed(Flushed(number, done))


def queue_bound(configured: Configured) -> int | None:
    """The fewest spans a sink with ``force_flush`` takes at a time without dropping (its
    ``max_queue``, else ``max_export_batch``), as replay reads it of a sink in process: the
    parent hands at most so many events between two flushes."""
    bounds: list[int] = []
    for sub in configured.subscriptions:
        if not callable(getattr(sub.sink, "force_flush", None)):
            continue
        for name in ("max_queue", "max_export_batch"):
            value = getattr(sub.sink, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                bounds.append(value)
                break
    return min(bounds, default=None)
