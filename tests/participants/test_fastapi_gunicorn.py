"""A user's app under gunicorn with uvicorn workers: real processes on 127.0.0.1.

``--preload`` imports the app in gunicorn's master before it forks the workers; an app that
calls ``configure()`` at import (rather than letting ``instrument()`` do it in each worker's
lifespan) configured its OTLP sinks in the master, whose export threads no worker has.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ckpt_events.benchmarks.load import listening, stop_process
from ckpt_events.benchmarks.rotel import free_ports

pytest.importorskip("gunicorn")
pytestmark = pytest.mark.e2e

# The common mistake: the sinks configured at import, the bus handed to instrument().
CONFIGURED_AT_IMPORT = """
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from ckpt_events import Bus
from ckpt_events.participants.fastapi import instrument, operation
from ckpt_events.sinks import configure

bus = Bus()
configured = configure(bus)  # at import: in gunicorn's master under --preload


@asynccontextmanager
async def lifespan(app):
    async with bus:
        yield


app = FastAPI(lifespan=lifespan)
instrument(app, bus=bus, kind="judge", instance="judge-0")


@app.post("/commit")
async def commit(request: Request) -> dict[str, int]:
    with operation(request, "commit", checkpoint_id="c1"):
        pass
    return {"pid": os.getpid()}
"""
WORKERS = 2
REQUESTS = 40


def _gunicorn(project: Path, port: int, environ: dict[str, str]) -> subprocess.Popen[str]:
    (project / "userapp.py").write_text(CONFIGURED_AT_IMPORT)
    command = [sys.executable, "-m", "gunicorn", "--preload", "-k", "uvicorn.workers.UvicornWorker"]
    return subprocess.Popen(
        [*command, "-w", str(WORKERS), "-b", f"127.0.0.1:{port}", "userapp:app"],
        cwd=project,
        env={**os.environ, **environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _served(project: Path, port: int, environ: dict[str, str], limits: httpx.Limits | None = None) -> str:
    """What gunicorn (``--preload``, the app configured at import) on ``port`` wrote, serving
    ``REQUESTS`` commits, then stopped by SIGTERM (and ended cleanly)."""
    server = _gunicorn(project, port, environ)
    try:
        assert listening(server, port, 30), "gunicorn did not listen"
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=10, limits=limits or httpx.Limits()
        ) as client:
            for _ in range(REQUESTS):
                assert client.post("/commit").status_code == 200
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    finally:
        stop_process(server)
    assert server.returncode == 0, output[-3000:]
    return output


def test_otlp_configured_before_the_fork_says_why_each_worker_drops(tmp_path: Path) -> None:
    """Every worker says once, at its first batch, that its spans are dropped and why; the
    server serves and stops as before (the spans used to be lost saying only "0 exported")."""
    port, collector = free_ports(2)
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector}"}
    # No keep-alive: each request may land on either worker.
    output = _served(tmp_path, port, environ, httpx.Limits(max_keepalive_connections=0))
    said = [line for line in output.splitlines() if "was forked from the one that configured it" in line]
    # One line per worker that served (each for its spans; its metric sink says it too).
    span_lines = [line for line in said if line.startswith("OTLP span export")]
    assert 1 <= len(span_lines) <= WORKERS, output[-3000:]
    assert "call configure() in each process after the fork" in span_lines[0]
    assert "Traceback" not in output


def test_prometheus_configured_before_the_fork_says_the_scrape_misses_the_workers(tmp_path: Path) -> None:
    """The master binds the port and serves its own totals, none of the workers' commits: each
    worker says so once (it used to say nothing while every scrape showed no commit)."""
    port, metrics = free_ports(2)
    environ = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics),
    }
    output = _served(tmp_path, port, environ)
    said = [line for line in output.splitlines() if line.startswith("PrometheusSink: this process")]
    assert 1 <= len(said) <= WORKERS, output[-3000:]
    assert "call configure() in each process after the fork" in said[0]
