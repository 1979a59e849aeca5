"""The POSIX write lock every ``JsonLinesSink`` writing one log holds while it writes a batch or
rotates the log, so several processes given one path (uvicorn ``--workers``) measure, rotate and
end torn lines on the file's real state."""

from __future__ import annotations

import contextlib
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


def lock(file: IO[bytes], wait: float) -> bool:
    """Hold a POSIX write lock on the log open as ``file``, waiting at most ``wait`` seconds;
    whether it is held.

    Two processes given one log (uvicorn ``--workers``, each with its own sink) each rotated it
    when their own count said it was full, and renamed the ``.N`` chain over each other's
    files: whole files of lines lost, counted as written. Under the lock, the second finds the
    path naming a new file and writes there instead. ``lockf``, not ``flock``: ``serve`` holds a
    ``flock`` on its log for its whole life, which this would wait on; a process's own POSIX
    lock never blocks it (so two sinks of one process on one log do not exclude each other).
    Not held (no ``fcntl``, a filesystem without locks, a writer holding it past the wait):
    written and rotated as before.
    """
    if fcntl is None:
        return False
    deadline = time.monotonic() + wait
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


def unlock(file: IO[bytes]) -> None:
    """Let go of the lock ``lock`` took, if the file is still open (a close drops it anyway)."""
    if fcntl is not None and not file.closed:
        with contextlib.suppress(OSError):
            fcntl.lockf(file.fileno(), fcntl.LOCK_UN)
