"""A user's instrumented app under ``uvicorn --reload``: real processes, as docs/fastapi.md's
"Development: uvicorn --reload" describes them.

Each save of the app file is a new worker process: it binds the same Prometheus port again (the
old worker's closed connections to it must not keep it), starts its own export process after the
old one ended, and appends to the same JSON-lines file; Ctrl-C then ends every process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from ckpt_events.benchmarks.load import stop_process
from ckpt_events.benchmarks.rotel import free_ports
from tests.processes import alive

pytestmark = pytest.mark.slow

APP = """
import os

from fastapi import FastAPI, Request

from ckpt_events.participants.fastapi import instrument, operation

app = FastAPI()
instrument(app, kind="judge", instance="judge-0", jsonl_path="events.jsonl", export_process=True)


@app.post("/commit")
async def commit(request: Request) -> dict[str, int]:
    with operation(request, "commit", checkpoint_id="c1") as op:
        op.set(records=1)
    return {"pid": os.getpid()}
"""
RELOADS = 2
REQUESTS = 20  # per worker generation
COMMITS = 'gym_checkpoint_operation_duration_ms_milliseconds_count{nemo_gym_checkpoint_operation="commit"'


def _session(leader: int) -> list[int]:
    """The live processes of the session ``leader`` started (the reloader, its workers, their
    export processes, multiprocessing's resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == leader and alive(int(entry.name)):
                    pids.append(int(entry.name))
            except ProcessLookupError:
                continue
    return pids


def _export_processes(leader: int) -> list[int]:
    found = []
    for pid in _session(leader):
        try:
            if b"sinks._export.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except FileNotFoundError:
            continue
    return found


def _end(server: subprocess.Popen[str]) -> None:
    """Ctrl-C to the whole session if the test left it running, then SIGKILL to whatever of it
    outlives 10 s (a worker orphaned by its reloader too)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(10)
    for pid in _session(server.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop_process(server)


def _worker(client: httpx.Client, seconds: float, other_than: int | None = None) -> tuple[int, int]:
    """The pid of the worker answering, once it is not ``other_than``, and how many commits were
    answered meanwhile (by either)."""
    deadline = time.monotonic() + seconds
    answered = 0
    while time.monotonic() < deadline:
        try:
            pid = int(client.post("/commit").json()["pid"])
        except httpx.TransportError:  # between two workers: the request was never read
            pid = None
        answered += pid is not None
        if pid is not None and pid != other_than:
            return pid, answered
        time.sleep(0.1)
    raise AssertionError(f"no new worker answered within {seconds} s")


def _commits_counted(metrics: int, expected: float) -> float:
    """The commits the Prometheus page counts, once it counts ``expected`` or 5 s have passed
    (the events reach the export process a moment after their replies)."""
    deadline = time.monotonic() + 5
    while True:
        page = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
        counted = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(COMMITS)]
        if counted == [expected] or time.monotonic() > deadline:
            return sum(counted)
        time.sleep(0.05)


def _prometheus_on(metrics: int) -> dict[str, str]:
    """The environment of a reloading server whose workers serve /metrics on ``metrics``, our
    code on its path."""
    return {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }


def test_each_reload_rebinds_the_port_replaces_the_export_process_and_keeps_every_line(
    tmp_path: Path,
) -> None:
    port, metrics = free_ports(2)
    app_file = tmp_path / "userapp.py"
    app_file.write_text(APP)
    environ = _prometheus_on(metrics)
    command = [sys.executable, "-m", "uvicorn", "userapp:app", "--reload", "--reload-dir", str(tmp_path)]
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env={**os.environ, **environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches all of it, as in a terminal
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            first, answered = _worker(client, 30)
            workers = [first]
            for generation in range(RELOADS + 1):
                for _ in range(REQUESTS):
                    assert client.post("/commit").json()["pid"] == workers[-1]
                    answered += 1
                # This worker's endpoint counts this worker's commits: the port is its, not a
                # predecessor's (and the scrape leaves a connection the old server closed).
                assert _commits_counted(metrics, REQUESTS + 1) == REQUESTS + 1  # its first answer, then these
                assert len(_export_processes(server.pid)) == 1, _session(server.pid)
                if generation == RELOADS:
                    break
                app_file.write_text(app_file.read_text() + f"# saved {generation}\n")  # a save
                worker, meanwhile = _worker(client, 30, other_than=workers[-1])
                workers.append(worker)
                answered += meanwhile
        everything = _session(server.pid)
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the terminal
        started = time.monotonic()
        output, _ = server.communicate(timeout=30)
        took = time.monotonic() - started
        while any(alive(pid) for pid in everything) and time.monotonic() - started < 10:
            time.sleep(0.05)
        took_all = time.monotonic() - started
    finally:
        _end(server)  # only if the test failed before
    assert server.returncode == 0, output[-3000:]
    assert len(set(workers)) == RELOADS + 1, output[-3000:]
    assert output.count("Application startup complete.") == RELOADS + 1, output[-3000:]
    assert not [pid for pid in everything if alive(pid)], output[-3000:]
    assert took < 5 and took_all < 5, (took, took_all)
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    kinds = [msgspec.json.decode(line)["type"] for line in lines]  # a torn line would not decode
    assert kinds.count("operation_started") == kinds.count("operation_finished") == answered


def test_a_taken_prometheus_port_fails_one_worker_and_the_next_save_starts_it(tmp_path: Path) -> None:
    port, metrics = free_ports(2)
    app_file = tmp_path / "userapp.py"
    app_file.write_text(APP)
    environ = _prometheus_on(metrics)
    taken = socket.create_server(("127.0.0.1", metrics))  # a server left running in another terminal
    command = [sys.executable, "-m", "uvicorn", "userapp:app", "--reload", "--reload-dir", str(tmp_path)]
    log = tmp_path / "uvicorn.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env={**os.environ, **environ},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        said = f"ERROR:    ckpt-events: cannot serve Prometheus metrics on 127.0.0.1:{metrics} "
        said += "(Address already in use)"
        deadline = time.monotonic() + 30
        while said not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert said in log.read_text(), log.read_text()[-3000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert server.poll() is None  # the reloader watches on
        taken.close()
        app_file.write_text(app_file.read_text() + "# saved\n")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            _worker(client, 30)
        assert _commits_counted(metrics, 1) == 1
    finally:
        taken.close()
        _end(server)
