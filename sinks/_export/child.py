"""The export process's own side: ``configure()`` in a child process, fed the parent's events.

``python -m ckpt_events.sinks._export.child`` is started by ``ExportProcess``
(``ckpt_events.sinks._export.process``), never by hand. Its stdin carries, one line each, first
the arguments ``configure()`` was given and the seconds its close may take (a JSON object), then
every batch the parent's bus delivered (a JSON array of its events and span handles,
``ckpt_events.sinks._export.wire``; a line never holds a raw newline), between them a flush
request (a JSON object with its number: ``ExportProcess.force_flush``), and, as the parent
closes, the seconds its close may take now (a JSON object). Its stdout carries two lines back:
``ready`` once the sinks are built (the event classes they want, their names and the Prometheus
URL, that it answers flush requests and the fewest spans a sink of it queues, or the
``ConfigurationError`` that stopped them), and ``closed`` with this process's bus counters and
each sink's own once the sinks are closed. A flush request is answered on the report pipe
(``Flushed``) once the bus delivered what was read before it and each sink's ``force_flush``
returned (each within its own timeout). While it runs, a pipe of its own
(``ckpt_events.sinks._export.reports``) carries those counters when they change, and what the
library logs here (a sink's failure, a collector refusing), once, in one line, to the parent's
logging; only when the parent is gone is such a line written on stderr (the parent's).

The process ends when its stdin does (the parent closed it, or died: a SIGKILLed server's last
batches are still read from the pipe and exported, the whole events of one it was cut writing
too, its Prometheus port let go first, for the server restarted in its place), or on SIGTERM,
once it has read what the parent still sends within its close budget (a group's SIGTERM stops
the server too, which sends its last batches as it stops; a second SIGTERM ends it at once);
it ignores SIGINT, so a Ctrl-C in the server's terminal lets the parent close it in order
instead of killing it mid-export.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec

from ckpt_events import Bus, CkptEventsError
from ckpt_events._logs import library_logger
from ckpt_events.sinks._export.flush import answer_flush, queue_bound
from ckpt_events.sinks._export.reports import (
    REPORT_INTERVAL,
    ForwardingHandler,
    Progress,
    ReportWriter,
    sink_counters,
)
from ckpt_events.sinks._export.wire import MAX_LINE, WireReader

if TYPE_CHECKING:
    from ckpt_events.sinks._configured import Configured

__all__ = ["main"]

_READ: Final = 1 << 20
#: Seconds the child waits, as it ends, for the server to take the reports still pending.
_DRAIN: Final = 1.0

logger: Final = library_logger("ckpt_events.sinks")


class _Head(msgspec.Struct, frozen=True):
    """The first line: ``configure``'s keyword arguments, and the seconds its close may take;
    the descriptor of the report pipe (``reports``) and the level the server's
    ``ckpt_events`` logger logs at."""

    arguments: dict[str, Any]
    close_timeout: float = 8.0
    reports: int | None = None
    log_level: int = logging.WARNING


class _Control(msgspec.Struct, frozen=True):
    """A line of the parent's that is no batch: the seconds closing may take now (its last line
    before its input ends), or, with ``flush`` (from 1), a flush request, whose
    ``close_timeout`` is only for a child of a version before flush requests (it read the line as
    the budget, the one it had, and never answered: the parent does not ask one that did not
    say it answers)."""

    close_timeout: float
    flush: int = 0


_CONTROL: Final = msgspec.json.Decoder(_Control)


class _Reader:
    """Whole lines from a non-blocking file descriptor, at most ``MAX_LINE`` bytes each (a
    longer one is skipped and counted: the parent writes none)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False
        self.too_long = 0
        #: What followed the last newline when the input ended: a batch the parent was killed
        #: while writing (a line longer than the pipe is written in several steps).
        self.cut = b""
        self._partial = bytearray()
        self._skipping = False  # inside a line past MAX_LINE: drop bytes up to its newline

    async def lines(self) -> list[bytes]:
        """The next whole lines (``[]`` at the end of the input)."""
        while not self.eof:
            try:
                chunk = os.read(self.fd, _READ)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            if not chunk:
                self.eof = True
                if not self._skipping:
                    self.cut = bytes(self._partial)
                self._partial.clear()
                break
            lines = self._split(chunk)
            if lines:
                return lines
        return []

    def _split(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._keep(chunk)
            return []
        head, tail = chunk[: end + 1], chunk[end + 1 :]
        first, _, rest = head.partition(b"\n")
        lines: list[bytes]
        if self._skipping:
            lines = []
        elif len(self._partial) + len(first) > MAX_LINE:  # its end came in this chunk: too long still
            self._too_long()
            lines = []
        else:
            lines = [bytes(self._partial) + first]
        self._partial.clear()
        self._skipping = False
        lines.extend(rest.split(b"\n")[:-1])
        self._keep(tail)
        return lines

    def _keep(self, tail: bytes) -> None:
        if self._skipping:
            return
        self._partial += tail
        if len(self._partial) > MAX_LINE:
            self._too_long()
            self._partial.clear()
            self._skipping = True

    def _too_long(self) -> None:
        self.too_long += 1
        if self.too_long == 1:  # said once, when it happens: the count came only at the close
            logger.warning(
                "ckpt_events: the export process skipped a line of its input longer than %d bytes; "
                "its batch's events are lost (counted in corrupt_lines; further such lines are "
                "not logged)",
                MAX_LINE,
            )


#: The parent reads replies on this descriptor (the child's stdout when it started); ``main``
#: points descriptor 1 at stderr, so what a sink prints (``OTEL_TRACES_EXPORTER=console``) goes
#: to the server's stderr instead of into the replies.
_replies: int = 1


def _reply(message: dict[str, Any]) -> bool:
    """Send ``message`` to the server; ``False`` if it is gone (nobody reads the replies)."""
    data = msgspec.json.encode(message) + b"\n"
    try:
        while data:
            data = data[os.write(_replies, data) :]
    except BrokenPipeError:
        return False
    return True


async def _serve(reader: _Reader) -> dict[str, Any] | None:
    """Build the sinks from the first line, then emit every batch line onto their bus until the
    input ends or SIGTERM; the ``closed`` reply (``None`` if no sink could be built)."""
    # Before ``ready``: a SIGTERM right after it (the parent's group stopped as it started) killed
    # this process outright, its handler not yet installed, and every batch after it was lost.
    with anyio.open_signal_receiver(signal.SIGTERM) as sigterms:
        return await _serve_until_closed(reader, sigterms)


async def _serve_until_closed(reader: _Reader, sigterms: AsyncIterator[int]) -> dict[str, Any] | None:
    lines = await reader.lines()
    try:
        head = msgspec.json.decode(lines[0], type=_Head) if lines else None
    except msgspec.DecodeError:
        head = None
    if head is None:
        _reply({"ready": False, "error": "the export process was not given its arguments"})
        return None
    if head.reports is None:
        return await _serve_head(reader, sigterms, head, lines[1:], None)
    writer = ReportWriter(head.reports)
    _forward_logs(writer, head.log_level)
    try:
        return await _serve_head(reader, sigterms, head, lines[1:], writer)
    finally:
        # What its sinks said as they closed reaches the server before the ``closed`` reply.
        writer.drain(_DRAIN)


def _forward_logs(writer: ReportWriter, level: int) -> None:
    """Send what the library logs here to the server, at the level its logger has there: it was
    printed on the shared stderr, with a traceback, past the server's logging setup."""
    library = logging.getLogger("ckpt_events")
    library.setLevel(level)
    library.addHandler(ForwardingHandler(writer, level))
    library.propagate = False  # a root handler here (a sitecustomize's) would print it again


async def _report(writer: ReportWriter, bus: Bus, configured: Configured) -> None:
    """Send the counters when they changed, every ``REPORT_INTERVAL`` seconds, until cancelled."""
    while True:
        await anyio.sleep(REPORT_INTERVAL)
        writer.progress(Progress(bus.stats(), sink_counters(configured.subscriptions)))


async def _serve_head(
    reader: _Reader,
    sigterms: AsyncIterator[int],
    head: _Head,
    pending: list[bytes],
    writer: ReportWriter | None,
) -> dict[str, Any] | None:
    from ckpt_events.sinks._configure import configure

    bus = Bus()
    received = 0
    corrupt = 0
    wire = WireReader()
    async with bus:
        try:
            configured = configure(bus, **head.arguments)
        except CkptEventsError as exc:
            _reply({"ready": False, "error": str(exc)})
            return None
        wanted = {cls.__struct_config__.tag for sub in configured.subscriptions for cls in sub.interests}
        prometheus = configured.prometheus.url if configured.prometheus is not None else None
        _budget(configured, bus, head.close_timeout)
        names = [sub.name for sub in configured.subscriptions]
        interests = sorted(map(str, wanted))
        ready = {
            "ready": True,
            "interests": interests,
            "sinks": names,
            "prometheus": prometheus,
            # Answered on the report pipe: without one, the parent is told not to ask.
            "flush": writer is not None,
            "queue": queue_bound(configured),
        }
        if not _reply(ready):
            # The server died as we started (killed while it waited for this): its batches
            # never came, so there is nothing to export. Was a BrokenPipeError traceback.
            await configured.aclose()
            return None
        async with configured, anyio.create_task_group() as tg:
            tg.start_soon(_end_on_sigterm, sigterms, tg.cancel_scope, head.close_timeout)
            if writer is not None:
                tg.start_soon(_report, writer, bus, configured)
            flushing = anyio.Lock()  # requests answered one at a time, in the order asked
            closing = False  # the parent sent its close line: it is stopping, not gone
            while True:
                for line in pending:
                    if line[:1] == b"{":  # the parent is closing (the time it gives us), or asks a flush
                        try:
                            control = _CONTROL.decode(line)
                        except msgspec.DecodeError as exc:
                            corrupt += 1
                            _unreadable(corrupt, line, exc)
                            continue
                        if not control.flush:
                            closing = True
                            _budget(configured, bus, control.close_timeout)
                        elif writer is not None:
                            # In a task: the input is read on meanwhile (a server goes on sending).
                            tg.start_soon(answer_flush, control.flush, bus, configured, writer, flushing)
                        continue
                    invalid = wire.invalid_events
                    try:
                        events = wire.events(line)
                    except msgspec.DecodeError as exc:
                        corrupt += 1
                        _unreadable(corrupt, line, exc)
                        continue
                    if wire.invalid_events and not invalid:
                        _invalid(wire.invalid_error)
                    received += len(events)
                    for event in events:
                        bus.emit(event)
                # Let the sinks take the batch before the next read (their buffers stay small;
                # past them this bus drops and counts, as any bus does).
                await anyio.sleep(0)
                pending = await reader.lines()
                if not pending:  # the input ended
                    if not closing and configured.prometheus is not None:
                        # The parent died (SIGKILL): its page is nobody's to scrape, and the
                        # worker restarted in its place needs the port while we export the rest
                        # (3-4 s to a collector that never answers: every port taken, its start
                        # failed and gunicorn stopped the whole server).
                        await configured.prometheus.aclose()
                    if reader.cut:
                        corrupt += 1
                        received += _emit_cut(bus, wire, reader.cut)
                    break
            tg.cancel_scope.cancel()
        stats = bus.stats()
    return {
        "closed": True,
        "received": received,
        "corrupt_lines": corrupt + reader.too_long,
        "lost_ends": wire.lost_ends,
        "invalid_events": wire.invalid_events,
        "bus": msgspec.to_builtins(stats),
        "sinks": sink_counters(configured.subscriptions),
    }


def _invalid(error: str | None) -> None:
    """Log the first event left out of a line that was read (the rest are only counted)."""
    logger.warning(
        "ckpt_events: the export process left out an event it could not read (%s: a hand-built "
        "event holding a value outside its field's vocabulary?); the rest of its batch is kept "
        "(counted in invalid_events; further such events are not logged)",
        error,
    )


def _unreadable(count: int, line: bytes, exc: msgspec.DecodeError) -> None:
    """Log the first line that could not be read (``count`` is 1); the rest are only counted."""
    if count == 1:
        logger.warning(
            "ckpt_events: the export process could not read a line of its input (%d bytes: %s); "
            "its batch's events are lost (counted in corrupt_lines; further such lines are not "
            "logged)",
            len(line),
            exc,
        )


def _budget(configured: Configured, bus: Bus, seconds: float) -> None:
    """Close within ``seconds``: half to deliver and close the sinks, half for the bus to wait on
    one still closing (its own 5 s came on top, and a child whose collector hung outlived the
    parent's deadline, killed before it could count and say what it dropped)."""
    configured.close_timeout = bus.close_timeout = max(0.0, seconds) / 2


def _emit_cut(bus: Bus, wire: WireReader, cut: bytes) -> int:
    """Emit the whole events at the head of a batch line cut short (it was silently dropped,
    whole, though its events had reached the pipe); log the cut once. How many were emitted."""
    events = wire.whole_events(cut)
    for event in events:
        bus.emit(event)
    logger.warning(
        "ckpt_events: the export process's input ended inside a batch (the server stopped while "
        "writing it): %d whole events of its %d bytes exported, the rest lost",
        len(events),
        len(cut),
    )
    return len(events)


async def _end_on_sigterm(sigterms: AsyncIterator[int], scope: anyio.CancelScope, grace: float) -> None:
    """SIGTERM: read on to the input's end for at most ``grace`` seconds, then end it as its end
    would (what was read exported, the sinks closed); a second SIGTERM ends it at once.

    A SIGTERM to the server's process group (a service manager stopping it) reaches the server
    too, which stops in order and sends its last batches as it does: ending at the signal lost
    them."""
    async for _ in sigterms:
        if scope.deadline != math.inf:
            scope.cancel()
            return
        scope.deadline = anyio.current_time() + grace


def main() -> int:
    """Run until the input ends; 0 once the sinks are closed, 1 if they could not be built."""
    global _replies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a pending one (held off since the start) goes
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.stdout.flush()
    _replies = os.dup(1)
    os.dup2(2, 1)
    stdin = sys.stdin.buffer.fileno()
    os.set_blocking(stdin, False)
    closed = anyio.run(_serve, _Reader(stdin))
    if closed is None:
        return 1
    _reply(closed)  # False when the parent stopped listening: nothing to tell
    return 0


if __name__ == "__main__":
    sys.exit(main())
