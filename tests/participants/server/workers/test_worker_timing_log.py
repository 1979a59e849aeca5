"""A ``demo --workers 2`` run's logs: every participant operation has its arrival and loop lag.

The main processes' operations always had them (the HTTP middleware and the loop-lag monitor);
the workers' shares of prepare, commit, restore and retire had neither (80 of 108 operations
in a 40-rollout run), so the report could not say where a worker's share queued.
"""

from __future__ import annotations

import json

import pytest

from tests.participants.demo_runs import DemoRun

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_every_participant_operation_of_a_two_worker_demo_has_received_ns_and_loop_lag(
    two_worker_demo: DemoRun,
) -> None:
    """The demo's log and each worker process's log (``<log>.w<i>``), every participant operation."""
    log = two_worker_demo.log
    workers = sorted((two_worker_demo.workdir / "logs").glob("*.w[01]"))
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
