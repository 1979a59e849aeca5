"""A ``configure()`` that fails leaves nothing running: no export thread, no periodic metric
reader, no open JSON-lines file, no export process.

Before, the error was raised but what had been built kept going for the life of the process:
with the Prometheus port taken, the SDK's periodic reader went on exporting to the console
every interval; on a closed bus, the OTLP sinks' two threads too; with ``export_process=True``,
the child process, its input held open.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from ckpt_events import Bus, CkptEventsError, ConfigurationError
from ckpt_events.benchmarks.load import children_pids
from ckpt_events.sinks import configure

#: The threads configure()'s sinks start: our OTLP sinks' and the SDK's periodic metric reader.
THREADS = {"ckpt-events-otlp", "ckpt-events-otlp-metrics", "OtelPeriodicExportingMetricReader"}
EVERYTHING = {
    "OTEL_TRACES_EXPORTER": "otlp,console",
    "OTEL_METRICS_EXPORTER": "console,otlp,prometheus",
    "OTEL_METRIC_EXPORT_INTERVAL": "200",
    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
}


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _ours(before: set[threading.Thread]) -> set[str]:
    """The sinks' threads started since ``before`` and still running."""
    return {thread.name for thread in set(threading.enumerate()) - before} & THREADS


def _open_files() -> set[str]:
    fds = Path("/proc/self/fd")
    paths = set()
    for fd in fds.iterdir():
        try:
            paths.add(os.readlink(fd))
        except OSError:  # closed while listed
            pass
    return paths


async def _left(before: set[threading.Thread], seconds: float = 5.0) -> set[str]:
    """The sinks' threads started since ``before`` still running once ``seconds`` have passed
    (a stopped thread takes a moment to return)."""
    deadline = time.monotonic() + seconds
    while _ours(before) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    return _ours(before)


async def test_a_taken_prometheus_port_leaves_no_thread_and_no_open_log(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(threading.enumerate())
    log = tmp_path / "events.jsonl"
    environ = {**EVERYTHING, "OTEL_EXPORTER_PROMETHEUS_PORT": str(taken_port)}
    async with Bus() as bus:
        started = time.monotonic()
        # The port a sibling worker process took (uvicorn --workers) is the common case.
        hint = r"Address already in use.*gunicorn -w N, set CKPT_EVENTS_PROMETHEUS_PORTS=N"
        with pytest.raises(ConfigurationError, match=f"cannot serve Prometheus metrics.*{hint}"):
            configure(bus, otlp_endpoint="http://127.0.0.1:9", jsonl_path=log, environ=environ)
        assert time.monotonic() - started < 5  # no export waited for
        assert str(log) not in _open_files()
        assert await _left(before) == set()
        await anyio.sleep(0.5)  # two of the reader's intervals: it exported nothing more
    assert "resource_metrics" not in capsys.readouterr().out


async def test_a_closed_bus_leaves_no_thread_and_no_open_log(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        pass
    with pytest.raises(CkptEventsError, match="this bus is closed"):
        configure(bus, otlp_endpoint="http://127.0.0.1:9", jsonl_path=log, environ=EVERYTHING)
    assert str(log) not in _open_files()
    assert await _left(before) == set()


async def test_a_closed_bus_leaves_no_export_process(tmp_path: Path) -> None:
    async with Bus() as bus:
        pass
    before = set(children_pids(os.getpid()))
    with pytest.raises(CkptEventsError, match="this bus is closed"):
        configure(bus, jsonl_path=tmp_path / "events.jsonl", environ={}, export_process=True)
    assert set(children_pids(os.getpid())) - before == set()


async def test_the_callers_own_parts_stay_the_callers(tmp_path: Path) -> None:
    """A span exporter passed in is not shut down by a failed configure(): it is the caller's."""
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        pass
    with pytest.raises(CkptEventsError, match="this bus is closed"):
        configure(bus, span_exporter=exporter, span_groups="checkpoint", environ={})
    assert exporter.export([]) is SpanExportResult.SUCCESS  # a shut-down one answers FAILURE


async def test_a_missing_grpc_extra_for_metrics_leaves_nothing_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spans over our OTLP/HTTP sink, metrics to the console and over gRPC without its extra: the
    span sink and the console's reader were built before the gRPC exporter failed. The reader
    warned every interval that it was never registered; the span sink's thread ran on."""
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None:
        pytest.skip("the grpc extra is installed")
    before = set(threading.enumerate())
    log = tmp_path / "events.jsonl"
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "console,otlp",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    }
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=r"ckpt-events\[grpc\]"):
            configure(bus, jsonl_path=log, environ=environ)
        assert str(log) not in _open_files()
        assert await _left(before) == set()
        await anyio.sleep(0.3)  # three of the reader's intervals
    assert "Cannot call collect" not in capsys.readouterr().err
