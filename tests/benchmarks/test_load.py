"""``load``'s process helpers: ``cores_apart`` (the driver pinned apart from the servers, its
affinity given back), ``stop_process`` and ``cpu_reading``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_events.benchmarks.load import (
    CpuReading,
    DriverError,
    Request,
    children_pids,
    cores_apart,
    cpu_reading,
    drive,
    listening,
    stop_process,
)
from ckpt_events.benchmarks.rotel import free_port


def test_cores_apart_pins_the_driver_and_gives_its_affinity_back() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError, match="inside"), cores_apart() as cores:
        if len(before) < 2:
            assert cores is None
            assert os.sched_getaffinity(0) == before
        else:
            assert cores is not None
            server, driver = cores
            assert server != driver and {server, driver} <= before
            assert os.sched_getaffinity(0) == {driver}
        raise RuntimeError("inside")  # an error in the block gives the affinity back too
    assert os.sched_getaffinity(0) == before


def test_stop_process_kills_what_outlives_its_deadline() -> None:
    """SIGTERM first; a process that ignores it is SIGKILLed at the deadline; both are reaped."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(polite) == -signal.SIGTERM
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    started = time.monotonic()
    assert stop_process(stubborn, timeout=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 10
    stubborn.stdout.close()


_LISTEN_LATE = """
import socket, sys, time
time.sleep(0.5)  # a server's startup before it listens (uvicorn runs the app's startup first)
server = socket.socket()
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
time.sleep(60)
"""


def test_listening_waits_for_the_port_and_tells_an_exit_from_a_timeout() -> None:
    """``bench --app`` once sent its first request when the app's startup had run but uvicorn
    did not listen yet (connection refused): ``listening`` waits for the port itself."""
    port = free_port()
    late = subprocess.Popen([sys.executable, "-c", _LISTEN_LATE, str(port)])
    try:
        started = time.monotonic()
        assert listening(late, port, 30) is True
        assert time.monotonic() - started >= 0.4
    finally:
        stop_process(late)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert listening(gone, free_port(), 30) is False
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert listening(silent, free_port(), 0.3) is None
    finally:
        stop_process(silent)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_wrk_that_cannot_connect_is_a_driver_error() -> None:
    """wrk's failure is one ``DriverError`` line (``bench --app`` reports it), not a bare RuntimeError."""
    with pytest.raises(DriverError, match=r"^wrk failed \(1\): unable to connect to 127\.0\.0\.1:\d+ "):
        drive("wrk", f"http://127.0.0.1:{free_port()}", Request("GET", "/"), 1, 1)


def test_an_interrupt_while_a_process_starts_never_loses_it() -> None:
    """A SIGTERM (raised as ``KeyboardInterrupt`` by ``bench``) landing inside ``Popen`` lost
    the started server, which then outlived the bench: ``spawn`` raises it once the process is
    in the registry, and ``stop_spawned`` ends it. The child signals its parent between its
    fork and its exec, while the parent is still inside ``Popen``."""
    from ckpt_events.benchmarks import load

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    parent = os.getpid()
    before = set(children_pids(parent))
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):  # raised by spawn, the process already registered
            load.spawn(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                preexec_fn=lambda: os.kill(parent, signal.SIGTERM),
            )
        assert len(set(children_pids(parent)) - before) == 1
        assert load.stop_spawned() == 1
        assert set(children_pids(parent)) - before == set()
    finally:
        signal.signal(signal.SIGTERM, previous)
        load.stop_spawned()


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(sys.platform != "linux", reason="another process's CPU clock is Linux's")
def test_cpu_reading_is_exact_and_keeps_a_thread_that_ended() -> None:
    """A child burns 0.3 s in a thread that then ends: the reading (its CPU clock) says 0.3 s
    and more to well under a tick, ended thread included, where the live threads' own counters
    (``/proc/<pid>/task/*/schedstat``) no longer hold it; the ticks agree within their grain."""
    code = (
        "import threading, time\n"
        "def burn():\n"
        "    end = time.thread_time() + 0.3\n"
        "    while time.thread_time() < end:\n"
        "        pass\n"
        "thread = threading.Thread(target=burn); thread.start(); thread.join()\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"done\n"
        # join() returns before the thread's kernel task has gone: until then its own counter
        # still holds the burn (read so once in CI, the difference 0).
        tasks = Path(f"/proc/{child.pid}/task")
        for _ in range(500):  # at most 5 s
            if len(list(tasks.iterdir())) == 1:
                break
            time.sleep(0.01)
        reading = cpu_reading(child.pid)
        live = sum(
            int((task / "schedstat").read_text().split()[0]) / 1e9
            for task in Path(f"/proc/{child.pid}/task").iterdir()
        )
        assert reading.run is not None
        assert 0.3 <= reading.run < 5.0  # the burn, and the interpreter's start
        assert reading.run - live >= 0.29  # the ended thread's time, which no live counter holds
        assert abs(reading.run - reading.ticks) < 0.05  # the ticks' grain, 10 ms, a few times over
    finally:
        stop_process(child)
        assert child.stdout is not None
        child.stdout.close()


def test_cpu_reading_since_is_exact_only_with_both_clocks() -> None:
    """Two readings of this process around 30 ms of CPU: exact, within 3 ms of this process's
    own CPU clock; a reading without the clock falls back to the ticks, never mixing the two."""
    cpu_before = time.process_time()
    before = cpu_reading(os.getpid())
    _burn(0.03)
    after = cpu_reading(os.getpid())
    cpu = time.process_time() - cpu_before
    seconds, exact = after.since(before)
    if sys.platform == "linux":
        assert exact and seconds >= 0.03 and abs(seconds - cpu) < 0.003
    no_clock = CpuReading(ticks=after.ticks, run=None)
    assert no_clock.since(before) == (after.ticks - before.ticks, False)
    assert CpuReading(ticks=1.5, run=2.25).since(CpuReading(ticks=1.0, run=2.0)) == (0.25, True)
