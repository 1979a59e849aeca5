"""What a stop of ``serve`` cuts, and how it is said: what a client whose request it cut receives,
and a worker that cannot say what it cut. Real servers, real clients."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from ckpt_events.participants.server.limits import STOP_CUT_CODE

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = "import sys; from ckpt_events.participants.cli.main import main; sys.exit(main())"
TOKEN = "signal-test-token"


def test_a_request_cut_at_the_shutdown_deadline_is_answered_503_and_closed(tmp_path: Path) -> None:
    """A SIGTERM while ``/work/advance`` runs an 8 s step: the step is cut at the 2 s shutdown
    deadline. Its client got 500 "Internal Server Error" (uvicorn's answer to an app that
    raised), read as the handler's own failure; now 503 with ``Connection: close`` and an
    error body saying the server's stop cut it. The stop's one line is unchanged."""
    token = write_token_file(tmp_path / "token", TOKEN)
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token), "--step-seconds", "8"]
    env = {**os.environ, "CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    replies: list[httpx.Response] = []
    episode = {"rollout_id": "r1", "attempt": 1}
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=20) as client:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, "serve ended before it served"
                assert time.monotonic() < deadline, "serve did not serve within 30 s"
                with contextlib.suppress(httpx.TransportError):
                    started = client.post("/work/start", json={**episode, "steps": 3})
                    break
                time.sleep(0.05)
            assert started.status_code == 200, started.text
            advancing = threading.Thread(
                target=lambda: replies.append(client.post("/work/advance", json=episode))
            )
            advancing.start()
            time.sleep(0.3)  # the step runs: 8 s, past the 2 s deadline
            os.kill(proc.pid, signal.SIGTERM)
            advancing.join(20)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.wait(20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
    [reply] = replies
    assert (reply.status_code, reply.headers.get("connection")) == (503, "close"), reply.text
    assert json.loads(reply.content)["error"]["code"] == STOP_CUT_CODE
    assert (proc.returncode, err) == (
        143,
        "ckpt-events serve: interrupted; at the 2 s shutdown deadline, 1 request in flight was cut "
        "(POST /work/advance)\n",
    )


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def test_a_quiet_stop_with_a_stopped_worker_is_one_line_saying_it_is_not_counted(tmp_path: Path) -> None:
    """``serve --workers 2``, one worker SIGSTOPped, then Ctrl-C with no request in flight: the
    stopped worker cannot say what its own port cut, so the one line says so (not counted, never
    "none"), exit 130, and no process is left (the stopped worker too)."""
    token = write_token_file(tmp_path / "token", TOKEN)
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token), "--workers", "2"]
    env = {**os.environ, "CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    workers: list[int] = []
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=5) as client:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, "serve ended before it served"
                assert time.monotonic() < deadline, "serve and its workers did not serve within 30 s"
                with contextlib.suppress(httpx.TransportError):
                    status = client.get("/ng-control/v1/checkpoint/status").json()
                    if len(status["workers"]) == 2 and all(
                        w["connected"] and w["url"] for w in status["workers"]
                    ):
                        break
                time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGSTOP)
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.wait(20)
        left = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 130, err
    assert re.fullmatch(
        r"ckpt-events serve: interrupted; worker [01] did not say what its own port cut \(not counted\)\n",
        err,
    ), err
    assert left == []
