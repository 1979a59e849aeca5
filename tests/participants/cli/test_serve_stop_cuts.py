"""What a stop of ``serve`` cuts, and how it is said: what a client whose request it cut receives,
and a worker that cannot say what it cut. Real servers, real clients."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from ckpt_events.participants.server.limits import STOP_CUT_CODE
from tests.participants.cli.sessions import session, wait_for

pytestmark = pytest.mark.e2e

TOKEN = "signal-test-token"


def test_a_request_cut_at_the_shutdown_deadline_is_answered_503_and_closed(tmp_path: Path) -> None:
    """A SIGTERM while ``/work/advance`` runs an 8 s step: the step is cut at the 2 s shutdown
    deadline. Its client got 500 "Internal Server Error" (uvicorn's answer to an app that
    raised), read as the handler's own failure; now 503 with ``Connection: close`` and an
    error body saying the server's stop cut it. The stop's one line is unchanged."""
    token = write_token_file(tmp_path / "token", TOKEN)
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token), "--step-seconds", "8"]
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    replies: list[httpx.Response] = []
    episode = {"rollout_id": "r1", "attempt": 1}
    headers = {"authorization": f"Bearer {TOKEN}"}
    started: list[httpx.Response] = []

    def start(client: httpx.Client) -> bool:
        with contextlib.suppress(httpx.TransportError):
            started.append(client.post("/work/start", json={**episode, "steps": 3}))
        return bool(started)

    with session(argv, tmp_path, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=20) as client:
            wait_for(lambda: proc.poll() is not None or start(client), 30, "serve to serve")
            assert proc.poll() is None, "serve ended before it served"
            assert started[0].status_code == 200, started[0].text
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
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    workers: list[int] = []
    headers = {"authorization": f"Bearer {TOKEN}"}

    def served(client: httpx.Client) -> bool:
        with contextlib.suppress(httpx.TransportError):
            status = client.get("/ng-control/v1/checkpoint/status").json()
            return len(status["workers"]) == 2 and all(w["connected"] and w["url"] for w in status["workers"])
        return False

    with session(argv, tmp_path, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=5) as client:
                wait_for(
                    lambda: proc.poll() is not None or served(client), 30, "serve and its workers to serve"
                )
                assert proc.poll() is None, "serve ended before it served"
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
    assert proc.returncode == 130, err
    assert re.fullmatch(
        r"ckpt-events serve: interrupted; worker [01] did not say what its own port cut \(not counted\)\n",
        err,
    ), err
    assert left == []
