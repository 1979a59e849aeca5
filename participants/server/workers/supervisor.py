"""``WorkerSupervisor``: starts the worker processes of one server and restarts lost ones.

Each worker is its own process group (``start_new_session``), so stopping the server ends
every process a worker started. A worker that exits while the server runs is started again
(at most ``max_restarts`` times in all, a short pause between): the pool reports it lost for
the checkpoint in progress, and the next checkpoint succeeds once it is back.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio

__all__ = ["WorkerSupervisor"]

log = logging.getLogger("ckpt_events.workers")

_POLL: Final = 0.2
_ROOT: Final = str(Path(__file__).resolve().parents[3])
_STOP_SECONDS: Final = 5.0


class WorkerSupervisor:
    """Runs ``command(index)`` for each worker index with ``env`` added to the environment."""

    def __init__(
        self,
        workers: int,
        command: Callable[[int], Sequence[str]],
        *,
        env: Mapping[str, str] | None = None,
        max_restarts: int = 20,
    ) -> None:
        self.workers = workers
        self.command = command
        self.env = dict(env or {})
        self.max_restarts = max_restarts
        self.restarts = 0
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def start(self, index: int) -> None:
        env = {**os.environ, **self.env, "CKPT_EVENTS_WORKER_INDEX": str(index)}
        # The worker imports this very checkout, however (or whether) it was installed.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
        # Never the working directory on its path: a user's own sinks.py must not shadow ours.
        env["PYTHONSAFEPATH"] = "1"
        self.processes[index] = subprocess.Popen(list(self.command(index)), env=env, start_new_session=True)

    async def run(self) -> None:
        """Start every worker, then restart the ones that exit, until cancelled (then stop all)."""
        try:
            for index in range(self.workers):
                self.start(index)
            while True:
                await anyio.sleep(_POLL)
                for index, process in list(self.processes.items()):
                    code = process.poll()
                    if code is None or self._stopping:
                        continue
                    if self.restarts >= self.max_restarts:
                        log.error("worker %d exited (%s); restart budget spent", index, code)
                        del self.processes[index]
                        continue
                    log.warning("worker %d exited (%s); restarting it", index, code)
                    self.restarts += 1
                    self.start(index)
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()

    def pid(self, index: int) -> int | None:
        process = self.processes.get(index)
        return None if process is None else process.pid

    async def stop(self) -> None:
        """SIGTERM each worker's process group, then SIGKILL what is left after a bounded wait."""
        self._stopping = True
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        with anyio.move_on_after(_STOP_SECONDS):
            while any(p.poll() is None for p in self.processes.values()):
                await anyio.sleep(0.05)
        for process in self.processes.values():
            _signal_group(process, signal.SIGKILL)
            if process.poll() is None:
                process.wait(timeout=_STOP_SECONDS)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
