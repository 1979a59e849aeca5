"""The flush protocol of the export process: ``ExportProcess.force_flush`` and how the child answers.

The server writes a flush request on the child's input (a JSON object with its number, never
inside a batch's line), then waits for ``Flushed`` with that number on the report pipe
(``reports``). The child answers once its bus delivered what it read before the request
and each sink's ``force_flush`` returned. Its ``ready`` says whether it answers at all (a child
of a version before flush requests does not: it is never asked), and the fewest spans a sink of
it queues (``queue_bound``), which bounds what replay hands it between two flushes.

``FlushRequests`` is the server's half, a part of ``ExportProcess`` (its state is set by
``ExportProcess.__init__``); ``answer_flush`` and ``queue_bound`` are the child's
(``child``).
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ckpt_events import Bus
from ckpt_events._logs import library_logger
from ckpt_events.sinks._export.reports import Flushed, Progress, ReportListener, ReportWriter, sink_counters
from ckpt_events.sinks._export.spawn import child_budget

if TYPE_CHECKING:
    from ckpt_events.sinks._configure import Configured

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
    """``ExportProcess.force_flush``: a flush request written to the child, its answer awaited."""

    # Set by ExportProcess.__init__ (the pipe, the child, their state), read here.
    close_timeout: float
    _process: subprocess.Popen[bytes]
    _reports: ReportListener | None
    _pipe: int
    _owner: int
    _gone: bool
    _closing: bool
    #: handle() is writing a batch: a flush request waits for its end.
    _mid_line: bool
    #: The child answers flush requests (its ``ready`` said so, and it has a report pipe).
    _flushes: bool
    _flush_number: int
    _said_flush: bool

    async def force_flush(self, timeout: float | None = None) -> bool:
        """Wait until the child delivered every event written to its pipe before this call and
        its sinks exported them (each sink's ``force_flush``, within its own timeout), at most
        ``timeout`` seconds (default ``FLUSH_TIMEOUT``). ``True`` when the child said all were
        exported; ``False`` when not (what its sinks dropped is in ``stats().sinks``), when it
        did not answer in time, is gone or closing, or does not answer flush requests (a child
        of a version before them: said once, not waited for)."""
        seconds = FLUSH_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + seconds
        if self._gone or self._closing or os.getpid() != self._owner or self._process.poll() is not None:
            return False
        if not self._flushes or self._reports is None:
            self._flush_unanswered("it does not answer flush requests (a ckpt_events before them runs it)")
            return False
        self._flush_number += 1
        number = self._flush_number
        request = {"close_timeout": child_budget(self.close_timeout), "flush": number}
        line = msgspec.json.encode(request) + b"\n"
        # Written whole or not at all (shorter than PIPE_BUF), never inside a batch's line.
        while True:
            if not self._mid_line:
                try:
                    os.write(self._pipe, line)
                    break
                except BlockingIOError:
                    pass
                except OSError:  # the child is gone: the next batch says it, with its counts
                    return False
            if time.monotonic() >= deadline:
                self._flush_unanswered(f"its input stayed full for {seconds:g} s")
                return False
            await anyio.sleep(_FLUSH_POLL)
        reports = self._reports
        while (answer := reports.flushed) is None or answer.number < number:
            # The listener ends once the child exited and every report it sent was read.
            if not reports.running:
                answer = reports.flushed
                if answer is not None and answer.number >= number:
                    break
                if not self._closing:  # a close under way says what the child's sinks lost
                    self._flush_unanswered("it ended before it answered")
                return False
            if time.monotonic() >= deadline:
                self._flush_unanswered(f"no answer within {seconds:g} s")
                return False
            await anyio.sleep(_FLUSH_POLL)
        return answer.done

    def _flush_unanswered(self, why: str) -> None:
        """Say once that a flush could not be waited for; what its sinks drop, they count."""
        if self._said_flush:
            return
        self._said_flush = True
        logger.warning(
            "ckpt_events: the export process (pid %d) could not be flushed: %s; what was written "
            "to it is not known to be exported (its sinks count what they drop: "
            "ExportProcess.stats().sinks; further such flushes are not logged)",
            self._process.pid,
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
