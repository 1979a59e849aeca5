"""``participants.server.workers.supervisor``: a worker started with its environment, stopped with
every process it started. (Restart budgets: ``test_worker_faults``.)"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest

from ckpt_events.participants.server.workers import supervisor as worker_supervisor
from ckpt_events.participants.server.workers.coordinator import ENV_SECRET
from ckpt_events.participants.server.workers.supervisor import WorkerSupervisor
from tests.processes import alive

pytestmark = pytest.mark.anyio

_CHILD = """
import json, os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
names = ("CKPT_EVENTS_WORKER_INDEX", "EXTRA", "PYTHONSAFEPATH", "PYTHONPATH", sys.argv[2])
seen = {name: os.environ.get(name) for name in names}
seen["grandchild"] = grandchild.pid
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""

# Deaf to SIGTERM, so ``stop`` goes through both of its waits; the file says the trap is set.
_DEAF = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").close()
time.sleep(60)
"""


async def test_a_worker_gets_its_index_secret_and_this_checkout_and_stop_ends_its_whole_group(
    tmp_path: Path,
) -> None:
    """``start`` passes the index, ``env``, a fresh secret and this checkout on ``PYTHONPATH``;
    ``stop`` ends the worker and a process it started (its process group)."""
    out = tmp_path / "seen.json"
    supervisor = WorkerSupervisor(
        2,
        lambda index: [sys.executable, "-c", _CHILD, str(out), ENV_SECRET],
        env={"EXTRA": "x"},
        secret_for=lambda index: f"secret-{index}",
    )
    assert supervisor.pid(1) is None
    supervisor.start(1)
    try:
        with anyio.fail_after(10):
            while not out.exists():
                await anyio.sleep(0.02)
        seen = json.loads(out.read_text())
        pid = supervisor.pid(1)
        assert pid is not None and supervisor.processes[1].pid == pid
        root = str(Path(__file__).resolve().parents[4])
        assert seen["PYTHONPATH"].split(os.pathsep)[0] == root
        assert {k: seen[k] for k in ("CKPT_EVENTS_WORKER_INDEX", "EXTRA", "PYTHONSAFEPATH", ENV_SECRET)} == {
            "CKPT_EVENTS_WORKER_INDEX": "1",
            "EXTRA": "x",
            "PYTHONSAFEPATH": "1",
            ENV_SECRET: "secret-1",
        }
        assert alive(seen["grandchild"])
    finally:
        with anyio.fail_after(10):
            await supervisor.stop()
    assert supervisor.processes[1].poll() is not None and supervisor.restarts == 0
    with anyio.fail_after(5):
        while alive(seen["grandchild"]):
            await anyio.sleep(0.02)


async def test_stop_lets_the_event_loop_run_while_it_waits_for_a_worker_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``stop`` of a worker that ignores SIGTERM waits out the deadline, SIGKILLs it and waits
    for it to go, and a ticker on the same loop keeps ticking all the while. The kill is said:
    the worker's own line of what its sinks lost never comes (a loaded suite run missed one
    worker's line, unsaid)."""
    monkeypatch.setattr(worker_supervisor, "_STOP_SECONDS", 0.4)
    ready = tmp_path / "ready"
    supervisor = WorkerSupervisor(1, lambda index: [sys.executable, "-c", _DEAF, str(ready)])
    supervisor.start(0)
    with anyio.fail_after(10):
        while not ready.exists():
            await anyio.sleep(0.02)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        started = time.monotonic()
        with anyio.fail_after(5):
            await supervisor.stop()
        took = time.monotonic() - started
        tg.cancel_scope.cancel()
    assert supervisor.processes[0].returncode == -signal.SIGKILL and took >= 0.4
    assert len(gaps) >= 10 and max(gaps) < 0.2, gaps
    said = [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]
    assert said == [
        "worker 0 did not stop within 0.4 s of SIGTERM: killed; what its sinks had not yet "
        "written or exported is lost, and not counted"
    ]


# Ends at SIGTERM with status 0 (a worker's graceful exit); the file says the handler is set.
_GRACEFUL = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open(sys.argv[1], "w").close()
time.sleep(60)
"""


async def test_stop_wakes_a_stopped_worker_so_it_ends_on_sigterm_not_at_the_sigkill_deadline(
    tmp_path: Path,
) -> None:
    """A worker hung by SIGSTOP gets SIGCONT after its SIGTERM: it exits gracefully (status 0)
    at once. A stopped process keeps SIGTERM pending, so the server's shutdown waited the whole
    5 s and then SIGKILLed it (7.2 s from SIGTERM to exit, worker status -9)."""
    ready = tmp_path / "ready"
    supervisor = WorkerSupervisor(1, lambda index: [sys.executable, "-c", _GRACEFUL, str(ready)])
    supervisor.start(0)
    with anyio.fail_after(10):
        while not ready.exists():
            await anyio.sleep(0.02)
    os.kill(supervisor.processes[0].pid, signal.SIGSTOP)
    started = time.monotonic()
    with anyio.fail_after(10):
        await supervisor.stop()
    took = time.monotonic() - started
    assert supervisor.processes[0].returncode == 0 and took < 2.0, (supervisor.processes[0].returncode, took)
