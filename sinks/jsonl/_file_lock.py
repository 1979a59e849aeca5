"""The write lock every ``JsonLinesSink`` writing one log holds while it writes a batch or
rotates the log, so several sinks given one path, in several processes (uvicorn ``--workers``)
or in one, measure, rotate and end torn lines on the file's real state.

Two parts: a ``threading.Lock`` per file (its ``st_dev`` and ``st_ino``) shared by this process's
sinks, taken first, then the POSIX lock (``lockf``) that excludes other processes. A POSIX lock
belongs to the process, so it never excluded two sinks of one process: two sinks on one log,
``max_bytes=4000``, 2,000 events each from two threads, lost 451-725 of the 4,000 lines, all
counted written (each renamed the ``.N`` chain over the other's files).

What the lock bounds, measured with 4 processes of 2,000 events each, ``max_bytes=4000``, on a
loaded 2-core machine: 0 blank lines in 12 runs (was 1-4 a run, a sink opening the log took
another's write in progress for a torn line); 0 files over ``max_bytes`` in 19 runs where no lock
wait ran out (was 221-237 of ~240 files, by up to 392 bytes at one event a batch and 1,805 at
eight). A file goes past only through a batch written without the lock: it goes by the size read
without it, so it ends past by what the others appended between that read and its write, with no
fixed bound. After a wait runs out, each next batch tries the lock once, without waiting, until it
has it again (a stopped writer must not hold up every batch), so on a busy log several go without
it: another process holding the lock 1.2 s left 1-60 batches a writer without it and 0-5 of 263
files over, by up to 1,917 bytes (8 events a batch). The 0-6 files over by up to 321 bytes
measured before this was written down were such batches (a wait run out on a loaded machine).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import IO, Final

try:
    import fcntl
except ImportError:  # Windows: written and rotated without the lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_TRIES", "LOCK_WAIT", "ROTATION_WAIT", "lock", "unlock"]

#: The longest a rotation waits for another process's rotation of the same log (which holds the
#: lock for its renames only, milliseconds).
ROTATION_WAIT: Final = 1.0
#: The longest a batch waits for the write lock (another sink's write holds it microseconds, a
#: rotation milliseconds); not had by then, the batch is written without it.
LOCK_WAIT: Final = 0.5
#: Tries at the lock, a little longer apart each time up to 0.2 ms, within the wait.
LOCK_TRIES: Final = 5_000


class _Shared:
    """This process's lock on one file, and how many sinks hold it or wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


# Process-wide, as the POSIX locks it stands in for within a process are: an entry lives while a
# sink holds or waits for its file's lock, so a run's thousands of rotated files leave none behind.
_registry_lock: Final = threading.Lock()
_shared: Final[dict[tuple[int, int], _Shared]] = {}
#: The file each held lock was taken through (``id`` of the file object), and its entry's key.
_held: Final[dict[int, tuple[int, int]]] = {}


def lock(file: IO[bytes], identity: tuple[int, int], wait: float) -> bool:
    """Hold the write lock on the log open as ``file`` (its ``st_dev`` and ``st_ino``: ``identity``,
    which the sink has from opening it, saving an ``fstat`` a batch), waiting at most ``wait``
    seconds; whether it is held.

    Two processes given one log (uvicorn ``--workers``, each with its own sink) each rotated it
    when their own count said it was full, and renamed the ``.N`` chain over each other's
    files: whole files of lines lost, counted as written. Under the lock, the second finds the
    path naming a new file and writes there instead. ``lockf``, not ``flock``: ``serve`` holds a
    ``flock`` on its log for its whole life, which this would wait on. A process's own POSIX
    lock never blocks it, so this process's sinks first take the file's ``threading.Lock``.
    Not held (no ``fcntl``, a filesystem without locks, a writer holding it past the wait):
    written and rotated as before. Held, it is let go by ``unlock(file)``, also after ``file``
    is closed (the close drops the POSIX lock, and every other one this process has on the file,
    so a sink closes a file only while it holds its lock).
    """
    if fcntl is None:
        return False
    deadline = time.monotonic() + wait
    key = identity
    with _registry_lock:
        shared = _shared.setdefault(key, _Shared())
        shared.users += 1
    if shared.lock.acquire(timeout=wait):
        if _lock_file(file, deadline):
            with _registry_lock:
                _held[id(file)] = key
            return True
        shared.lock.release()
    _leave(key, shared)
    return False


def _lock_file(file: IO[bytes], deadline: float) -> bool:
    """Take the POSIX lock on ``file`` by ``deadline``; whether it is held."""
    assert fcntl is not None
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.lockf(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except (BlockingIOError, PermissionError):  # another writer holds it: wait a little
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.000_2, 0.000_02 * (attempt + 1)))
        except OSError:  # ENOLCK and the like: no locking here
            break
    return False


def _leave(key: tuple[int, int], shared: _Shared) -> None:
    """One sink fewer holds or waits for ``shared``; forgotten when none does."""
    with _registry_lock:
        shared.users -= 1
        if not shared.users:
            del _shared[key]


def unlock(file: IO[bytes]) -> None:
    """Let go of the lock ``lock`` took through ``file`` (the POSIX one only if the file is still
    open: a close drops it anyway); nothing if none is held."""
    with _registry_lock:
        key = _held.pop(id(file), None)
        if key is None:
            return
        shared = _shared[key]
    assert fcntl is not None
    if not file.closed:
        with contextlib.suppress(OSError):
            fcntl.lockf(file.fileno(), fcntl.LOCK_UN)
    shared.lock.release()
    _leave(key, shared)
