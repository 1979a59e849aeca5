"""docs/fastapi.md's app with a ``prometheus_client`` multiprocess ``/metrics`` of its own, under
``uvicorn --workers 2``: real processes, a real multiprocess folder, a worker ended and respawned."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from ckpt_events.benchmarks.load import listening, stop_process
from ckpt_events.benchmarks.rotel import free_ports
from tests.participants.test_fastapi_workers import _free_run, _operations
from tests.processes import alive
from tests.readme_pages import DOCS, blocks

pytest.importorskip("prometheus_client", reason="the multiprocess page is prometheus-client's")
pytestmark = pytest.mark.slow

PAGE = DOCS / "fastapi.md"
(APP,) = [block.code for block in blocks(PAGE, "python") if "MultiProcessCollector(registry)" in block.code]
(LINE,) = [block.code for block in blocks(PAGE, "bash") if "PROMETHEUS_MULTIPROC_DIR=" in block.code]
REQUESTS = 200
WARNING = "ckpt-events: PROMETHEUS_MULTIPROC_DIR is set, but ckpt-events writes none of its metrics"
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)  # a connection each: both workers accept
#: Added to the docs' app: each reply says which worker served it.
PID_HEADER = """

@app.middleware("http")
async def _pid(request, call_next):
    reply = await call_next(request)
    reply.headers["x-pid"] = str(__import__("os").getpid())
    return reply
"""


def _uvicorn(project: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    (project / "app.py").write_text(APP + PID_HEADER)
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_", "PROMETHEUS_"))
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        cwd=project,
        env={**clean, **env, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _commits(client: httpx.Client, count: int) -> Counter[int]:
    """``count`` commits; how many each worker (by pid) served."""
    served: Counter[int] = Counter()
    for _ in range(count):
        reply = client.post("/commit")
        assert reply.status_code == 200
        served[int(reply.headers["x-pid"])] += 1
    return served


def _theirs(client: httpx.Client) -> float:
    """The app's own counter on its multiprocess page, and that page holds none of our series."""
    page = client.get("/metrics").text
    assert "gym_checkpoint_" not in page
    found = re.search(r"^app_commits_total (\S+)$", page, re.M)
    assert found is not None, page
    return float(found.group(1))


def test_unconfigured_metrics_are_said_missing_from_the_multiprocess_page(tmp_path: Path) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set and no metric export: the app's page counts its own
    commits and none of ours, and each worker says why in one warning line."""
    (port,) = free_ports(1)
    folder = tmp_path / "prom"
    folder.mkdir()
    server = _uvicorn(tmp_path, port, {"PROMETHEUS_MULTIPROC_DIR": str(folder)})
    try:
        assert listening(server, port, 30), "uvicorn did not listen"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, limits=NO_KEEPALIVE) as client:
            served = _commits(client, REQUESTS)
            assert _theirs(client) == REQUESTS
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    finally:
        stop_process(server)
    assert len(served) == 2, served  # both workers served, so both had configured
    said = [line for line in output.splitlines() if WARNING in line]
    assert len(said) == 2, output[-3000:]  # one line per worker
    assert all(
        "CKPT_EVENTS_PROMETHEUS_PORTS=N" in line and "OTEL_METRICS_EXPORTER=none" in line for line in said
    )
    assert "Traceback" not in output


def test_the_documented_line_serves_ours_beside_theirs_and_a_respawned_worker_resets(tmp_path: Path) -> None:
    """The docs' command line: the app's multiprocess page counts all its commits, our two
    per-worker pages add up to them exactly, no warning; a worker ended with SIGTERM is respawned
    on its predecessor's port and counts from 0 (their page keeps the dead worker's count)."""
    (port,) = free_ports(1)
    metrics = _free_run(2)
    words = shlex.split(LINE)
    assert words[words.index("--workers") + 1] == "2"
    environ = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=\S+", word))
    assert environ.pop("OTEL_EXPORTER_PROMETHEUS_PORT") == "9464"
    folder = tmp_path / "prom"
    folder.mkdir()
    environ.update(
        PROMETHEUS_MULTIPROC_DIR=str(folder),
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics),
    )
    server = _uvicorn(tmp_path, port, environ)
    urls = [f"http://127.0.0.1:{metrics + i}/metrics" for i in range(2)]

    def ours(expected: int, deadline: float) -> list[int]:
        # A worker hands its batch to the sink within the bus's interval: read until they add up.
        counts = [_operations(url) for url in urls]
        while sum(counts) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            counts = [_operations(url) for url in urls]
        return counts

    try:
        assert listening(server, port, 30), "uvicorn did not listen"
        deadline = time.monotonic() + 20
        while not all(listening(server, metrics + i, 0.1) for i in range(2)):
            assert time.monotonic() < deadline, "not every worker serves its metrics"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, limits=NO_KEEPALIVE) as client:
            served = _commits(client, REQUESTS)
            assert len(served) == 2, served
            assert _theirs(client) == REQUESTS
            before = ours(REQUESTS, time.monotonic() + 10)
            # uvicorn respawns a worker that ended; the new one takes the port the old one left.
            victim = served.most_common(1)[0][0]
            os.kill(victim, signal.SIGTERM)
            first = set(served)
            deadline = time.monotonic() + 30
            while alive(victim):  # no commit meanwhile: one it accepted as it ended goes unanswered
                assert time.monotonic() < deadline, "the worker did not end on SIGTERM"
                time.sleep(0.05)
            for _ in range(300):  # until the respawned worker (a third pid) answers a commit
                served += _commits(client, 1)
                if set(served) - first or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert set(served) - first, f"the ended worker was not replaced: {served}"
            while not all(listening(server, metrics + i, 0.1) for i in range(2)):
                assert time.monotonic() < deadline, "the respawned worker does not serve its metrics"
            served += _commits(client, 20)
            assert _theirs(client) == served.total()  # theirs keeps the dead worker's count
        # Ours: what the live workers served, the victim's commits gone with it (a reset).
        after = ours(served.total() - served[victim], time.monotonic() + 10)
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    finally:
        stop_process(server)
    assert sum(before) == REQUESTS, before
    assert sum(after) == served.total() - served[victim], (after, served)
    assert len(served) == 3, served  # the two first workers and the respawned one
    assert WARNING not in output and "Traceback" not in output, output[-3000:]
