"""``WorkerSupervisor``: starts the worker processes of one server and restarts lost ones.

Each worker is its own process group (``start_new_session``), so stopping the server ends
every process a worker started. Each start gets a fresh ``hello`` secret in its environment
(``secret_for``). A worker that exits while the server runs is started again: the pool
reports it lost for the checkpoint in progress, and the next checkpoint succeeds once it is
back. Restarts are budgeted per time window (``max_restarts`` within ``window`` seconds, per
worker): a worker that keeps dying is a broken server, not a transient, so a spent budget
is logged once and ``on_spent`` is called (the server stops and exits non-zero) rather than
leaving every later prepare "not ready" for ever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio

from ckpt_events.checks import library_logger
from ckpt_events.participants.server.workers.coordinator import ENV_SECRET

__all__ = ["WorkerSupervisor"]

log = library_logger("ckpt_events.workers")

_POLL: Final = 0.2
_ROOT: Final = str(Path(__file__).resolve().parents[3])
_STOP_SECONDS: Final = 5.0
_STOP_POLL: Final = 0.05


class WorkerSupervisor:
    """Runs ``command(index)`` for each worker index with ``env`` added to the environment."""

    def __init__(
        self,
        workers: int,
        command: Callable[[int], Sequence[str]],
        *,
        env: Mapping[str, str] | None = None,
        max_restarts: int = 5,
        window: float = 60.0,
        secret_for: Callable[[int], str] | None = None,
        on_spent: Callable[[str], None] | None = None,
    ) -> None:
        self.workers = workers
        self.command = command
        self.env = dict(env or {})
        self.max_restarts = max_restarts
        self.window = window
        self.secret_for = secret_for
        self.on_spent = on_spent
        #: Restarts in all, and each worker's recent ones (monotonic times, within ``window``).
        self.restarts = 0
        self._recent: dict[int, deque[float]] = {}
        #: Why the server gave up on its workers, once it has.
        self.spent: str | None = None
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False
        self._stopped = False

    def start(self, index: int) -> None:
        env = {**os.environ, **self.env, "CKPT_EVENTS_WORKER_INDEX": str(index)}
        if self.secret_for is not None:
            env[ENV_SECRET] = self.secret_for(index)
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
                    recent = self._recent.setdefault(index, deque())
                    now = time.monotonic()
                    while recent and now - recent[0] > self.window:
                        recent.popleft()
                    if len(recent) >= self.max_restarts:
                        del self.processes[index]
                        self._give_up(index, code, len(recent) + 1)
                        continue
                    log.warning("worker %d exited (%s); restarting it", index, code)
                    recent.append(now)
                    self.restarts += 1
                    self.start(index)
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()

    def _give_up(self, index: int, code: int, exits: int) -> None:
        if self.spent is not None:
            return
        self.spent = (
            f"worker {index} exited {exits} times within {self.window:g} s ({_last_exit(code)}): "
            f"restart budget of {self.max_restarts} spent; stopping the server"
        )
        log.error("%s", self.spent)
        if self.on_spent is not None:
            self.on_spent(self.spent)

    def pid(self, index: int) -> int | None:
        process = self.processes.get(index)
        return None if process is None else process.pid

    async def stop(self) -> None:
        """SIGTERM (and SIGCONT, to wake a stopped one) each worker's process group, then SIGKILL
        what is left after a bounded wait; the event loop runs on while it waits. A worker still
        there ``_STOP_SECONDS`` after its SIGKILL raises ``subprocess.TimeoutExpired``. Once all
        have exited, a later call does nothing (their process groups are never signalled again:
        a group id may be reused)."""
        if self._stopped:
            return
        self._stopping = True
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
            # A stopped worker (SIGSTOP, a debugger let go) keeps SIGTERM pending until continued:
            # woken, it ends gracefully now, not SIGKILLed at the deadline (shutdown took 7.2 s).
            _signal_group(process, signal.SIGCONT)
        await self._wait_exited()
        for index, process in self.processes.items():
            if process.poll() is None:
                # Its own line of what its sinks lost never comes: say that it was cut short.
                log.warning(
                    "worker %d did not stop within %g s of SIGTERM: killed; what its sinks had "
                    "not yet written or exported is lost, and not counted",
                    index,
                    _STOP_SECONDS,
                )
            _signal_group(process, signal.SIGKILL)
        # Polled, not ``process.wait()``: a blocking wait would stall the event loop (and every
        # other worker's channel) for up to ``_STOP_SECONDS`` per worker.
        await self._wait_exited()
        for process in self.processes.values():
            if process.poll() is None:
                raise subprocess.TimeoutExpired(process.args, _STOP_SECONDS)
        self._stopped = True

    async def _wait_exited(self) -> None:
        with anyio.move_on_after(_STOP_SECONDS):
            while any(p.poll() is None for p in self.processes.values()):
                await anyio.sleep(_STOP_POLL)


def _last_exit(code: int) -> str:
    """How a worker last ended, and where to look: a worker killed by a signal wrote no error of
    its own, and "last exit status -9" sent the operator to read lines that were not there."""
    if code >= 0:
        return f"last exit status {code}: its own error is in the lines above"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return (
        f"last killed by {name}, not by an error of its own: something outside it kills it "
        "(the OOM killer? see dmesg)"
    )


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
