"""A ``demo --workers 2`` run's logs: every participant operation has its arrival and loop lag.

The main processes' operations always had them (the HTTP middleware and the loop-lag monitor);
the workers' shares of prepare, commit, restore and retire had neither (80 of 108 operations
in a 40-rollout run), so the report could not say where a worker's share queued.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[4]


def test_every_participant_operation_of_a_two_worker_demo_has_received_ns_and_loop_lag(
    tmp_path: Path,
) -> None:
    """The demo's log and each worker process's log (``<log>.w<i>``), every participant operation."""
    log = tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "ckpt_events.participants.cli", "demo", "--workers", "2"]
    argv += [
        "--rollouts",
        "16",
        "--concurrency",
        "8",
        "--workdir",
        str(tmp_path / "work"),
        "--jsonl",
        str(log),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    done = subprocess.run(
        argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    workers = sorted((tmp_path / "work" / "logs").glob("*.w[01]"))
    assert workers, "no worker process wrote a log"
    operations = [
        event
        for path in [log, *workers]
        for event in map(json.loads, path.read_text().splitlines())
        if event["type"] == "operation_finished" and event["kind"] != "controller"
    ]
    shares = {e["operation"] for e in operations if e.get("worker") is not None}
    assert shares >= {"prepare", "commit", "restore", "retire"}, shares
    missing = [e for e in operations if e["received_ns"] is None or e["loop_lag_ms"] is None]
    assert missing == [], f"{len(missing)} of {len(operations)}: {missing[:2]}"
