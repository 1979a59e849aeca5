"""A metric exporter built by configure() exports only in its own process
(``ckpt_events.sinks.otel._this_process``): a forked child's copy of the meter provider holds the
parent's totals, and OpenTelemetry's reader restarts its export thread in the child."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

# A server with console metrics every 100 ms forks a worker that emits nothing and lives 1.5 s.
SERVER = """
import multiprocessing, sys, time, warnings

from ckpt_events import BusThread, Telemetry, sinks

warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
environ = {
    "OTEL_METRICS_EXPORTER": "console",
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRIC_EXPORT_INTERVAL": "100",
}
with BusThread() as bus, sinks.configure(bus, environ=environ):
    tel = Telemetry(bus, kind="judge", instance="judge-0")
    for n in range(10):
        with tel.operation("commit", checkpoint_id=f"c{n}"):
            pass
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(1.5,))
    child.start()
    child.join(20)
    print("child exit", child.exitcode, file=sys.stderr)
"""


def test_a_forked_child_does_not_export_the_parents_metrics() -> None:
    """Every exported point comes from the parent (one ``service.instance.id``); the child used to
    export the parent's 10 commits every interval under an id of its own (9 times in 3 s)."""
    done = subprocess.run(
        [sys.executable, "-c", SERVER],
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child exit 0" in done.stderr
    senders = Counter(re.findall(r'"service\.instance\.id": "([^"]+)"', done.stdout))
    assert len(senders) == 1, senders
    assert sum(senders.values()) >= 5  # the parent went on exporting while the child lived
