"""A user's instrumented app under real uvicorn, stopped by Ctrl-C (SIGINT to the whole process
group, as a terminal sends it) while ``instrument()``'s lifespan starts its export process.

uvicorn holds the signal until the startup ends, then shuts down in order: the server exits 0
with uvicorn's lines and no traceback, and nothing of its session (the export process included)
is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckpt_events.benchmarks.rotel import free_port
from tests.processes import alive

APP = """
from fastapi import FastAPI

from ckpt_events.participants.fastapi import instrument

app = FastAPI()
instrument(app, kind="judge", instance="judge-0", jsonl_path="events.jsonl")
"""
#: Enough for the export process's start (0.26-0.48 s measured) and the shutdown that follows.
EXIT_SECONDS = 8.0


def _session(sid: int) -> list[int]:
    """The pids of the live processes in session ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid and alive(int(entry.name)):
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def test_a_ctrl_c_while_the_export_process_starts_ends_the_server_and_its_child(tmp_path: Path) -> None:
    """Ctrl-C during the lifespan's startup: exit 0 within seconds, no traceback, no orphan."""
    (tmp_path / "userapp.py").write_text(APP)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "userapp:app", "--host", "127.0.0.1", "--port", str(free_port())],
        cwd=tmp_path,
        env={**clean, "CKPT_EVENTS_EXPORT_PROCESS": "true", "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        printed = []
        for line in server.stdout:  # bounded: the server prints a handful of lines, then waits
            printed.append(line)
            if "Waiting for application startup" in line:
                break
        time.sleep(0.05)  # inside the export process's start
        os.killpg(server.pid, signal.SIGINT)
        started = time.monotonic()
        rest, _ = server.communicate(timeout=EXIT_SECONDS)
        took = time.monotonic() - started
        deadline = time.monotonic() + 2.0
        while _session(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _session(server.pid)
    finally:
        if server.poll() is None or _session(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)
    out = "".join(printed) + rest
    assert server.returncode == 0, out
    assert took < EXIT_SECONDS
    assert "Traceback" not in out, out
    assert "Application shutdown complete." in out, out
    assert left == [], f"left running in the server's session: {left}"
