"""The file a ``JsonLinesSink`` writes at a path, kept in step with the file system: opened for
append (a torn line a killed writer left at its end ended first), held under its write lock for
each batch (``_file_lock``) with its size read under it, followed when the path names another
file (renamed or deleted under the sink, or rotated by another writer), and rotated.

``LogFile`` is a part of ``JsonLinesSink`` (``_writer``), which sets the state it keeps and
counts what it does in ``stats()``; the per-event path stays in ``_writer`` and calls nothing
here per event.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import IO, Final

from ckpt_events._logs import library_logger
from ckpt_events.sinks.jsonl._file_lock import LOCK_WAIT, ROTATION_WAIT, lock, unlock

__all__ = ["HOLD_TRIES", "LogFile", "pipe_full"]

logger: Final = library_logger("ckpt_events.sinks.jsonl")

#: Times a batch opens the path again when it names another file (rotated by another writer).
HOLD_TRIES: Final = 16

#: How a path is opened, as ``open(path, "ab")`` opens it.
_APPEND: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class LogFile:
    """The log at ``_path`` as ``JsonLinesSink`` has it open: opening, locking, following and
    rotating it.

    A base of ``JsonLinesSink``, not an object it owns, on purpose: the file's state is the
    sink's too. The rotating path reads ``_size`` for every event (``_rotation_held`` near the
    limit), and the sink's own per-batch code writes to ``_file``, grows ``_size`` and
    ``_bytes``, marks ``_torn``, locks through ``_identity`` at close and counts ``_rotations``
    and the rest in ``stats()``: 72 references to 17 of these attributes in ``_writer``, 9 calls
    here. As an owned object those reads would go through it on every event (or through a local
    alias of it), and the sink would reach into its state everywhere else: a mixin with a dot.
    The export process's flush protocol shares three values with its owner, read only while a
    flush waits, and is an owned object (``sinks/_export/flush.py``)."""

    # Set by JsonLinesSink.__init__, read and updated here.
    blocking: bool
    max_bytes: int | None
    backups: int
    _path: Path | None
    _file: IO[bytes]
    _size: int
    _bytes: int
    #: (st_dev, st_ino) of the file open.
    _identity: tuple[int, int]
    #: The file ends in a torn line that still needs its newline.
    _torn: bool
    _torn_lines: int
    #: The file open is a regular file: writes hold its lock.
    _regular: bool
    #: Its descriptor can read too: its last byte is read through it.
    _readable: bool
    #: This batch holds the file's write lock.
    _locked: bool
    #: The last lock was not had in time: the next is tried once.
    _lock_missed: bool
    #: A rotation failed in this batch: not tried again before the next.
    _rotation_held: bool
    _rotations: int
    _rotation_errors: int
    _reopened: int
    _deleted: int
    _last_error: str | None

    def _open(self) -> None:
        """Open the path for append, and end a torn line a killed writer left at its end.

        Without the newline, the first line appended would join the fragment and be lost with
        it (one corrupt line); with it, the fragment is that one corrupt line and every new line
        reads. The end is read under the file's write lock, which every sink holds while it
        writes, so another sink's write in progress (whose size grows a page at a time) is never
        taken for a torn line: that wrote 1-4 blank lines per 8,000 events with 4 processes.
        """
        assert self._path is not None
        # O_NONBLOCK: opening a named pipe with no reader waited for one for ever, in the
        # constructor (a server's start) or mid-run; now it fails at once (ENXIO), said below.
        try:
            fd = os.open(self._path, _APPEND | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            if exc.errno == errno.ENXIO and stat.S_ISFIFO(_mode(self._path)):
                raise OSError(
                    errno.ENXIO,
                    "a named pipe with no reader: start the process reading it first, "
                    "or log to a regular file",
                    str(self._path),
                ) from None
            raise
        opened = os.fstat(fd)
        # A pipe written on the event loop stays non-blocking: a reader that stopped reading
        # froze the whole server in write() once the pipe's 64 KiB were full; now that batch
        # fails (counted). In a worker thread (blocking=True) the write may wait for a slow reader.
        os.set_blocking(fd, not stat.S_ISFIFO(opened.st_mode) or self.blocking)
        # Unbuffered: each batch is already one buffer and goes out in one write(), so a
        # process killed with SIGKILL loses at most the batch being written, not a buffer's worth.
        self._regular = stat.S_ISREG(opened.st_mode)
        self._readable = False
        if self._regular:
            fd = self._readable_instead(fd, opened)
        self._file = open(fd, "ab", buffering=0)  # noqa: SIM115 - closed by aclose()
        self._identity = (opened.st_dev, opened.st_ino)
        # Not tell(): a named pipe or /dev/stdout piped (a container's log) cannot seek, and the
        # sink failed to open ("Illegal seek") though it writes to one as to a stream.
        self._size = opened.st_size if self._regular else 0
        if self._size and self._readable:
            locked = lock(self._file, self._identity, self._lock_wait())
            self._lock_missed = not locked
            try:
                if not self._ends_a_line():
                    self._torn = True
                    self._torn_lines += 1
                    with contextlib.suppress(OSError):  # a full disk: handle() ends it before its first write
                        self._end_torn_line()
            finally:
                if locked:
                    unlock(self._file)

    def _readable_instead(self, fd: int, opened: os.stat_result) -> int:
        """``fd`` (write-only) or, if the path can be opened for reading too and is still the same
        file, that descriptor instead, ``fd`` closed: the file's last byte is then read through
        the descriptor that holds the lock (closing a second one would drop this process's lock)."""
        assert self._path is not None
        try:
            both = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError:  # a write-only file: its end is not checked
            return fd
        now = os.fstat(both)
        if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):  # renamed meanwhile
            os.close(both)
            return fd
        os.close(fd)
        self._readable = True
        return both

    def _ends_a_line(self) -> bool:
        """Whether the file open ends in a newline (or is empty), read through its own descriptor."""
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        self._size = size
        return size == 0 or os.pread(fd, 1, size - 1) in (b"\n", b"")

    def _lock_wait(self) -> float:
        """How long to wait for the write lock: ``LOCK_WAIT``, or no time after a wait that failed
        (a writer stopped while holding it must not hold up every batch of this one)."""
        return 0.0 if self._lock_missed else LOCK_WAIT

    def _hold(self, path: Path) -> None:
        """Hold the write lock of the file ``path`` names, opening it again first if it is no
        longer the file open, and take its size under the lock.

        Every sink writes its batches under this lock (one ``lockf`` and one unlock a batch, 2-3 us
        here), so the size a rotation goes by is the file's real size: each sink read it once a
        batch and wrote on a stale one, and a batch of another sink landed in the file just
        renamed to ``.1`` through its still-open descriptor (4 processes, ``max_bytes=4000``:
        files up to 1,934 bytes over).
        """
        for _ in range(HOLD_TRIES):
            self._lock_open_file()
            if not self._follow_path(path):
                return
        # The path renamed again each time (other sinks rotating fast): write to the file just
        # opened, under its lock and by its own size, so it still ends within max_bytes.
        self._lock_open_file()
        if self._locked:
            self._size = os.fstat(self._file.fileno()).st_size

    def _lock_open_file(self) -> None:
        if self._regular and not self._locked and not self._file.closed:
            self._locked = lock(self._file, self._identity, self._lock_wait())
            self._lock_missed = not self._locked

    def _release(self) -> None:
        if self._locked:
            unlock(self._file)
            self._locked = False

    def _follow_path(self, path: Path) -> bool:
        """Open ``path`` again if it no longer names the file open (logrotate's ``create`` mode
        renamed it, or it was deleted), as ``logging``'s ``WatchedFileHandler`` does: the lines
        went on into the renamed or unlinked file, counted as written, and a deleted log lost
        every event after it. Else take the file's size again (``copytruncate`` emptied it, or
        another writer appended), which rotation goes by. One ``stat`` a batch: about 2-3 us here,
        on a batch of six events that takes about 15 us to write. Whether it opened the path again."""
        try:
            now = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            now = None
        except OSError:  # cannot tell (a folder no longer searchable): go on with the file open
            return False
        if now is not None and (now.st_dev, now.st_ino) == self._identity and not self._file.closed:
            self._size = now.st_size
            return False
        self._reopen()  # its folder gone: OSError, this batch failed and counted; the next tries again
        return True

    def _end_torn_line(self) -> None:
        # A newline after a torn line, so the next line starts clean (the reader skips one line).
        # Not written (a full pipe): raised, so the batch is not appended to the torn line.
        if not self._file.write(b"\n"):
            raise pipe_full()
        self._torn = False
        self._size += 1
        self._bytes += 1

    def _rotate(self) -> None:
        """Rename the file away and open a new one at the path; if the renaming is refused, go
        on in the file open, past ``max_bytes`` (counted in ``rotation_errors``, the first logged).

        A folder made read-only under the sink, or a log bind-mounted as a single file (EBUSY),
        refused the rename after the file was closed: every batch from then on failed and was
        lost (and counted as ``reopened``), though the file still took lines.
        """
        assert self._path is not None
        path = self._path
        # Usually held already, for the batch; else (not had in time) tried for the rotation
        # and kept for the rest of the batch, which handle() lets go of.
        if not self._locked:
            self._locked = lock(self._file, self._identity, ROTATION_WAIT)
        if self._locked and not self._names_file_open(path):
            # Another sink writing this log rotated it while this one waited for the lock: its
            # new file is at the path; go on there rather than rotate that too.
            self._reopen()
            return
        try:
            if self.backups == 0:
                path.unlink(missing_ok=True)
                self._deleted += 1
            else:
                for n in range(self.backups - 1, -1, -1):
                    older = path.with_name(f"{path.name}.{n}") if n else path
                    newer = path.with_name(f"{path.name}.{n + 1}")
                    if n and not older.exists():
                        continue
                    # The oldest kept, replaced by the one before it: its lines are gone.
                    replaced = n == self.backups - 1 and os.path.lexists(newer)
                    older.replace(newer)
                    self._deleted += replaced
        except OSError as exc:
            self._rotation_held = True  # tried again next batch, not once per line
            self._rotation_errors += 1
            self._last_error = str(exc)
            if self._rotation_errors == 1:
                logger.warning(
                    "%s: cannot rotate (%s); writing on past max_bytes=%s; rotation is tried again "
                    "each batch, failures counted in stats().rotation_errors and not logged again",
                    path,
                    exc,
                    f"{self.max_bytes:,}",
                )
            return
        self._close_open_file()  # and its lock, once the renaming is done
        if self.backups == 0 and self._deleted == 1:
            # logging.RotatingFileHandler(backupCount=0) never rotates; here the log is gone.
            logger.warning(
                "%s: rotated at max_bytes=%s with backups=0: the log's lines are deleted, not "
                "kept (give backups=N to keep N files); deletions counted in stats().deleted and "
                "not logged again",
                path,
                f"{self.max_bytes:,}",
            )
        # Usually a new file; another writer may have made it since, and it may end torn.
        self._open()
        self._rotations += 1

    def _reopen(self) -> None:
        """Close the file open and open the path again (it names another file now), counted."""
        self._close_open_file()
        self._open()
        self._reopened += 1

    def _close_open_file(self) -> None:
        """Close the file open, then let go of its lock if held: the close drops every POSIX lock
        this process has on the file, so it must not come while another sink of this process
        holds it (its write would no longer exclude other processes)."""
        file = self._file
        file.close()
        if self._locked:
            self._locked = False
            unlock(file)

    def _names_file_open(self, path: Path) -> bool:
        """Whether ``path`` still names the file this sink has open."""
        try:
            now = os.stat(path)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == self._identity


def _mode(path: Path) -> int:
    """``path``'s ``st_mode``, 0 if it cannot be read."""
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def pipe_full() -> BlockingIOError:
    """The error a write to a full non-blocking pipe fails with, saying what to do."""
    return BlockingIOError(
        errno.EAGAIN,
        "the pipe is full: its reader is not reading (the batch is dropped, counted in "
        "stats().failed); keep the reader up, or log to a regular file",
    )
