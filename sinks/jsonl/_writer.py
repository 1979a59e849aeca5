"""The JSON-lines sink: one JSON object per event per line.

Ids are written as W3C hex strings (``ckpt_events.sinks._hexids``), as a collector and a ``traceparent``
show them; ``read_events`` (``ckpt_events.sinks.jsonl._reader``) turns them back into the ints the typed
events carry.

Writing reuses one ``msgspec.json.Encoder`` for every batch: a batch is encoded by one
``encode_lines`` call (event by event into one reused ``bytearray`` when a file rotates, or when
a lone surrogate must be replaced); a batch is written with whole lines only, so a reader never
sees half a line from this sink (a crash mid-``write`` aside, which ``read_events`` reports as a
corrupt line; the next sink to open the file ends that line first, so what it appends is not
merged into it).

The file at a path (opened, its write lock held a batch, followed when renamed, rotated) is
``_log_file``'s ``LogFile``, a part of the sink; the encoding and the writes are here.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from ckpt_events import InvalidTypeError, InvalidValueError, Redactor
from ckpt_events._errors import check_file_name, check_int, shown
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events.sinks._hexids import with_hex_ids, with_hex_ids_all
from ckpt_events.sinks._redacted import redacted
from ckpt_events.sinks.jsonl._file_lock import lock
from ckpt_events.sinks.jsonl._line_fit import CUT_TO, cut_text, lines_fit, replace_text
from ckpt_events.sinks.jsonl._log_file import HOLD_TRIES, LogFile, pipe_full
from ckpt_events.sinks.jsonl._reader import MAX_LINE

__all__ = ["JsonLinesSink", "JsonLinesStats"]

logger: Final = library_logger("ckpt_events.sinks.jsonl")

_NEWLINE: Final = 10


class JsonLinesStats(msgspec.Struct, frozen=True):
    """Counters of one ``JsonLinesSink``: events and bytes written, files rotated, writes failed.

    ``events`` and ``bytes`` count only what reached the file. ``failed`` counts the events
    of batches whose write failed (a full disk: their bytes are truncated away, and the bus
    counts the batch as failed too) or that came after ``close()``; ``torn_lines`` the torn
    lines ended with a newline so the next line starts clean (a reader reports each as a corrupt
    line): one a failed write left
    that could not be truncated away, or one found at the end of the file when the sink opened
    it (a process killed mid-write before this one appended).
    ``last_error`` is the latest write error (kept after writing resumes; ``None`` if none).
    ``replaced_values`` counts strings JSON (UTF-8) cannot hold, a lone surrogate such as
    ``"x\\ud800"``, written with U+FFFD in its place so the event's line is still written.
    An event whose line would be longer than ``MAX_LINE`` (1 MiB), which ``read_events`` skips
    unread (a multi-megabyte attribute or checkpoint id), is written with each string longer than
    ``CUT_TO`` characters cut (``shortened``) or, if that is still too long, not at all
    (``too_long``); the first of them is logged. ``reopened`` counts the times the path no
    longer named the file open (renamed or deleted under the sink, as logrotate's ``create``
    mode does) and was opened again, so the lines go on at the path. ``rotation_errors`` counts
    rotations refused (the log's folder read-only, the log a bind-mounted file): the lines go on
    in the file open, past ``max_bytes``, and ``last_error`` says why. ``deleted`` counts the
    files rotation deleted, their lines gone: the oldest past ``backups`` (with ``backups=0``,
    the log itself at each rotation, said once). ``lock_missed`` counts batches written without
    the file's write lock (another writer held it past ``LOCK_WAIT``): only they end a file past
    ``max_bytes`` with several writers. ``unencodable`` counts events JSON cannot hold (built by
    hand with a trace id past 128 bits, a ``str`` subclass JSON refuses): each is left out, the
    first logged, and the rest of its batch is written (the whole batch was lost with it).
    """

    events: int
    bytes: int
    rotations: int
    failed: int = 0
    write_errors: int = 0
    torn_lines: int = 0
    last_error: str | None = None
    replaced_values: int = 0
    shortened: int = 0
    too_long: int = 0
    reopened: int = 0
    rotation_errors: int = 0
    deleted: int = 0
    lock_missed: int = 0
    unencodable: int = 0


class JsonLinesSink(LogFile):
    """A bus sink that appends each event as one JSON line to a file or a binary stream.

    ``target`` is a path (opened for append, closed by ``aclose()``) or a writable binary
    stream (flushed, never closed, by this sink). With ``max_bytes``, a path is rotated
    before a line would take it past that size: ``log.jsonl`` becomes ``log.jsonl.1`` and
    so on, keeping ``backups`` old files (0 keeps none); older ones are deleted, counted in
    ``stats().deleted``. A line longer than ``max_bytes`` gets a file of its own (logged once).

    Several sinks may write one log, in several processes (uvicorn ``--workers``) or in one (two
    buses, ``configure()`` called twice): each batch is written under the file's write lock, at its
    size read under that lock, so no file ends past ``max_bytes`` (a line longer than that aside)
    while every batch has the lock, and a sink opening the log never takes another's write in
    progress for a torn line. Where the lock is not had (no ``fcntl``, as on Windows; a filesystem
    without locks; a wait past ``LOCK_WAIT``, a writer stopped while holding it; a rotation
    refused, ``stats().rotation_errors``), a file may end past ``max_bytes`` with no fixed bound:
    ``docs/library.md`` says why, with the figures measured.

    Each batch is one ``write()`` of whole lines, by default on the event loop: appending
    a few kilobytes to a local file takes microseconds, as a logging handler's write does,
    and the lines are on disk as soon as the batch is handled, so a process killed with
    SIGKILL right after a checkpoint still leaves that checkpoint's events behind (the
    demo's crash relies on it). ``blocking=True`` moves the writes to a worker thread, for a
    slow or network filesystem; the bus then gathers ``linger`` seconds of events per batch.
    A path naming a pipe (a FIFO) needs its reader running when the sink opens it (else
    ``OSError`` ENXIO, at once); on the loop, a batch that finds the pipe full (its reader not
    reading) fails and is counted, where it froze the server; in a worker thread it waits.

    ``redactor`` (default: ``ckpt_events.Redactor()``) applies to user-supplied attributes, as
    the span sinks apply it: a string value under a matching name (``user.token``) is written
    as ``[REDACTED]``, so a log never holds what the exported spans hide.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[bytes],
        *,
        max_bytes: int | None = None,
        backups: int = 3,
        blocking: bool = False,
        linger: float = 0.25,
        redactor: Redactor | None = None,
    ) -> None:
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidTypeError(f"redactor must be a ckpt_events.Redactor or None, not {shown(redactor)}")
        self.redactor = redactor if redactor is not None else Redactor()
        if max_bytes is not None:
            check_int(
                max_bytes, f"max_bytes must be a positive int or None, not {shown(max_bytes)}", minimum=1
            )
        check_int(backups, f"backups must be an int >= 0, not {shown(backups)}")
        self._events = 0
        self._bytes = 0
        self._rotations = 0
        self._failed = 0
        self._write_errors = 0
        self._torn_lines = 0
        self._replaced = 0
        self._shortened = 0
        self._too_long = 0
        self._unencodable = 0
        self._reopened = 0
        self._rotation_errors = 0
        self._deleted = 0
        self._lock_misses = 0
        self._oversized = False  # a line longer than max_bytes was logged
        self._rotation_held = False  # a rotation failed in this batch: not tried again before the next
        self._identity = (0, 0)  # (st_dev, st_ino) of the file open
        self._torn = False  # the file ends in a torn line that still needs its newline
        self._regular = False  # the file open is a regular file: writes hold its lock
        self._readable = False  # its descriptor can read too: its last byte is read through it
        self._locked = False  # this batch holds the file's write lock
        self._lock_missed = False  # the last lock was not had in time: the next is tried once
        self._last_error: str | None = None
        self._failing = False  # the last write failed: log once when writing resumes
        self._path: Path | None
        self._file: IO[bytes]
        self._size = 0
        self.blocking = blocking  # before _open(): a named pipe is left non-blocking only on the loop
        if isinstance(target, str | os.PathLike):
            if not os.fspath(target):  # abspath("") is the working folder: "Is a directory: <cwd>"
                raise InvalidValueError(
                    "target is an empty path: give the log's file, such as 'events.jsonl'"
                )
            check_file_name(target, "target")
            # Absolute, as logging.FileHandler makes it: a chdir() later (a daemon going to /) must
            # not move the log, or make a rotation rename files in the new folder.
            self._path = Path(os.path.abspath(target))
            self._open()
        elif isinstance(target, io.TextIOBase):  # sys.stdout: every batch failed, bytes to a str stream
            raise InvalidTypeError(
                f"target must be a path or a binary stream, not the text stream {shown(target)}: "
                "pass its .buffer (sys.stdout.buffer), or open the file in 'ab' mode"
            )
        elif hasattr(target, "write"):
            if max_bytes is not None:
                raise InvalidValueError("max_bytes (rotation) needs a path, not a stream")
            self._path = None
            self._file = target
        else:
            raise InvalidTypeError(f"target must be a path or a binary stream, not {shown(target)}")
        self.max_bytes = max_bytes
        self.backups = backups
        self.linger = linger if blocking else 0.0
        encoder = msgspec.json.Encoder()
        self._encode_into = encoder.encode_into
        self._encode_lines = encoder.encode_lines
        self._buffer = bytearray()
        # handle() may run in a worker thread; flush()/aclose() come from the loop thread.
        self._lock = threading.Lock()
        self._closed = False
        self._closing = False  # close() was called: set before it waits for the lock

    @property
    def path(self) -> Path | None:
        """The file written to, as an absolute path (``None`` for a stream)."""
        return self._path

    def handle(self, batch: list[Any]) -> None:
        """Append one line per event; whole lines only.

        A failed write (``OSError``, e.g. ``ENOSPC`` on a full disk) loses this batch: the
        buffer is cleared (memory stays bounded by one batch), what a short write left in the
        file is truncated away, the events are counted in ``stats().failed`` and the error is
        raised for the bus to count and log. The next batch tries again, so writing resumes
        when space returns. A batch handed after ``close()`` raises ``InvalidValueError``
        (counted in ``stats().failed``), for the bus to count, not to be counted delivered.
        """
        with self._lock:
            if self._closed:
                if not batch:
                    return
                # Was: returned, and the bus counted the batch delivered, written nowhere (the
                # sink closed by its owner while still subscribed).
                self._failed += len(batch)
                raise InvalidValueError(
                    f"{len(batch)} events handed to a closed JsonLinesSink ({self._path or self._file}) "
                    "are lost: unsubscribe it before closing it, or let the bus close it"
                )
            try:
                self._handle(batch)
            finally:
                if self._closing:  # close() came meanwhile and may have stopped waiting for us
                    self._close_file()

    def _handle(self, batch: list[Any]) -> None:
        """``handle()``'s work, with the lock held."""
        batch = redacted(batch, self.redactor)
        events_before = self._events
        try:
            if self._path is not None:
                self._hold(self._path)
                self._lock_misses += self._regular and not self._locked
            if self._torn:
                self._end_torn_line()
            if self.max_bytes is None:
                try:
                    # The whole batch in one call into msgspec: per event, a Python loop
                    # around encode_into cost about as much again as the encoding itself.
                    lines: bytes | bytearray = self._encode_lines(with_hex_ids_all(batch))
                    count = len(batch)
                    if len(lines) > MAX_LINE and not lines_fit(lines, MAX_LINE):
                        lines, count = self._encode_each(batch)  # one too long: event by event
                except (TypeError, ValueError, OverflowError):
                    # A lone surrogate somewhere (UnicodeEncodeError), or an event JSON cannot
                    # hold: event by event, so the others of the batch are still written.
                    lines, count = self._encode_each(batch)
                self._write(lines, count)
            else:
                self._handle_rotating(batch, self.max_bytes)
        except OSError as exc:
            self._buffer.clear()
            self._failed += len(batch) - (self._events - events_before)
            self._write_errors += 1
            self._last_error = str(exc)
            self._failing = True
            raise
        finally:
            self._release()
        if self._failing:
            logger.warning(
                "%s: writing again after %d write errors (%d events lost, last: %s)",
                self._path or self._file,
                self._write_errors,
                self._failed,
                self._last_error,
            )
            self._failing = False

    def _encode_each(self, batch: Iterable[Any]) -> tuple[bytearray, int]:
        """``batch``'s lines in the reused buffer, each event on its own, any surrogate replaced,
        a line too long for ``read_events`` left out (counted); and how many lines."""
        buffer = self._buffer
        lines = 0
        for event in batch:
            before = len(buffer)
            if not self._encode_event(event, buffer, before):
                continue
            if len(buffer) - before > MAX_LINE:
                self._leave_out(event, buffer, before)
                if len(buffer) == before:
                    continue
            buffer.append(_NEWLINE)
            lines += 1
        return buffer, lines

    def _leave_out(self, event: Any, buffer: bytearray, start: int) -> None:
        """``event``'s line (from ``start`` in ``buffer``) is too long to be read back: written
        again with every string longer than ``CUT_TO`` characters cut (a span still ends in the
        log, rather than staying open there for ever), or, if that is still too long, not at all."""
        length = len(buffer) - start
        del buffer[start:]
        fields, cut = cut_text(msgspec.to_builtins(with_hex_ids(event)))
        try:
            self._encode_into(fields, buffer, -1)
        except UnicodeEncodeError:  # a lone surrogate as well
            del buffer[start:]
            fields, replaced = replace_text(fields)
            self._encode_into(fields, buffer, -1)
            self._replaced += replaced
        if len(buffer) - start <= MAX_LINE:
            self._shortened += 1
            outcome = f"written with {cut} string(s) cut to {CUT_TO:,} characters"
        else:
            del buffer[start:]
            self._too_long += 1
            outcome = "not written"
        if self._shortened + self._too_long == 1:
            logger.warning(
                "%s: a %s event of %s bytes was %s: read_events skips a line longer than %s bytes "
                "(a multi-megabyte attribute or checkpoint id?); such events are counted in "
                "stats().shortened and stats().too_long and not logged again",
                self._path or self._file,
                type(event).__name__,
                f"{length:,}",
                outcome,
                f"{MAX_LINE:,}",
            )

    def _handle_rotating(self, batch: Iterable[Any], max_bytes: int) -> None:
        assert self._path is not None
        self._rotation_held = False
        buffer = self._buffer
        encode_into = self._encode_into
        lines = 0
        for event in batch:
            before = len(buffer)
            # The common case inline (no method call an event on this path); a lone surrogate
            # (a UnicodeEncodeError) or an event JSON cannot hold goes through _encode_event.
            try:
                encode_into(with_hex_ids(event), buffer, -1)
            except (ValueError, TypeError, OverflowError):
                if not self._encode_event(event, buffer, before):
                    continue
            if len(buffer) - before > MAX_LINE:
                self._leave_out(event, buffer, before)
                if len(buffer) == before:
                    continue
            buffer.append(_NEWLINE)
            if len(buffer) - before > max_bytes and not self._oversized:
                self._say_oversized(len(buffer) - before, max_bytes)
            for _ in range(HOLD_TRIES):
                if self._size + len(buffer) <= max_bytes or self._size + before == 0 or self._rotation_held:
                    break
                # The new line would overflow this file: finish the file without it.
                if before:
                    # Released even when the write fails: a view left alive in the traceback
                    # kept the buffer exported, so clearing it failed (BufferError) on a full disk,
                    # and its lines were counted as nothing and written after later batches.
                    with memoryview(buffer) as whole, whole[:before] as head:
                        self._write(head, lines)
                    del buffer[:before]
                    before = 0
                self._rotate()
                # The new file's lock and its size: another sink may have written there first,
                # even filled it while this one waited for its lock, so the line is measured again.
                self._hold(self._path)
                lines = 0
            lines += 1
        self._write(buffer, lines)

    def _say_oversized(self, length: int, max_bytes: int) -> None:
        # Each such line goes to a file of its own, past max_bytes, and backups=3 keeps the last
        # four: max_bytes=10 meant as 10 MB kept four events, without a word.
        self._oversized = True
        logger.warning(
            "%s: a line of %s bytes is longer than max_bytes=%s bytes: each such line is written "
            "to a file of its own, and only the last %s are kept (max_bytes counts bytes: 10 MiB is "
            "10_485_760); not logged again",
            self._path,
            f"{length:,}",
            f"{max_bytes:,}",
            self.backups + 1,
        )

    def _encode_event(self, event: Any, buffer: bytearray, start: int) -> bool:
        """Encode ``event`` at ``start`` in ``buffer`` (U+FFFD for a lone surrogate); ``False``,
        with nothing of it left in ``buffer``, for an event JSON cannot hold (counted, the first
        logged)."""
        del buffer[start:]  # what a failed encode left
        try:
            try:
                self._encode_into(with_hex_ids(event), buffer, -1)
            except UnicodeEncodeError:
                self._encode_replaced(event, buffer, start)
        except (TypeError, ValueError, OverflowError) as exc:
            del buffer[start:]
            self._unencodable += 1
            if self._unencodable == 1:
                logger.warning(
                    "%s: a %s event could not be written as JSON (%s: %s; built by hand with a field "
                    "out of its type's range?): it is left out, the rest of its batch is written; such "
                    "events are counted in stats().unencodable and not logged again",
                    self._path or self._file,
                    type(event).__name__,
                    type(exc).__name__,
                    exc,
                )
            return False
        return True

    def _encode_replaced(self, event: Any, buffer: bytearray, start: int) -> None:
        """Encode ``event`` at ``start`` (where the failed encode began) with U+FFFD for each surrogate."""
        del buffer[start:]
        fields, replaced = replace_text(msgspec.to_builtins(with_hex_ids(event)))
        self._encode_into(fields, buffer, -1)
        self._replaced += replaced

    def _write(self, data: bytes | bytearray | memoryview, lines: int) -> None:
        """Write all of ``data`` (``lines`` whole lines), going on after short writes.

        On a failure after a short write, the file is truncated back to where ``data``
        began; if it cannot be, the whole lines that reached it are counted as written and a
        torn last line is ended with a newline (now, or before the next batch).
        """
        try:
            if data:
                view = memoryview(data)
                written = 0
                try:
                    while written < len(view):
                        with view[written:] as rest:  # released even if a traceback keeps it
                            count = self._file.write(rest)
                        if count is None:  # a non-blocking pipe, full
                            raise pipe_full()
                        if not count:  # 0: no progress, do not spin
                            raise OSError(errno.EIO, "write made no progress")
                        written += count
                    if self._path is None:
                        self._file.flush()  # a caller's stream: push each batch through its buffer
                except OSError:
                    if written:
                        with view[:written] as done:
                            self._take_back(done)
                    raise
                finally:
                    view.release()
                self._size += written
                self._bytes += written
            self._events += lines
        finally:
            if isinstance(data, bytearray):
                data.clear()

    def _take_back(self, written: memoryview) -> None:
        """Remove the bytes of a failed write from the file, or keep its whole lines and end the torn one."""
        try:
            end = self._file.tell()
            self._file.truncate(end - len(written))
            self._file.seek(end - len(written))
            return
        except (OSError, ValueError):  # not seekable, or the truncate itself failed
            pass
        whole = bytes(written).rfind(b"\n") + 1
        self._events += bytes(written[:whole]).count(b"\n")
        self._size += len(written)
        self._bytes += len(written)
        if whole < len(written):
            self._torn = True
            self._torn_lines += 1
            with contextlib.suppress(OSError):
                self._end_torn_line()

    def flush(self) -> None:
        """Push written lines to the operating system."""
        with self._lock:
            if not self._closed and not self._file.closed:  # closed: a reopen that failed
                self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this sink opened it. Idempotent.

        Waits at most ``CLOSE_WAIT`` seconds for a write in progress. A write stuck in a worker
        thread (``blocking=True``: a pipe nobody reads, a hung network filesystem) held this
        call, and the event loop calling it (the bus closing its sinks when its owner is
        cancelled), for ever; now the file is closed by that write when it returns, and such a
        close is logged once.
        """
        first = not self._closing
        self._closing = True  # seen by a write that ends meanwhile: it closes the file itself
        if not self._lock.acquire(timeout=CLOSE_WAIT):
            if first:
                logger.warning(
                    "%s: closed while a write was stuck for %.1f s (a pipe nobody reads, a hung "
                    "file system?); the file is closed when that write returns",
                    self._path or self._file,
                    CLOSE_WAIT,
                )
            return
        try:
            self._close_file()
        finally:
            self._lock.release()

    def _close_file(self) -> None:
        """``close()``'s work, with the lock held."""
        if self._closed:
            return
        self._closed = True
        if self._path is not None:
            if self._regular and not self._file.closed:  # closed: a reopen that failed
                self._locked = lock(self._file, self._identity, self._lock_wait())
            self._close_open_file()
        else:
            self._file.flush()

    async def aclose(self) -> None:
        """Flush and close (the bus awaits this after the sink's last batch)."""
        self.close()

    def stats(self) -> JsonLinesStats:
        """Events and bytes that reached the file so far, rotations, and failed writes."""
        return JsonLinesStats(
            events=self._events,
            bytes=self._bytes,
            rotations=self._rotations,
            failed=self._failed,
            write_errors=self._write_errors,
            torn_lines=self._torn_lines,
            last_error=self._last_error,
            replaced_values=self._replaced,
            shortened=self._shortened,
            too_long=self._too_long,
            reopened=self._reopened,
            rotation_errors=self._rotation_errors,
            deleted=self._deleted,
            lock_missed=self._lock_misses,
            unencodable=self._unencodable,
        )


#: How long ``close()`` waits for a write in progress (one takes microseconds to milliseconds).
CLOSE_WAIT: Final = 0.5


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", JsonLinesSink, JsonLinesStats)
