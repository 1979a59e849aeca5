"""Drive one HTTP route for a fixed time: with ``wrk`` when it is installed, else with httpx.

``drive(driver, url, request, seconds, connections)`` returns a ``Load``: how many requests
were answered, how many with a status other than 2xx/3xx, and the seconds they took. Both
drivers keep ``connections`` keep-alive connections busy for ``seconds`` and stop there;
every request also has a timeout, so a server that stops answering ends the run, never hangs
it. ``cpu_seconds(pid)`` is a process's CPU (all threads) from ``/proc``, in clock ticks;
``cpu_reading(pid)`` reads it to the nanosecond as well, for the servers' CPU per request
(``CpuReading``); ``cores_apart()``
pins this process (the driver) to one core and hands the other to the servers;
``spawn(command)`` starts a server or collector and keeps it in a registry until
``stop_process(proc)`` ends it (SIGTERM, then SIGKILL past its deadline); ``stop_spawned()``
ends whatever a suite interrupted mid-way left there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal

from .app_choices import DRIVERS

__all__ = [
    "DRIVERS",
    "CpuReading",
    "DriverError",
    "Load",
    "Request",
    "cores_apart",
    "cpu_reading",
    "cpu_seconds",
    "drive",
    "pick_driver",
    "spawn",
    "stat_cpu_seconds",
    "stop_process",
    "stop_spawned",
]

Driver = Literal["wrk", "httpx"]
#: A request that takes longer than this ends the run as an error (seconds).
REQUEST_TIMEOUT: Final = 10.0


class DriverError(RuntimeError):
    """The load generator (``wrk``) failed or did not finish: the message says how, in one line."""


@dataclass(frozen=True)
class Request:
    """What is sent, again and again: ``method``, ``path`` (with its query), ``body``, ``headers``."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Load:
    """What one run of a driver got: ``requests`` answered, ``failed`` of them with a status
    outside 2xx/3xx (or no answer), over ``seconds``."""

    requests: int
    failed: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


@contextlib.contextmanager
def cores_apart() -> Iterator[tuple[int, int] | None]:
    """``(server_core, driver_core)`` with this process (and what it starts from now on) pinned
    to the driver's, its affinity restored on leaving; ``None`` (nothing pinned) on one core."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        yield None
        return
    cores = (available[0], available[1])
    os.sched_setaffinity(0, {cores[1]})
    try:
        yield cores
    finally:
        os.sched_setaffinity(0, set(available))


#: Every process ``spawn`` started and ``stop_process`` has not ended yet.
_SPAWNED: Final[set[subprocess.Popen[Any]]] = set()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C or SIGTERM arriving inside the block is raised (``KeyboardInterrupt``) at its
    end: one raised inside ``Popen`` lost the started process, which nothing then stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread gets signals, and only it may set their handlers
        return
    caught: list[int] = []

    def later(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {signum: signal.signal(signum, later) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if caught:
        raise KeyboardInterrupt


def spawn(command: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(command, **options)``, kept in the registry ``stop_spawned`` empties,
    never lost to an interrupt on its way out."""
    with _interrupts_deferred():
        proc = subprocess.Popen(command, **options)
        _SPAWNED.add(proc)
    return proc


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if ``proc`` outlives ``timeout`` seconds; its exit code, reaped."""
    proc.terminate()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(timeout=10)
    _SPAWNED.discard(proc)
    return code


def stop_spawned(timeout: float = 5.0) -> int:
    """Stop every process ``spawn`` started that is still registered (a suite interrupted
    between a start and the block that stops it); how many were still running."""
    running = 0
    for proc in list(_SPAWNED):
        if proc.poll() is None:
            running += 1
            stop_process(proc, timeout)
        _SPAWNED.discard(proc)
    return running


def listening(proc: subprocess.Popen[Any], port: int, seconds: float) -> bool | None:
    """``True`` once something accepts connections on 127.0.0.1:``port``, ``False`` if ``proc``
    exited first, ``None`` if ``seconds`` passed with neither (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    for _ in range(10_000):
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            return None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` from ``/proc`` (all its threads)."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


@dataclass(frozen=True)
class CpuReading:
    """One process's CPU at one moment, read two ways.

    ``ticks``: user + system seconds from ``/proc/<pid>/stat``, counted in clock ticks (10 ms
    here): the kernel charges a whole tick to the thread it finds running, so a round of 10,000
    requests reads a server's CPU to 1 us a request, with that sampling's noise on top. ``run``:
    the process's CPU clock (Linux's clock of another process, ``clock_gettime`` on its clock id):
    every thread's time on a CPU as the scheduler counts it, to the nanosecond, those that ended
    included; ``None`` where it cannot be read (not Linux, or not allowed).
    """

    ticks: float
    run: float | None

    def since(self, before: CpuReading) -> tuple[float, bool]:
        """The CPU seconds from ``before`` to this reading, and whether they are exact (the CPU
        clock's, when both readings have it; else the ticks')."""
        if self.run is not None and before.run is not None:
            return self.run - before.run, True
        return self.ticks - before.ticks, False


def cpu_reading(pid: int) -> CpuReading:
    """``pid``'s CPU now (``CpuReading``); ``OSError`` if it is gone."""
    ticks = cpu_seconds(pid)
    try:
        run: float | None = time.clock_gettime(_process_cpu_clock(pid))
    except (OSError, AttributeError, OverflowError):  # no such clock here
        run = None
    return CpuReading(ticks, run)


def _process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (every thread's), as glibc's
    ``clock_getcpuclockid`` makes it on Linux (``CPUCLOCK_SCHED`` of the process, not a thread)."""
    return ((~pid) << 3) | 2


def children_pids(pid: int) -> list[int]:
    """The running children of process ``pid`` (of any of its threads)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile, or the kernel has no children file
            continue
    return found


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU of the running children of process ``pid`` (an export process)."""
    total = 0.0
    for child in children_pids(pid):
        try:
            total += cpu_seconds(child)
        except OSError:  # it ended meanwhile
            continue
    return total


def settled_children_cpu_seconds(pid: int, limit: float = 5.0) -> float:
    """``children_cpu_seconds(pid)`` once it settles (what the children were handed is handled)."""
    return settled(lambda: children_cpu_seconds(pid), limit)


def settled(read: Callable[[], float], limit: float = 5.0) -> float:
    """``read()`` (a CPU counter) once two readings 50 ms apart agree, or after ``limit`` seconds."""
    last = read()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now == last:
            break
        last = now
    return last


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU from a ``/proc`` ``stat`` file (a process's, or one thread's under
    ``task/``): its fields 14 and 15, in clock ticks (10 ms here)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pick_driver(choice: str) -> Driver:
    """``wrk`` when asked, or for ``auto`` when it is on the PATH; else ``httpx``."""
    if choice == "httpx" or (choice == "auto" and shutil.which("wrk") is None):
        return "httpx"
    if shutil.which("wrk") is None:
        raise FileNotFoundError("wrk is not on the PATH (apt install wrk), or use --driver httpx")
    return "wrk"


def drive(driver: Driver, url: str, request: Request, seconds: int, connections: int) -> Load:
    """Send ``request`` to ``url`` (base, no path) over ``connections`` for ``seconds``."""
    if driver == "wrk":
        return _wrk(url, request, seconds, connections)
    import anyio

    return anyio.run(_httpx, url, request, seconds, connections)


def _lua(data: str) -> str:
    # Decimal escapes: any byte, never a quote or bracket that could end the Lua string.
    return '"' + "".join(f"\\{byte:03d}" for byte in data.encode()) + '"'


def _wrk_script(request: Request) -> str:
    lines = [f"wrk.method = {_lua(request.method)}"]
    if request.body:
        lines.append(f"wrk.body = {_lua(request.body.decode())}")
    lines += [f"wrk.headers[{_lua(name)}] = {_lua(value)}" for name, value in request.headers]
    return "\n".join(lines) + "\n"


_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
_FAILED = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _wrk(url: str, request: Request, seconds: int, connections: int) -> Load:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "request.lua"
        script.write_text(_wrk_script(request))
        command = [
            "wrk",
            "-t1",  # one thread: the driver has one core of its own
            f"-c{connections}",
            f"-d{seconds}s",
            f"--timeout={REQUEST_TIMEOUT:.0f}s",
            "-s",
            str(script),
            url + request.path,
        ]
        limit = seconds + 2 * REQUEST_TIMEOUT
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise DriverError(f"wrk -c{connections} -d{seconds}s did not finish within {limit:g} s") from None
    total = _TOTAL.search(done.stdout)
    if done.returncode != 0 or total is None:
        said = (done.stderr or done.stdout).strip().splitlines() or ["(it printed nothing)"]
        raise DriverError(f"wrk failed ({done.returncode}): {said[-1][:300]}")
    failed = int(m.group(1)) if (m := _FAILED.search(done.stdout)) else 0
    if errors := _ERRORS.search(done.stdout):
        failed += sum(int(n) for n in errors.groups())
    return Load(int(total.group(1)), failed, float(total.group(2)) * _UNIT[total.group(3)])


async def _httpx(url: str, request: Request, seconds: int, connections: int) -> Load:
    import anyio
    import httpx

    counts = [0, 0]  # answered, failed
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = dict(request.headers)
    start = time.monotonic()
    deadline = start + seconds
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=REQUEST_TIMEOUT) as client:

        async def one_connection() -> None:
            while time.monotonic() < deadline:
                try:
                    answer = await client.request(
                        request.method, request.path, content=request.body or None, headers=headers
                    )
                except httpx.TransportError:
                    counts[1] += 1
                    continue
                counts[0] += 1
                if answer.status_code >= 400:
                    counts[1] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(connections):
                tg.start_soon(one_connection)
    return Load(counts[0], counts[1], time.monotonic() - start)
