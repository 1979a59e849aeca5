"""A blocking sink's own daemon thread: its ``handle`` runs there, one batch at a time.

Why not anyio's worker threads: they are not daemons, so a sink stuck in ``handle`` (an exporter
waiting on a dead socket) kept the interpreter alive for ever after the bus had closed within its
deadline. A daemon thread ends with the process; the batch it held is counted as abandoned.

The thread is started on the first batch and told to stop when the subscription finishes. A
batch's result comes back to the event loop through the loop's ``call_soon_threadsafe`` (the
bus's scheduler), which never blocks the thread, even when the loop has already gone.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Final

import anyio

__all__ = ["SinkThread"]

_STOP: Final = None


class SinkThread:
    """Runs ``handle(batch)`` calls on one daemon thread, awaited from the event loop."""

    def __init__(self, name: str, schedule: Callable[[Callable[[], object]], object]) -> None:
        self.name = name
        self._schedule = schedule  # the loop's call_soon_threadsafe
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, handle: Callable[[list[Any]], object], batch: list[Any]) -> object:
        """``handle(batch)`` on the thread; its exception is raised here, else what it returned
        is returned. Cancelling the caller abandons the batch: the thread finishes it (or never
        does) on its own."""
        done = anyio.Event()
        outcome: list[BaseException | None] = []
        returned: list[object] = []

        def job() -> None:
            try:
                returned.append(handle(batch))
                outcome.append(None)
            except BaseException as exc:  # handed to the caller, who counts it
                outcome.append(exc)
            try:
                self._schedule(done.set)
            except RuntimeError:  # the loop has closed: nobody waits any more
                pass

        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name=f"ckpt_events sink {self.name}", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)
        await done.wait()
        error = outcome[0]
        if error is not None:
            raise error
        return returned[0]

    def stop(self) -> None:
        """Let the thread end after the job it holds (if any); never waits for it."""
        if self._thread is not None:
            self._jobs.put(_STOP)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            job()
