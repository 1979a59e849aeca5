"""docs/library.md's gunicorn example, run for real: two sync workers, each with a BusThread
and a JSON-lines sink, a few hundred requests, then SIGTERM to the master."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ckpt_events import OperationFinished
from ckpt_events.participants.cli.fleet import free_port
from ckpt_events.sinks import read_events
from tests.readme_pages import DOCS, ROOT, blocks

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn is not installed"),
]

REQUESTS = 300
GRACEFUL_TIMEOUT = 10.0  # the example's gunicorn.conf.py


def _block(first_line: str) -> str:
    (code,) = [b.code for b in blocks(DOCS / "library.md", "python") if b.code.startswith(first_line)]
    return code


def _wait_ready(url: str, proc: subprocess.Popen[str], seconds: float) -> int:
    """How many of the requests sent may have reached the app: the answered one, and each that
    timed out after connecting (under load one took over 1 s and was logged as well)."""
    deadline = time.monotonic() + seconds
    reached = 1
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return reached
        except TimeoutError:
            reached += 1
        except urllib.error.URLError as exc:
            reached += isinstance(exc.reason, TimeoutError)
            time.sleep(0.05)
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"gunicorn did not answer {url} within {seconds} s")


def _workers(master: int, count: int, seconds: float) -> list[int]:
    """The master's ``count`` worker pids, once it has forked them all (one worker may answer
    before the master forks the next: under load it did)."""
    deadline = time.monotonic() + seconds
    while True:
        children = [int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split()]
        if len(children) >= count or time.monotonic() >= deadline:
            return children
        time.sleep(0.05)


def test_gunicorn_sync_workers_log_every_request_and_stop_on_sigterm(tmp_path: Path) -> None:
    """Every request's four events are in its worker's log after SIGTERM to the master, which
    exits 0 well within graceful_timeout, its workers gone."""
    (tmp_path / "wsgi_app.py").write_text(_block("# wsgi_app.py"))
    (tmp_path / "gunicorn.conf.py").write_text(_block("# gunicorn.conf.py"))
    port = free_port()
    command = ["-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{port}", "wsgi_app:app"]
    workers: list[int] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *command],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        reached = _wait_ready(f"http://127.0.0.1:{port}/ready", proc, 5.0)
        workers = _workers(proc.pid, 2, 5.0)
        assert len(workers) == 2, workers

        def commit(n: int) -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/c{n}", timeout=5) as response:
                return bytes(response.read())

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(commit, range(REQUESTS))) == {b"ok"}
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=GRACEFUL_TIMEOUT + 5)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:  # failed: nothing of it left running
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert took < GRACEFUL_TIMEOUT / 2
    assert [pid for pid in workers if Path(f"/proc/{pid}").exists()] == []
    logs = sorted(tmp_path.glob("events-*.jsonl"))
    assert len(logs) == 2
    events = [event for log in logs for _, event in read_events(log)]
    finished = [e.checkpoint_id for e in events if isinstance(e, OperationFinished)]
    ready = finished.count("ready")
    assert 1 <= ready <= reached, (ready, reached)
    assert sorted(c for c in finished if c != "ready") == sorted(f"c{n}" for n in range(REQUESTS))
    assert len(events) == 4 * (REQUESTS + ready)  # per request: the operation and its step
    assert "Traceback" not in output
