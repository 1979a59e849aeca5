"""``ExportProcess``: every sink ``configure()`` builds, run in a child process instead of this one.

A server's CPU per request with every sink on was 1.15-1.31x the uninstrumented server's
(docs/benchmarks.md), most of it building spans and metric points, encoding OTLP and writing
lines. With ``configure(export_process=True)`` (or ``CKPT_EVENTS_EXPORT_PROCESS=true``) this
process keeps what only it can do (per batch, one JSON encoding of its span handles as they are,
no event built for them: ``wire``; one pipe write) and a child process
(``ckpt_events.sinks._export.child``) runs ``configure()`` with the same arguments on its own
bus, fed every batch through its stdin: the OTLP exporters, the JSON lines file and the
Prometheus endpoint live there. The child costs CPU of its own (a decoding on top of the same
sinks), on another core when the machine has one; what this process saves and what the pair
spends are both in docs/benchmarks.md.

What stays true: the bus's guarantees hold for this sink as for any (its buffer is bounded, a
slow child makes the bus drop and count, never the emitter wait); a child that died is logged
once (by the next batch, else by the close), and every batch after it is counted as dropped;
``aclose()`` closes the child's input and waits for it within the close deadline (the child is
told what is left of it, and closes its sinks within that), then kills it; a child that
stopped reading is killed at ``Configured.aclose()``'s deadline (``abandon``), or when the bus
gives up on this sink (its close deadline).
A server killed with SIGKILL loses nothing that reached the pipe: the child reads it to the end
and exports it before it exits.

``force_flush()`` asks the child to deliver what reached the pipe before it and flush its sinks
(their export queues, the metric totals), and waits for its answer, within a deadline: replay
onto a bus with this sink waits on it as on a sink in process (``max_queue``, the child's
smallest span queue, bounds what it hands between two flushes). A child that does not answer
flush requests (a version before them) is never asked: said once, ``False`` at once.
The protocol, both halves, is ``flush``; the child's start and its end by force are
``spawn``, its ``ready`` and ``closed`` replies ``replies``.

While the child runs, a thread of this process reads its reports (``reports``): its
sinks' counters, shown by ``stats()`` within ``REPORT_INTERVAL`` (0.25 s) of a change, and each
line the library logs there (a sink failing, a collector refusing), logged here once, in one
line, on the logger of the same name (the record's ``export_process`` attribute is the child's
pid). The close sums up in one line what its sinks lost, when they lost anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

import anyio
import msgspec

from ckpt_events import BusStats
from ckpt_events._events import EVENT_TYPES
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events.sinks._export.flush import FlushRequests
from ckpt_events.sinks._export.replies import await_reply
from ckpt_events.sinks._export.reports import ReportListener, sink_stats
from ckpt_events.sinks._export.spawn import child_budget, kill, kill_and_reap, spawn
from ckpt_events.sinks._export.wire import MAX_LINE, encoder, escaped_line, lines_within, wire_items

__all__ = ["ExportProcess", "ExportProcessStats"]

logger: Final = library_logger("ckpt_events.sinks")

#: Seconds the child may take to build its sinks and say so (Python's start and the imports
#: take ~0.3-0.6 s here).
START_TIMEOUT: Final = 20.0
_TAGS: Final = {cls.__struct_config__.tag: cls for cls in EVENT_TYPES}
_REPLY_LIMIT: Final = 1 << 20
#: Seconds the close waits, once the child ended, for its last log lines to be read.
_REPORTS_WAIT: Final = 1.0
#: The pipe's buffer asked for: Linux's default ``pipe-max-size`` for an unprivileged process.
PIPE_BYTES: Final = 1 << 20


class ExportProcessStats(msgspec.Struct, frozen=True):
    """Counters of one ``ExportProcess``.

    ``forwarded`` events were written to the child's pipe; ``dropped`` were not (the child had
    gone, or one was longer than a line the child reads, ``MAX_LINE``; the bus's own drops, when
    the pipe was full, are in ``bus.stats()``, which counts what reached the pipe as
    ``delivered``). ``pid`` is the child's; ``exit_code`` is ``None`` while it runs.
    ``child`` is the child's own bus counters (its sinks' deliveries, drops and failures) and
    ``sinks`` each sink's own: while it runs, as it last reported them (every
    ``REPORT_INTERVAL``, 0.25 s, when they changed; ``None`` before its first report), and
    ``final`` once it closed in order and said them as they ended. ``received`` and
    ``corrupt_lines`` are what it read, known once it closed; ``lost_ends`` the spans' ends it
    read without their start (in a line cut short or corrupt): their ``*Finished`` events are
    lost; ``invalid_events`` the events it left out of lines it read (a hand-built event holding a value
    outside its field's vocabulary, which the child cannot decode), the rest of their batch kept.
    ``sinks`` is, by subscription name
    (``otel-spans``, ``jsonl``, ...), each sink's own ``stats()``, of the type it
    has in process (``OtlpSpanSinkStats``, ``JsonLinesStats``, ...): what it exported and
    dropped, and why (a collector refusing), where its log line points.
    """

    pid: int
    forwarded: int
    dropped: int
    exit_code: int | None = None
    received: int | None = None
    corrupt_lines: int | None = None
    child: BusStats | None = None
    lost_ends: int | None = None
    sinks: dict[str, msgspec.Struct] | None = None
    invalid_events: int | None = None
    final: bool = False


class ExportProcess:
    """A bus sink writing every batch to a child process that runs ``configure(**arguments)``.

    Start it with ``ExportProcess.start(arguments)`` (``configure(export_process=True)`` does):
    it waits for the child to build its sinks (up to ``START_TIMEOUT``), and raises
    ``ConfigurationError`` with the child's own message when it could not. ``interests`` are
    the event classes the child's sinks want, ``sinks`` their subscription names there (``jsonl``,
    ``otlp``, ...); ``prometheus_url`` is its scrape endpoint, if any.
    """

    blocking = False
    linger = None
    #: The bus gives this sink its span handles as they are, starts included (``_Buffer.raw``):
    #: it writes them to the pipe without building their events (``wire``).
    _takes_span_handles = True

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        interests: frozenset[type[Any]],
        prometheus_url: str | None,
        close_timeout: float,
        sinks: tuple[str, ...] = (),
        reports: ReportListener | None = None,
        flushes: bool = False,
        max_queue: int | None = None,
    ) -> None:
        self._process = process
        self._reports = reports
        #: The fewest spans a sink of the child queues (``None``: none with ``force_flush``).
        self.max_queue = max_queue
        self._mid_line = False  # handle() is writing a batch: a flush request waits for its end
        self.interests = interests
        self.sinks = sinks
        self.prometheus_url = prometheus_url
        self.close_timeout = close_timeout
        assert process.stdin is not None and process.stdout is not None
        self._pipe = process.stdin.fileno()
        os.set_blocking(self._pipe, False)
        _widen(self._pipe)
        #: The flush protocol's server half (``force_flush``); the child answers it when its
        #: ``ready`` said so and it has a report pipe.
        self._flush_requests = FlushRequests(process.pid, self._pipe, reports, flushes)
        self._encoder = encoder()
        self._forwarded = 0
        self._dropped = 0
        self._gone = False
        self._said = False  # a warning named what became of the child: the close adds none
        self._said_too_long = False
        self._closing = False  # aclose() or discard() began: the pipe is ours no more
        self._closed: dict[str, Any] | None = None
        self._exit_code: int | None = None
        self._owner = os.getpid()
        _LIVE.add(self)

    @classmethod
    def start(
        cls,
        arguments: Mapping[str, Any],
        *,
        close_timeout: float = 10.0,
        start_timeout: float = START_TIMEOUT,
    ) -> ExportProcess:
        """Start the child with ``configure``'s ``arguments`` (JSON-encodable) and wait until it
        built its sinks; ``ConfigurationError`` (the child's message) if it could not."""
        process, listener, ready = spawn(arguments, close_timeout, start_timeout)
        interests = frozenset(_TAGS[tag] for tag in ready.get("interests", ()) if tag in _TAGS)
        sinks = tuple(str(name) for name in ready.get("sinks", ()))
        queue = ready.get("queue")
        bound = queue if isinstance(queue, int) and not isinstance(queue, bool) and queue > 0 else None
        flushes = ready.get("flush") is True
        return cls(
            process, interests, ready.get("prometheus"), close_timeout, sinks, listener, flushes, bound
        )

    def discard(self) -> None:
        """End a child that has nothing to export (no sink was set): killed and reaped now."""
        self._closing = True
        kill(self._process)
        self._exit_code = self._process.returncode

    @property
    def pid(self) -> int:
        return self._process.pid

    async def force_flush(self, timeout: float | None = None) -> bool:
        """Wait until the child delivered every event written to its pipe before this call and
        its sinks exported them (each sink's ``force_flush``, within its own timeout), at most
        ``timeout`` seconds (default ``FLUSH_TIMEOUT``). ``True`` when the child said all were
        exported; ``False`` when not (what its sinks dropped is in ``stats().sinks``), when it
        did not answer in time, is gone or closing, or does not answer flush requests (a child
        of a version before them: said once, not waited for)."""
        if self._gone or self._closing or os.getpid() != self._owner or self._process.poll() is not None:
            return False
        return await self._flush_requests.ask(
            timeout, self.close_timeout, lambda: self._mid_line, lambda: self._closing
        )

    async def handle(self, batch: list[Any]) -> None:
        """Write ``batch`` to the child as one line; wait while the pipe is full (the bus keeps
        gathering, and drops and counts past its buffer). Once the child is gone or this was
        closed, the batch is dropped and counted (logged once)."""
        if self._gone:
            self._dropped += len(batch)
            return
        if self._closing:
            # Its descriptor number may be another file's by now: a write went into that file.
            self._after_close()
            self._dropped += len(batch)
            return
        if os.getpid() != self._owner:
            # A process forked from the one that started the child: its writes would interleave
            # with the owner's in one pipe. It drops and counts; configure() after forking.
            self._forked()
            self._dropped += len(batch)
            return
        line = bytearray()
        items = wire_items(batch)
        try:
            self._encoder.encode_into(items, line)
        except UnicodeEncodeError:  # a lone surrogate in a string: escaped, not the batch lost
            line = bytearray(escaped_line(items))
        sent = len(batch)
        if len(line) > MAX_LINE:  # the child would skip it: lines it reads, the too long left out
            lines, left_out = lines_within(items, self._encode_item)
            line = bytearray(b"\n".join(lines))
            if left_out:
                sent -= left_out
                self._too_long(left_out)
        line.append(0x0A)  # the newline ending the batch's (last) line
        data = memoryview(line)
        self._mid_line = True  # a flush request is not written inside this line
        try:
            while data:
                try:
                    written = os.write(self._pipe, data)
                except BlockingIOError:
                    try:
                        await anyio.wait_writable(self._pipe)
                    except anyio.get_cancelled_exc_class():
                        # The bus gave up on this sink at its close deadline (its aclose() will
                        # not run) or its owner was cancelled: a child that stopped reading is not
                        # left running (a hung one lived on, stopped, after the bus had closed).
                        self._kill_unread()
                        raise
                    continue
                except (BrokenPipeError, OSError) as exc:
                    self._lost(sent, exc)
                    return
                data = data[written:]
        finally:
            self._mid_line = False
        self._forwarded += sent

    def _encode_item(self, item: Any) -> bytes:
        try:
            return self._encoder.encode(item)
        except UnicodeEncodeError:
            return escaped_line(item)

    def _too_long(self, events: int) -> None:
        self._dropped += events
        if not self._said_too_long:
            self._said_too_long = True
            logger.warning(
                "ckpt_events: a span or event was longer than the %d bytes of a line the export "
                "process (pid %d) reads; %d events dropped and counted, the rest of their batch "
                "sent (further ones are counted, not logged)",
                MAX_LINE,
                self._process.pid,
                events,
            )

    def _after_close(self) -> None:
        self._gone = True
        logger.warning(
            "ckpt_events: events were handed to the export process (pid %d) after it was closed; "
            "they are dropped and counted",
            self._process.pid,
        )

    def _forked(self) -> None:
        if not self._gone:
            self._gone = True
            self._said = True
            logger.warning(
                "ckpt_events: this process (pid %d) was forked from the one that started the export "
                "process (pid %d); its events are dropped and counted: call configure() after forking",
                os.getpid(),
                self._owner,
            )

    def _lost(self, events: int, exc: OSError) -> None:
        self._gone = True
        self._dropped += events
        if self._said:  # killed by the close (``abandon``): that warning said it
            return
        self._said = True
        # The forwarded count too: this is the one warning (the close adds none), and what the
        # child held died with it (forwarded=20 beside an empty log was left unexplained).
        logger.warning(
            "ckpt_events: the export process (pid %d) is gone (%s, exit code %s); %d events were "
            "forwarded to it before, how many it exported is unknown unless it closed in order "
            "(ExportProcess.stats().received); events are dropped and counted from now on",
            self._process.pid,
            exc.strerror or exc,
            self._process.poll(),
            self._forwarded,
        )

    def _kill_unread(self) -> None:
        logger.warning(
            "ckpt_events: the export process (pid %d) stopped reading its input and this sink was "
            "given up on (the bus's close deadline, or a cancel); killed",
            self._process.pid,
        )
        self._gone = True
        self._said = True
        kill(self._process)
        self._exit_code = self._process.returncode

    def abandon(self) -> None:
        """Kill a child still running that no ``aclose()`` is closing: ``Configured.aclose()``
        spent its deadline (or was cancelled) before it got to close it, as when the pipe was
        full and the child had stopped reading. It lived on, stopped, until the bus closed, or
        for ever on a bus that lives on. Said once; a batch waiting on the pipe then ends, its
        events counted as dropped, and ``aclose()`` closes the pipes."""
        if self._closing or self._gone or os.getpid() != self._owner or self._process.poll() is not None:
            return
        logger.warning(
            "ckpt_events: the export process (pid %d) was not closed within the close deadline (it "
            "stopped reading its input with the pipe full, or the close was cancelled); killed, with "
            "what it held (%d events were forwarded to it)",
            self._process.pid,
            self._forwarded,
        )
        self._said = True
        # Killed, not its pipes closed: a batch waiting for the pipe (another task) wakes as its
        # reader goes, and gets EPIPE; closing the descriptor under that wait never woke it.
        kill_and_reap(self._process)

    async def aclose(self) -> None:
        """End the child's input and wait for it to export and exit, within ``close_timeout``;
        kill it past that, or when this is cancelled (a caller's own deadline). Idempotent; a
        call while another is under way (another task or thread) waits for that one."""
        if self._exit_code is not None:
            return
        if self._closing:
            # Another aclose() (a task, a thread) is closing it: the pipe's descriptor may be
            # another file's by now (the budget went into it) and the reply is that one's to read.
            await self._other_close()
            return
        self._closing = True
        if not self._gone and os.getpid() == self._owner:
            # The close deadline now (Configured.aclose sets what is left of its own): the
            # child closes within it. A line this short is written whole or not at all (a full
            # pipe, a gone child: it keeps the budget it started with).
            budget = msgspec.json.encode({"close_timeout": child_budget(self.close_timeout)})
            with contextlib.suppress(OSError):
                os.write(self._pipe, budget + b"\n")
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        if os.getpid() != self._owner:  # a forked copy: the child and its replies are the owner's
            self._exit_code = -1
            assert self._process.stdout is not None
            self._process.stdout.close()
            return
        deadline = time.monotonic() + self.close_timeout
        try:
            # Read in this task, not a worker thread: a thread abandoned by a cancelled close read
            # on by descriptor number after the pipe was closed, took the next export process's
            # pipe (its number reused) and its ready reply ("did not start within 20 s").
            reply = await await_reply(self._process, deadline)
            if reply is not None and reply.get("closed"):
                self._closed = reply
            while self._process.poll() is None and time.monotonic() < deadline:
                await anyio.sleep(0.01)
        finally:
            if self._process.poll() is None:
                logger.warning(
                    "ckpt_events: the export process (pid %d) did not end within its close deadline; killed",
                    self._process.pid,
                )
                self._said = True
                kill(self._process)
            self._exit_code = self._process.returncode
            assert self._process.stdout is not None
            self._process.stdout.close()
            if self._closed is not None:
                self._read_short(self._closed.get("received"))
            elif not self._said:
                self._ended_unsaid()
        # The child has ended: its last log lines are read before the summary (its end of the
        # report pipe is closed, so the listener ends at once; bounded all the same).
        await self._reports_read(time.monotonic() + _REPORTS_WAIT)
        if self._closed is not None:
            self._say_losses()

    async def _reports_read(self, deadline: float) -> None:
        if self._reports is None:
            return
        while self._reports.running and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        self._reports.stop()

    def _say_losses(self) -> None:
        """Once, at the close: what the child's sinks lost in all (each cause was logged when it
        came); nothing when they lost nothing."""
        stats = self.stats()
        if stats.child is None:
            return
        lost = _losses(stats.child, stats.sinks or {})
        if lost:
            logger.warning(
                "ckpt_events: the export process (pid %d) closed, its sinks having lost events: %s; "
                "each cause was logged as it came, the counters are in ExportProcess.stats() "
                "(child, sinks)",
                self._process.pid,
                "; ".join(lost),
            )

    async def _other_close(self) -> None:
        """Wait for the aclose() under way to end (it kills the child past its deadline, and
        reaping a killed one takes at most 5 s more)."""
        deadline = time.monotonic() + self.close_timeout + 6.0
        while self._exit_code is None and time.monotonic() < deadline:
            await anyio.sleep(0.01)

    def _read_short(self, received: object) -> None:
        """Say the events written to the pipe that the child never read: it stopped reading
        before its input ended (past a SIGTERM's grace) or skipped lines; they were lost unsaid."""
        if isinstance(received, int) and received < self._forwarded:
            logger.warning(
                "ckpt_events: the export process (pid %d) read %d of the %d events written to its "
                "pipe; the other %d are lost (it stopped reading before its input ended, or skipped "
                "lines it could not read)",
                self._process.pid,
                received,
                self._forwarded,
                self._forwarded - received,
            )

    def _ended_unsaid(self) -> None:
        """The child ended without its ``closed`` reply (killed, crashed) and no batch since
        said it had gone: what it held when it died is lost, said here once."""
        self._said = True
        code = self._exit_code
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        logger.warning(
            "ckpt_events: the export process (pid %d) ended (%s) without saying what it exported; "
            "%d events were forwarded to it, how many reached its sinks is unknown",
            self._process.pid,
            how,
            self._forwarded,
        )

    def stats(self) -> ExportProcessStats:
        """The counters now: the child's own as it last reported them while it runs (at most
        ``REPORT_INTERVAL`` old, when they changed), final once it closed in order."""
        closed = self._closed or {}
        child = closed.get("bus")
        sinks = closed.get("sinks")
        live = self._reports.latest if self._reports is not None and self._closed is None else None
        if live is not None:
            child = live.bus
            sinks = live.sinks
        return ExportProcessStats(
            pid=self._process.pid,
            forwarded=self._forwarded,
            dropped=self._dropped,
            exit_code=self._exit_code if self._exit_code is not None else self._process.poll(),
            received=closed.get("received"),
            corrupt_lines=closed.get("corrupt_lines"),
            child=msgspec.convert(child, BusStats) if child is not None else None,
            lost_ends=closed.get("lost_ends"),
            invalid_events=closed.get("invalid_events"),
            sinks=sink_stats(sinks) if sinks is not None else None,
            final=self._closed is not None,
        )

    def __repr__(self) -> str:
        return f"<ExportProcess pid={self._process.pid}>"


#: The ``ExportProcess`` objects of this process, for ``_close_in_forked_copy``.
_LIVE: Final[weakref.WeakSet[ExportProcess]] = weakref.WeakSet()


def _close_in_forked_copy() -> None:
    """In a process forked from this one (``os.fork``, multiprocessing's ``fork``): close its
    copies of every child's pipes. A copy of the write end kept the child's input open, so
    the owner's ``aclose()`` waited out its deadline and killed the child (its sinks never
    closed) for as long as a forked worker lived."""
    for process in list(_LIVE):
        for pipe in (process._process.stdin, process._process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if process._reports is not None:
            process._reports.close_forked_copy()


# Registered once, when the export process is first used (this module is imported then).
os.register_at_fork(after_in_child=_close_in_forked_copy)


def _losses(child: BusStats, sinks: Mapping[str, msgspec.Struct]) -> list[str]:
    """Each child sink's losses, by the counters that hold them: its bus's (``failed``,
    ``dropped``, ``abandoned`` events) with the first error, else its own ``dropped`` and
    ``failed`` (spans, for an OTLP span sink) with its last failure."""
    lost: list[str] = []
    for row in child.sinks:
        counted = {"failed": row.failed, "dropped": row.dropped, "abandoned": row.abandoned}
        why = row.error
        own = sinks.get(row.name)
        if not any(counted.values()) and own is not None:
            counted = {name: getattr(own, name, 0) for name in ("dropped", "failed")}
            why = getattr(own, "last_failure", None) or getattr(own, "last_error", None)
        said = " ".join(f"{name}={count}" for name, count in counted.items() if count)
        if said:
            lost.append(f"{row.name} {said}" + (f" ({why})" if why else ""))
    if child.dropped_after_close:
        lost.append(f"{child.dropped_after_close} after its bus closed")
    return lost


def _widen(pipe: int) -> None:
    """Give ``pipe`` up to ``PIPE_BYTES`` of buffer (Linux; a 64 KiB pipe took a batch of 400
    events in 5 writes and 4 waits for the child; elsewhere, or past the system's
    ``pipe-max-size``, it keeps what it has)."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe, set_size, PIPE_BYTES)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", ExportProcess, ExportProcessStats)
