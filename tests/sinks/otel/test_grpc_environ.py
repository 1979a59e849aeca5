"""OTLP over gRPC (OpenTelemetry's exporters) takes every setting from ``configure(environ=...)``.

The gRPC exporters read ``os.environ`` for any option they are not given: the process's headers
were sent when ``environ`` had none, its bad timeout or compression broke ``configure``, its CA
file replaced ours and its temporality preference replaced ours. A real gRPC server on 127.0.0.1
receives the exports here. Without the grpc extra (``ckpt-events[grpc]``) these tests are skipped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import pytest

from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel._pipeline import FRACTIONAL_TIMEOUT_SINCE, _grpc_exporter_release
from tests.sinks.otlp.test_tls import OPENSSL, Certificates

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None,
    reason="the grpc extra (opentelemetry-exporter-otlp-proto-grpc) is not installed",
)

#: Whether the installed gRPC exporter parses a per-signal timeout with float() (1.35 and later) or
#: with int(), which refused a fraction.
FRACTIONAL_TIMEOUTS = (_grpc_exporter_release() or (0,)) >= FRACTIONAL_TIMEOUT_SINCE

#: What the process's environment says, and ``environ`` never does: none of it may be used.
PROCESS_ENV = {
    "OTEL_EXPORTER_OTLP_HEADERS": "x-from-process=1",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-traces-from-process=1",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-metrics-from-process=1",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "soon",
    # Read as seconds by the exporter: a microsecond, and every export timed out. Before 1.35 it took
    # whole seconds: 0 fell through to the generic timeout above, and "soon" raised.
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.000001" if FRACTIONAL_TIMEOUTS else "0",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "0.000001" if FRACTIONAL_TIMEOUTS else "0",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "zstd",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
}


@pytest.fixture
def polluted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.environ`` holding settings that ``environ`` does not."""
    for name, value in PROCESS_ENV.items():
        monkeypatch.setenv(name, value)


class Received:
    """What the gRPC server got: each call's metadata and request."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.requests: list[Any] = []

    def keep(self, request: Any, context: Any) -> None:
        self.metadata.append({key: value for key, value in context.invocation_metadata()})
        self.requests.append(request)


@contextmanager
def _grpc_collector(certs: Certificates | None = None) -> Iterator[tuple[str, Received]]:
    """A gRPC OTLP server on 127.0.0.1 (TLS with ``certs``' server pair) taking traces and
    metrics; yields its endpoint URL and what it received."""
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received = Received()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            received.keep(request, context)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            received.keep(request, context)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    if certs is None:
        port = server.add_insecure_port("127.0.0.1:0")
        scheme = "http"
    else:
        pair = (certs.server_key.read_bytes(), certs.server.read_bytes())
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
        scheme = "https"
    server.start()
    try:
        yield f"{scheme}://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None).wait(5)


async def _one_operation(environ: dict[str, str]) -> None:
    async with Bus() as bus:
        async with configure(bus, environ=environ):
            with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                pass


@pytest.mark.parametrize("headers", ["x-ours=1", None])
async def test_span_export_takes_environ_only(polluted: None, headers: str | None) -> None:
    """Headers, timeout and compression come from ``environ``: ours alone are sent, or none when
    ``environ`` has none (the process's were sent); the process's bad generic timeout and
    compression raised out of ``configure``, its per-signal timeout timed every export out."""
    with _grpc_collector() as (endpoint, received):
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRICS_EXPORTER": "none",
        }
        if headers is not None:
            environ["OTEL_EXPORTER_OTLP_HEADERS"] = headers
        await _one_operation(environ)
    assert len(received.requests) == 1
    (metadata,) = received.metadata
    assert not any(key.endswith("from-process") for key in metadata), metadata
    assert ("x-ours" in metadata) == (headers is not None)
    assert metadata.get("grpc-encoding", "identity") == "identity"


async def test_the_metric_exporter_takes_environ_s_temporality(polluted: None) -> None:
    """Unset in ``environ``, the temporality is cumulative (the spec's default): the process's
    ``delta`` was taken, and headers come from ``environ`` too."""
    with _grpc_collector() as (endpoint, received):
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-ours=1",
        }
        await _one_operation(environ)
    assert received.requests
    histograms = [
        metric.histogram
        for request in received.requests
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.HasField("histogram")
    ]
    assert histograms  # the operation's duration
    cumulative = 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
    assert {found.aggregation_temporality for found in histograms} == {cumulative}
    assert all(
        "x-ours" in metadata and "x-metrics-from-process" not in metadata for metadata in received.metadata
    )


@pytest.mark.skipif(OPENSSL is None, reason="no openssl command to make the test certificates with")
async def test_the_ca_file_comes_from_environ(
    polluted: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``environ``'s CA verifies the TLS collector, not the process's file (which the exporter
    read instead: a CA that did not sign the collector, and the handshake failed)."""
    certs = Certificates(tmp_path_factory.mktemp("grpc-tls"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(certs.client))  # not the collector's CA
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", str(certs.client))
    with _grpc_collector(certs) as (endpoint, received):
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(certs.server),
        }
        await _one_operation(environ)
    assert len(received.requests) == 1


@pytest.mark.parametrize("signal", ["TRACES", "METRICS"])
async def test_a_process_timeout_the_exporter_reads_itself_is_one_line(
    signal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter parses ``os.environ``'s per-signal timeout whatever it is given: a bad one is a
    ConfigurationError naming it and saying where it was read, not the exporter's ValueError."""
    monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT", "soon")
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    async with Bus() as bus:
        with pytest.raises(ConfigurationError) as info:
            configure(bus, environ=environ)
    message = str(info.value)
    assert f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT" in message and "process environment" in message
    assert "\n" not in message


@pytest.mark.parametrize("signal", ["TRACES", "METRICS"])
async def test_a_fractional_process_timeout_is_refused_only_where_the_exporter_takes_whole_seconds(
    signal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 1.35 the exporter parsed ``os.environ``'s per-signal timeout with ``int()``: a fraction
    (0.5) is a ConfigurationError naming it, the exporter's version and the fix (it was the
    exporter's bare ValueError out of configure); from 1.35 it is a number like any other, and
    ``environ``'s timeout is the one used."""
    monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT", "0.5")
    with _grpc_collector() as (endpoint, received):
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        if FRACTIONAL_TIMEOUTS:
            await _one_operation(environ)
            assert received.requests
            return
        async with Bus() as bus:
            with pytest.raises(ConfigurationError) as info:
                configure(bus, environ=environ)
    message = str(info.value)
    assert f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT='0.5' in the process environment" in message
    assert "whole number of seconds" in message and "1.35 or later" in message
    assert "\n" not in message and not received.requests
