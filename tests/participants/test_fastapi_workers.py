"""A user's instrumented app under ``uvicorn --workers 2``: real processes, as docs/fastapi.md's
"Several worker processes" describes them.

Both workers append to one JSON-lines file and no line is lost or torn; a fixed Prometheus port
stops the server at startup with the error that says why (the second worker cannot bind it),
and nothing is left running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
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


def _uvicorn(project: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    (project / "userapp.py").write_text(APP)
    command = [sys.executable, "-m", "uvicorn", "userapp:app", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*command, "--workers", "2"],
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


def test_a_fixed_prometheus_port_stops_the_server_saying_why(tmp_path: Path) -> None:
    port, metrics = free_ports(2)
    environ = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics),
    }
    server = _uvicorn(tmp_path, port, environ)
    try:
        output, _ = server.communicate(timeout=60)
    finally:
        stop_process(server)
    # The server stopped (uvicorn's supervisor ends when a worker fails its startup; it exits 0
    # then, its own choice) and said why.
    assert f"cannot serve Prometheus metrics on 127.0.0.1:{metrics} (Address already in use)" in output, (
        output[-3000:]
    )
    assert "each worker process of uvicorn --workers or gunicorn needs a port of its own" in output
    # Nothing left running: every worker uvicorn said it started has ended.
    workers = [int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", output)]
    assert workers, output[-3000:]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]
