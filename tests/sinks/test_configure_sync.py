"""``configure()`` from synchronous code: on a ``BusThread``'s bus, closed with ``with`` or
``close()``, with real sinks (a JSON-lines file, OpenTelemetry's in-memory exporter and reader)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, BusThread, InvalidValueError, OperationFinished, Telemetry
from ckpt_events.sinks import configure, read_events
from tests.sinks.helpers import metric_points

THREADS = 4
PER_THREAD = 100


def _work(tel: Telemetry, worker: int) -> None:
    for n in range(PER_THREAD):
        with tel.operation("commit", checkpoint_id=f"c{worker}-{n}") as op:
            with op.step("write"):
                pass
            op.set(records=1)


def test_configure_from_sync_code_exports_every_span_and_line_once(tmp_path: Path) -> None:
    """configure() called from a plain thread subscribes on the bus's loop; threads emit; leaving
    the blocks exports each operation once as a span, once as lines, and the meter provider it
    built is shut down."""
    path = tmp_path / "events.jsonl"
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    with (
        BusThread() as bus,
        configure(bus, jsonl_path=path, span_exporter=exporter, metric_readers=[reader]) as configured,
    ):
        assert [s.name for s in configured.subscriptions] == ["jsonl", "otel-spans", "otel-metrics"]
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda w: _work(tel, w), range(THREADS)))
    total = THREADS * PER_THREAD
    spans = [s.name for s in exporter.get_finished_spans()]
    assert spans.count("gym.checkpoint.commit") == total
    assert spans.count("gym.checkpoint.write") == total
    finished = [e.checkpoint_id for _, e in read_events(path) if isinstance(e, OperationFinished)]
    assert len(set(finished)) == len(finished) == total
    assert configured.meter_provider is not None
    assert configured.meter_provider._shutdown  # noqa: SLF001 (the SDK has no public getter)
    assert [t for t in threading.enumerate() if t.name == "ckpt-events-bus"] == []


def test_metrics_recorded_from_threads_reach_the_reader() -> None:
    """The metric sink configured from sync code records every operation of every thread."""
    reader = InMemoryMetricReader()
    runner = BusThread()
    with runner as bus, configure(bus, metric_readers=[reader], span_groups="default"):
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda w: _work(tel, w), range(THREADS)))
        assert runner.call(bus.flush, 5.0)
        points = metric_points(reader)
    _, by_attributes = points["gym.checkpoint.records_total"]
    assert list(by_attributes.values()) == [THREADS * PER_THREAD]


def test_close_on_the_bus_s_own_loop_thread_says_to_await_aclose() -> None:
    """Configured.close() on the loop running its bus would block that loop: refused, in one line."""
    runner = BusThread()
    with runner as bus:
        configured = configure(bus, jsonl_path=None, environ={"CKPT_EVENTS_STALL_AFTER": "30"})
        with pytest.raises(InvalidValueError, match=r"await configured.aclose\(\)"):
            runner.call(configured.close)
        configured.close()
        configured.close()  # idempotent
        assert configured.subscriptions[0].closed


def test_close_of_a_bus_never_started_delivers_and_closes_every_sink(tmp_path: Path) -> None:
    """A script that never started its bus: leaving ``with configure(...)`` (``close()``) runs the
    sinks in an event loop of its own, as ``await aclose()`` does, so every line is written and
    every span exported. It raised InvalidValueError, with 0 lines written and nothing closed."""
    path = tmp_path / "events.jsonl"
    spans = InMemorySpanExporter()
    bus = Bus()
    with configure(bus, jsonl_path=path, span_exporter=spans) as configured:
        with Telemetry(bus, kind="environment", instance="env-0").operation("commit", checkpoint_id="c1"):
            pass
    assert [type(e).__name__ for _, e in read_events(path)] == ["OperationStarted", "OperationFinished"]
    assert [span.name for span in spans.get_finished_spans()] != []
    assert configured.jsonl_sink is not None and configured.jsonl_sink._closed
    assert all(row.delivered == row.emitted and row.pending == 0 for row in bus.stats().sinks)
    configured.close()  # idempotent
    anyio.run(bus.aclose)  # the bus's own close has nothing left to do
    assert len(list(read_events(path))) == 2


def test_close_of_a_bus_never_started_ends_the_export_child_with_every_event_written(
    tmp_path: Path,
) -> None:
    """The same with ``export_process=True``: the child gets every event and has exited when
    ``close()`` returns (it was refused, the child left running and the log empty)."""
    path = tmp_path / "events.jsonl"
    bus = Bus()
    configured = configure(bus, jsonl_path=path, export_process=True)
    process = configured.export_process
    assert process is not None
    tel = Telemetry(bus, kind="environment", instance="env-0")
    for i in range(5):
        with tel.operation("commit", checkpoint_id=f"c{i}"):
            pass
    configured.close()
    assert len(list(read_events(path))) == 10
    stats = process.stats()
    assert (stats.forwarded, stats.dropped, stats.exit_code) == (10, 0, 0)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_close_inside_async_code_of_a_bus_never_started_says_to_await_aclose(
    tmp_path: Path, backend: str
) -> None:
    """``close()`` on a thread running an event loop would block it: refused in one line naming
    ``await configured.aclose()``, which then writes every line (nothing was lost by the refusal)."""
    path = tmp_path / "events.jsonl"

    async def main() -> None:
        bus = Bus()
        configured = configure(bus, jsonl_path=path)
        Telemetry(bus, kind="judge", instance="judge-0").refused("unauthorized")
        with pytest.raises(InvalidValueError, match=r"await configured.aclose\(\)"):
            configured.close()
        await configured.aclose()

    anyio.run(main, backend=backend)
    assert [type(e).__name__ for _, e in read_events(path)] == ["Refused"]


def test_closing_after_the_bus_thread_ended_finishes_the_close(tmp_path: Path) -> None:
    """A Configured closed after its BusThread (the `with` order reversed) still closes: its
    sinks were closed by the bus, and close() returns."""
    path = tmp_path / "events.jsonl"
    with BusThread() as bus:
        configured = configure(bus, jsonl_path=path)
        Telemetry(bus, kind="judge", instance="judge-0").refused("unauthorized")
    configured.close()
    assert [type(e).__name__ for _, e in read_events(path)] == ["Refused"]


def test_a_configured_left_open_is_closed_with_its_bus_thread() -> None:
    """A sync server's `configure(bus)` beside `BusThread().start()` is never closed by hand: the
    bus's close closes it after its sinks, so the meter provider got every operation and is shut
    down (its export thread gone), and the Prometheus endpoint's thread and port are freed. They
    outlived runner.close() (two threads and the port left)."""
    before = set(threading.enumerate())
    reader = InMemoryMetricReader()
    environ = {
        "OTEL_METRICS_EXPORTER": "console,prometheus",
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    runner = BusThread()
    bus = runner.start()
    configured = configure(bus, environ=environ, metric_readers=[reader], span_groups="default")
    assert configured.prometheus is not None and configured.meter_provider is not None
    port = configured.prometheus.port
    tel = Telemetry(bus, kind="judge", instance="judge-0")
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda w: _work(tel, w), range(THREADS)))
    runner.close()
    assert configured.meter_provider._shutdown  # noqa: SLF001 (the SDK has no public getter)
    assert _ours_left(before, port) == []
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
    configured.close()  # closed already: returns
    _, by_attributes = metric_points(reader)["gym.checkpoint.records_total"]
    assert list(by_attributes.values()) == [THREADS * PER_THREAD]


def _ours_left(before: set[threading.Thread], port: int) -> list[str]:
    """The meter provider's export thread and the scrape endpoint's, if still running after 2 s
    (a loaded machine's thread may take a moment to end; theirs never did)."""
    names = {"OtelPeriodicExportingMetricReader", f"ckpt-events-prometheus-{port}", "ckpt-events-bus"}
    deadline = time.monotonic() + 2.0
    while True:
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive() and t.name in names]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


AT_EXIT = """
import sys
from ckpt_events import BusThread, Telemetry, sinks

bus = BusThread().start()  # a WSGI module's globals: nothing closed by hand
sinks.configure(bus, environ={"OTEL_METRICS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": "60000"})
tel = Telemetry(bus, kind="judge", instance="judge-0")
for n in range(10):
    with tel.operation("commit", checkpoint_id=f"c{n}"):
        pass
"""


def test_metrics_of_a_never_closed_bus_thread_are_exported_at_exit() -> None:
    """At exit the bus drains into the meter provider before it exports and shuts down: its own
    atexit handler ran first, and none of the 10 operations was exported (said in a warning)."""
    result = subprocess.run(
        [sys.executable, "-c", AT_EXIT],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert result.returncode == 0, result.stderr
    assert "was shut down" not in result.stderr
    exported = json.loads(result.stdout)["resource_metrics"][0]["scope_metrics"][0]["metrics"]
    duration = next(m for m in exported if m["name"] == "gym.checkpoint.operation_duration_ms")
    assert [p["count"] for p in duration["data"]["data_points"]] == [10]
