"""The export process's report pipe: its sinks' counters and its log lines, sent while it runs.

A pipe of its own, beside the child's stdout (whose ``ready`` and ``closed`` replies are read by
``ExportProcess.start`` and ``aclose`` in their own task: a reader thread sharing that
descriptor read on after a cancelled close and took another export process's reply). The child
writes one JSON line per report; ``ReportListener``, a thread of the server, reads them and the
server's event loop never waits for the child:

* ``Progress``: the child's bus counters and each sink's own, sent when they changed, at most
  every ``REPORT_INTERVAL`` seconds. ``ExportProcess.stats()`` shows them while the child runs:
  a sink failing there (a full disk, a collector refusing) was said only once it closed.
* ``Flushed``: the answer to the server's flush request (``ExportProcess.force_flush``), by its
  number, sent once the child's sinks exported what it had read before the request (its
  counters, a ``Progress``, just before it).
* ``LogLine``: a warning or error the child's library logged (``ckpt_events`` and below), in one
  line, its exception said as ``ClassName: message``. The server logs it on the logger of the
  same name: it was printed on the shared stderr, with a traceback, outside the server's logging.

The child's writes never block it: a report that does not fit in the pipe (the server stopped
reading) waits, bounded (``PENDING_LIMIT``), and the counters are sent whole each time, so a
later one replaces what an earlier one said.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from ckpt_events import BusStats, Subscription
from ckpt_events._logs import LOGGED_MESSAGE_CHARS, fit_line, library_logger, said_in_log

__all__ = [
    "FORWARDED",
    "PENDING_LIMIT",
    "REPORT_INTERVAL",
    "Flushed",
    "ForwardingHandler",
    "LogLine",
    "Progress",
    "ReportListener",
    "ReportWriter",
    "sink_counters",
    "sink_stats",
]

#: The attribute of a record forwarded from the export process: the child's pid (a filter of
#: yours tells them from the server's own with it).
FORWARDED: Final = "export_process"
#: Seconds between two looks at the child's counters (a report is sent only when they changed).
REPORT_INTERVAL: Final = 0.25
#: Bytes of reports the child keeps while the pipe is full; past it a report is left out (the
#: next counters replace it; a log line left out is said on stderr instead).
PENDING_LIMIT: Final = 1 << 20
#: The longest report line the server reads; a longer one is skipped.
_LINE_LIMIT: Final = 1 << 20


class Progress(msgspec.Struct, frozen=True, tag="progress"):
    """The child's bus counters, and each sink's own as ``[its stats class's name, its fields]``."""

    bus: BusStats
    sinks: dict[str, list[Any]]


class Flushed(msgspec.Struct, frozen=True, tag="flushed"):
    """The child flushed its sinks at the server's request ``number``: ``done`` when its bus
    delivered and each sink with ``force_flush`` exported what it was handed, within their time."""

    number: int
    done: bool


class LogLine(msgspec.Struct, frozen=True, tag="log"):
    """A record the child's library logged: its level, its logger's name, its text in one line."""

    level: int
    name: str
    message: str


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Progress | Flushed | LogLine)


class ReportWriter:
    """The child's end: reports written without blocking, from any thread (a sink's export
    thread logs too)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)  # a process a sink starts must not hold the server's EOF
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._gone = False
        self._last: bytes | None = None

    def progress(self, report: Progress) -> None:
        """Send ``report`` if it differs from the last one sent."""
        line = _ENCODER.encode(report)
        if line == self._last:
            self.flush()
            return
        self._last = line
        self._send(line)

    def flushed(self, answer: Flushed) -> bool:
        """Send ``answer``; ``False`` if it could not be (the server is gone, or not reading)."""
        return self._send(_ENCODER.encode(answer))

    def log(self, line: LogLine) -> bool:
        """Send ``line``; ``False`` if it could not be (the server is gone, or not reading)."""
        return self._send(_ENCODER.encode(line))

    def _send(self, line: bytes) -> bool:
        with self._lock:
            if self._gone or len(self._pending) + len(line) > PENDING_LIMIT:
                return False
            self._pending += line
            self._pending.append(0x0A)
            self._flush()
            return not self._gone  # the server died: said on stderr instead

    def flush(self) -> None:
        """Write what is pending, as much as the pipe takes now."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        while self._pending and not self._gone:
            try:
                written = os.write(self.fd, self._pending)
            except BlockingIOError:
                return
            except OSError:  # the server is gone: nobody reads reports any more
                self._gone = True
                self._pending.clear()
                return
            del self._pending[:written]

    def drain(self, seconds: float) -> None:
        """Write what is pending within ``seconds`` (the child is about to exit)."""
        deadline = time.monotonic() + seconds
        while True:
            self.flush()
            left = deadline - time.monotonic()
            if not self._pending or self._gone or left <= 0:
                return
            select.select([], [self.fd], [], min(left, 0.05))


class ForwardingHandler(logging.Handler):
    """The child's handler on the ``ckpt_events`` logger: each record to the server, in one
    line (else, the server not reading, one line on stderr: never a traceback)."""

    def __init__(self, writer: ReportWriter, level: int) -> None:
        super().__init__(level)
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        text = one_line_record(record)
        if not self._writer.log(LogLine(record.levelno, record.name, text)):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"ckpt_events export process (pid {os.getpid()}): {text}\n")


def one_line_record(record: logging.LogRecord) -> str:
    """``record``'s text with its exception as ``ClassName: message``, on one line, bounded and
    redacted: the message too, not only the exception (a value quoted in it, a URL's
    ``user:password`` or a ``Bearer`` token, reached the server's log verbatim)."""
    try:
        text = record.getMessage()
    except Exception:  # a record of ours with arguments that do not fit: its template said
        text = str(record.msg)
    if record.exc_info and record.exc_info[1] is not None:
        text = f"{text} ({said_in_log(record.exc_info[1])})"
    return fit_line(text, LOGGED_MESSAGE_CHARS)


class ReportListener:
    """The server's end: a daemon thread reading reports until the child's end closes (it
    exited, or was killed) or ``stop()``; it owns the descriptor and closes it as it ends."""

    def __init__(self, fd: int, pid: int) -> None:
        self.fd = fd
        self._pid = pid
        #: The latest counters the child sent (``None`` before its first report).
        self.latest: Progress | None = None
        #: The child's answer to the latest flush request it answered (``None`` before one).
        self.flushed: Flushed | None = None
        self._stop = threading.Event()
        # stop() wakes the reading thread through this pipe: it polled every 0.5 s to see the
        # flag, 2 wake-ups a second for an idle child. Closed by the thread, under the lock,
        # so that stop() never writes to a descriptor number reused meanwhile.
        wake = os.pipe()
        self._wake_r = wake[0]
        self._wake_w = wake[1]
        self._wake_lock = threading.Lock()
        self._wake_open = True
        self._thread = threading.Thread(
            target=self._run, name=f"ckpt-events-export-reports-{pid}", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close_forked_copy(self) -> None:
        """In a process forked from the owner: close this copy's descriptors (the report pipe
        and the wake pipe), unless the owner's thread had closed them: a fork after the child
        exited closed the numbers again, the server's own files and pipes holding them by then
        (read unlocked: the lock may be held by the thread, which is not copied here)."""
        if not self._wake_open:
            return
        for fd in (self.fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def stop(self) -> None:
        """End the thread now (it is woken); what is unread is dropped."""
        self._stop.set()
        with self._wake_lock:
            if self._wake_open:
                os.write(self._wake_w, b"x")  # one byte in an empty pipe: never blocks

    def _run(self) -> None:
        line = bytearray()
        skipping = False
        try:
            while not self._stop.is_set():
                if self.fd not in select.select([self.fd, self._wake_r], [], [])[0]:
                    continue  # woken by stop()
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return
                line += chunk
                while (end := line.find(b"\n")) >= 0:
                    head = bytes(line[:end])
                    del line[: end + 1]
                    if skipping:
                        skipping = False
                        continue
                    self._take(head)
                if len(line) > _LINE_LIMIT:  # no report is this long: skipped to its newline
                    line.clear()
                    skipping = True
        finally:
            with self._wake_lock:
                # Said closed before the closes: a fork meanwhile keeps a copy of them, rather than
                # close_forked_copy closing what holds their numbers by then in the forked child.
                self._wake_open = False
                os.close(self.fd)
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _take(self, line: bytes) -> None:
        try:
            report = _DECODER.decode(line)
        except msgspec.DecodeError:
            return  # not ours (the child writes only reports here): nothing to say it with
        if isinstance(report, Progress):
            self.latest = report  # one assignment: stats() on the event loop reads it whole
            return
        if isinstance(report, Flushed):
            self.flushed = report  # answered in the order asked: the latest is the highest
            return
        name = report.name if report.name.startswith("ckpt_events") else "ckpt_events.sinks"
        level = report.level if logging.DEBUG <= report.level <= logging.CRITICAL else logging.WARNING
        # On the logger the child used: a user's routing and levels for it apply.
        # The counters it names are the child's: here they are in ExportProcess.stats().
        library_logger(name).log(
            level,
            "export process (pid %d): %s [its counters: ExportProcess.stats().child and .sinks]",
            self._pid,
            report.message,
            extra={FORWARDED: self._pid},
        )


def sink_counters(subscriptions: Iterable[Subscription]) -> dict[str, list[Any]]:
    """Each closed sink's own counters (what it exported, dropped and why), by subscription
    name, as ``[the stats class's name, its fields]``: a sink's log line points at them."""
    sinks: dict[str, list[Any]] = {}
    for sub in subscriptions:
        stats = getattr(sub.sink, "stats", None)  # a sink's stats() is no part of its Protocol
        counters = stats() if callable(stats) else None
        if isinstance(counters, msgspec.Struct):
            sinks[sub.name] = [type(counters).__name__, msgspec.to_builtins(counters)]
    return sinks


#: The sinks' own stats classes the child reports, by name: where each is public.
_SINK_STATS: Final = {
    "JsonLinesStats": "ckpt_events.sinks",
    "MetricSinkStats": "ckpt_events.sinks.otel",
    "OtlpMetricSinkStats": "ckpt_events.sinks.otel",
    "OtlpSpanSinkStats": "ckpt_events.sinks.otel",
    "SpanSinkStats": "ckpt_events.sinks.otel",
}


def sink_stats(reported: dict[str, list[Any]]) -> dict[str, msgspec.Struct]:
    """The child's ``sinks`` reply as the stats each sink's ``stats()`` returns in process."""
    sinks: dict[str, msgspec.Struct] = {}
    for name, (kind, fields) in reported.items():
        home = _SINK_STATS.get(kind)
        if home is not None:  # a class this side does not know is left out, not guessed
            sinks[name] = msgspec.convert(fields, getattr(importlib.import_module(home), kind))
    return sinks
