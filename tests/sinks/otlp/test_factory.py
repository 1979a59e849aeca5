"""Our own OTLP/HTTP sinks from the settings (``ckpt_events.sinks.otlp._factory``): either HTTP protocol
gives an ``OtlpSpanSink`` with the batch, queue, timeout and resource the environment asks for."""

from __future__ import annotations

import pytest

from ckpt_events import Bus
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel import OtlpSpanSink
from tests.sinks.otel.test_env import BASE


@pytest.mark.parametrize(
    ("protocol", "content_type"),
    [("http/protobuf", "application/x-protobuf"), ("http/json", "application/json")],
)
async def test_otlp_over_http_is_our_own_sink(protocol: str, content_type: str) -> None:
    """OTLP over HTTP (either protocol) is an OtlpSpanSink with the OTEL_BSP_* batch, linger and
    queue, the resource of Resource.create (instance id included) and the OTLP timeout in seconds."""
    environ = {
        **BASE,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1500",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_RESOURCE_ATTRIBUTES": "team=rl",
    }
    async with Bus() as bus:
        async with configure(bus, service_instance_id="srv-1", environ=environ) as configured:
            sink = configured.span_sink
            assert isinstance(sink, OtlpSpanSink)
            assert [s.name for s in configured.subscriptions] == ["otel-spans"]
            assert (sink.protocol, sink.sender._headers["Content-Type"]) == (protocol, content_type)
            assert (sink.export_linger, sink.max_export_batch, sink.max_queue) == (0.25, 64, 100)
            assert sink.sender.timeout == 1.5
            resource = sink.encoder.resource_attributes
            assert (resource["service.instance.id"], resource["team"]) == ("srv-1", "rl")
            assert (resource["service.name"], resource["telemetry.sdk.language"]) == ("ckpt-events", "python")
