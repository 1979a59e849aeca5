"""A user's instrumented app under ``uvicorn --workers 2``: real processes, as docs/fastapi.md's
"Several worker processes" describes them.

Both workers append to one JSON-lines file and no line is lost or torn; a fixed Prometheus port
fails the second worker's startup with the error that says why (it cannot bind it), uvicorn
0.50 and later stop the server then (an older one is stopped by the test), and nothing is left
running.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from ckpt_events.benchmarks.load import listening, stop_process
from ckpt_events.benchmarks.rotel import free_ports
from tests.processes import alive

pytestmark = pytest.mark.slow

APP = """
import os

from fastapi import FastAPI, Request

from ckpt_events.participants.fastapi import instrument, operation

app = FastAPI()
instrument(app, kind="judge", instance="judge-0", jsonl_path="events.jsonl")


@app.post("/commit")
async def commit(request: Request) -> dict[str, int]:
    with operation(request, "commit", checkpoint_id="c1") as op:
        op.set(records=1)
    return {"pid": os.getpid()}
"""
REQUESTS = 400
DOCS = Path(__file__).parents[2] / "docs" / "fastapi.md"


def _uvicorn(project: Path, port: int, env: dict[str, str], workers: int = 2) -> subprocess.Popen[str]:
    (project / "userapp.py").write_text(APP)
    command = [sys.executable, "-m", "uvicorn", "userapp:app", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*command, "--workers", str(workers)],
        cwd=project,
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_workers_share_one_log_and_lose_no_line(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    server = _uvicorn(tmp_path, port, {})
    try:
        assert listening(server, port, 30), "uvicorn did not listen"
        pids = set()
        # A connection each (none kept alive): both workers accept on the one socket. One client
        # for them all: a client each built an SSL context each, 0.2 s a request under load.
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, limits=no_keepalive) as client:
            for _ in range(REQUESTS):
                reply = client.post("/commit")
                assert reply.status_code == 200
                pids.add(reply.json()["pid"])
        server.send_signal(signal.SIGINT)  # Ctrl-C: each worker drains its bus and closes the file
        output, _ = server.communicate(timeout=30)
    finally:
        stop_process(server)  # only if the test failed before
    assert server.returncode == 0, output[-2000:]
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    kinds = [msgspec.json.decode(line)["type"] for line in lines]  # a torn line would not decode
    assert kinds.count("operation_started") == kinds.count("operation_finished") == REQUESTS
    assert len(pids) == 2  # both workers answered, so both wrote to the one file


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


#: uvicorn's supervisor stops the parent when a worker fails its startup from 0.50 on; before, it
#: restarted that worker again and again (0.30 to 0.49) or served on without it (0.29).
UVICORN_STOPS_AT_A_FAILED_STARTUP = _release(importlib.metadata.version("uvicorn")) >= (0, 50)


def _output_until(server: subprocess.Popen[str], needle: str, seconds: float) -> str:
    """``server``'s output until it exits, or (the server still running) until ``needle`` is in it
    and then until it exits on SIGINT; at most ``seconds`` for each."""
    assert server.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stdout or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + seconds
    while server.poll() is None and time.monotonic() < deadline and needle not in "".join(lines):
        time.sleep(0.1)
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=seconds)
    reader.join(timeout=seconds)
    server.stdout.close()
    return "".join(lines)


def test_a_fixed_prometheus_port_stops_the_server_saying_why(tmp_path: Path) -> None:
    port, metrics = free_ports(2)
    environ = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics),
    }
    server = _uvicorn(tmp_path, port, environ)
    try:
        if UVICORN_STOPS_AT_A_FAILED_STARTUP:
            output, _ = server.communicate(timeout=60)
        else:  # the server goes on: stopped here once the worker said why
            output = _output_until(server, "cannot serve Prometheus metrics", 60)
    finally:
        stop_process(server)
    # The server stopped (uvicorn's supervisor ends when a worker fails its startup, from 0.50;
    # it exits 0 then, its own choice) and said why.
    assert f"cannot serve Prometheus metrics on 127.0.0.1:{metrics} (Address already in use)" in output, (
        output[-3000:]
    )
    assert "under uvicorn --workers N or gunicorn -w N, set CKPT_EVENTS_PROMETHEUS_PORTS=N too" in output
    # In one line, not the lifespan's traceback (20 lines per worker, the cause on the last).
    assert "Traceback" not in output, output[-3000:]
    said = [line for line in output.splitlines() if "cannot serve Prometheus metrics" in line]
    assert all(line.startswith("ERROR:    ckpt-events: cannot serve") for line in said), said
    # Nothing left running: every worker uvicorn said it started has ended.
    workers = [int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", output)]
    assert workers, output[-3000:]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 (at most 50 tries)."""
    for _ in range(50):
        (first,) = free_ports(1)
        if first + count > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for candidate in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        return first
    raise AssertionError(f"no {count} consecutive free ports")


def _operations(url: str) -> int:
    """The commits a worker's scrape page counts (its duration histogram's ``_count``)."""
    page = httpx.get(url, timeout=5).text
    found = re.search(r"^gym_checkpoint_operation_duration_ms_milliseconds_count\{.*\} (\S+)$", page, re.M)
    return 0 if found is None else int(float(found.group(1)))


@pytest.mark.e2e
def test_a_port_per_worker_serves_every_workers_metrics(tmp_path: Path) -> None:
    """``CKPT_EVENTS_PROMETHEUS_PORTS=4`` under ``uvicorn --workers 4``: each worker serves on a
    port of its own in the range, and the four pages add up to every request served."""
    workers = 4
    (port,) = free_ports(1)
    metrics = _free_run(workers)
    # The variables of docs/fastapi.md's line, its port moved to a free range.
    (line,) = [line for line in DOCS.read_text().splitlines() if "CKPT_EVENTS_PROMETHEUS_PORTS=4 " in line]
    words = shlex.split(line)
    assert words[words.index("--workers") + 1] == str(workers)
    environ = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=\S+", word))
    assert environ.pop("OTEL_EXPORTER_PROMETHEUS_PORT") == "9464"
    environ.update(OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1", OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics))
    server = _uvicorn(tmp_path, port, environ, workers)
    try:
        assert listening(server, port, 30), "uvicorn did not listen"
        urls = [f"http://127.0.0.1:{metrics + i}/metrics" for i in range(workers)]
        deadline = time.monotonic() + 20
        while not all(listening(server, metrics + i, 0.1) for i in range(workers)):
            assert time.monotonic() < deadline, "not every worker serves its metrics"
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, limits=no_keepalive) as client:
            for _ in range(REQUESTS // 4):
                assert client.post("/commit").status_code == 200
        # A worker hands its batch to the sink within the bus's interval: read until they add up.
        counts = [_operations(url) for url in urls]
        while sum(counts) < REQUESTS // 4 and time.monotonic() < deadline:
            time.sleep(0.1)
            counts = [_operations(url) for url in urls]
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    finally:
        stop_process(server)
    assert sum(counts) == REQUESTS // 4, (counts, output[-2000:])
    assert server.returncode == 0, output[-2000:]
    assert "Traceback" not in output
