"""OpenTelemetry parts from the settings (``ckpt_events.sinks.otel._pipeline``): exporters and metric
readers by name, the resource, and the error naming a missing gRPC extra."""

from __future__ import annotations

import importlib.util

import pytest
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel._env import read_otel_env
from tests.sinks.otel.test_env import BASE


async def test_exporter_names() -> None:
    """OTEL_TRACES_EXPORTER=console and OTEL_METRICS_EXPORTER=none: console spans, no metrics."""
    environ = {**BASE, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            assert [s.name for s in configured.subscriptions] == ["otel-spans"]
            assert configured.span_sink is not None
            assert isinstance(configured.span_sink.exporter, ConsoleSpanExporter)  # type: ignore[union-attr]
    settings = read_otel_env({"OTEL_METRICS_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "none"})
    assert settings.metrics == ("console",) and settings.traces == ()
    from ckpt_events.sinks.otel._pipeline import metric_readers_for

    (reader,) = metric_readers_for(settings)
    try:
        assert isinstance(reader._exporter.inner, ConsoleMetricExporter)  # type: ignore[attr-defined]
    finally:
        # Its export thread runs from the start: left running, it warned "Cannot call collect
        # on a MetricReader until it is registered" into a later test's output.
        reader.shutdown()


async def test_grpc_without_the_extra_names_it() -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: base endpoint used as is; without the extra, an error names it."""
    environ = {**BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None:
        settings = read_otel_env(environ)
        assert settings.traces_otlp is not None and settings.traces_otlp.endpoint == "http://127.0.0.1:4318"
        return
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL.*ckpt-events\[grpc\]"):
            configure(bus, environ=environ)


async def test_resource_is_created_with_an_instance_id() -> None:
    """Resource.create runs (sdk attributes present); service.instance.id set per instance."""
    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        async with configure(bus, span_exporter=exporter, service_instance_id="agent-3", environ={}):
            with Telemetry(bus, kind="agent", instance="agent-3").operation("resume"):
                pass
    (span,) = exporter.get_finished_spans()
    attributes = span.resource.attributes
    assert attributes["service.instance.id"] == "agent-3"
    assert attributes["service.name"] == "ckpt-events"
    assert attributes["telemetry.sdk.language"] == "python"
