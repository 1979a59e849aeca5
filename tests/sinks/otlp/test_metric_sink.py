"""OtlpMetricSink: the same points as MetricSink on OpenTelemetry's SDK, aggregated here and
accepted by a real collector (rotel) in protobuf and JSON; configure uses it for OTLP/HTTP."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks._metric_totals import MetricTotals
from ckpt_events.sinks.otel import MetricSink, OtlpMetricSink
from ckpt_events.sinks.otel._env import DEFAULT_METRIC_INTERVAL_MS
from ckpt_events.sinks.otlp._metric_encoder import MetricEncoder
from tests.sinks.otlp.test_collector import _wait_for, collector
from tests.sinks.otlp.test_span_sink import _partial_collector

__all__ = ["collector"]

Points = dict[str, dict[frozenset[tuple[str, str]], tuple[Any, ...]]]


async def _event_mix(bus: Bus) -> None:
    """Every instrument and attribute set: operations of two kinds (ok and error; loop lag), a coordinate,
    counted events of every kind, some repeated so sums and histograms aggregate."""
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    resources = Telemetry(bus, kind="resources", instance="resources-0")
    model = Telemetry(bus, kind="model", instance="model-0")
    for n in range(3):
        with ctl.coordinate("commit", checkpoint_id=f"c{n}") as co:
            with resources.operation("commit", checkpoint_id=f"c{n}") as op:
                op.set(records=10 + n, bytes=1000 * (n + 1), loop_lag_ms=2.5 * n)
            with model.operation("commit", checkpoint_id=f"c{n}") as op:
                op.set(records=1, bytes=7)
            co.set(participants=2)
    with resources.operation("restore", checkpoint_id="c2") as op:
        op.set(records=12, bytes=3000)
    try:
        with model.operation("restore", checkpoint_id="c2"):
            raise OSError("disk")
    except OSError:
        pass
    resources.refused("unauthorized")
    resources.refused("unauthorized")
    resources.refused("stale_checkpoint")
    model.lease_expired("prepared")
    resources.prepare_not_ready(2)
    model.generation_cut("durable_prefix", 4)
    model.generation_cut("durable_prefix", 1)
    model.generation_cut("durable_failure", 2)
    await bus.flush()


def _sdk_points(reader: InMemoryMetricReader) -> Points:
    data = reader.get_metrics_data()
    assert data is not None
    found: Points = {}
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                points = found.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    attrs = frozenset((k, str(v)) for k, v in point.attributes.items())
                    if hasattr(point, "bucket_counts"):
                        points[attrs] = (
                            point.count,
                            round(point.sum, 6),
                            tuple(point.bucket_counts),
                            round(point.min, 6),
                            round(point.max, 6),
                        )
                    else:
                        points[attrs] = (point.value,)
    return found


def _rotel_points(text: str) -> Points:
    """Every metric point in rotel's detailed debug log (the last export of each metric wins)."""
    found: Points = {}
    for block in text.split("Metric #")[1:]:
        name = re.search(r"-> Name: (\S+)", block)
        assert name is not None
        points = found.setdefault(name.group(1), {})
        for part in re.split(r"\w+DataPoints #\d+", block)[1:]:
            attrs = frozenset(re.findall(r"-> (\S+): Str\(([^)]*)\)", part))
            if "Buckets #" in part:
                buckets = tuple(int(c) for c in re.findall(r"Buckets #\d+, Count: (\d+)", part))
                fields = {k: float(v) for k, v in re.findall(r"^(Count|Sum|Min|Max): (\S+)$", part, re.M)}
                points[attrs] = (
                    int(fields["Count"]),
                    round(fields["Sum"], 6),
                    buckets,
                    round(fields["Min"], 6),
                    round(fields["Max"], 6),
                )
            else:
                value = re.search(r"^Value: (\S+)$", part, re.M)
                assert value is not None, part
                number = value.group(1)
                points[attrs] = (float(number) if "." in number else int(number),)
    return found


async def _both(sink: OtlpMetricSink) -> Points:
    """The SDK's points for the event mix, recorded side by side with ``sink`` on one bus."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with Bus() as bus:
        bus.subscribe(MetricSink(provider))
        bus.subscribe(sink)
        await _event_mix(bus)
    points = _sdk_points(reader)
    provider.shutdown()
    return points


@pytest.mark.collector
@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
async def test_every_point_reaches_rotel_as_the_sdk_records_it(
    collector: tuple[str, Path], protocol: str
) -> None:
    """Names, attribute sets, sums, histogram counts/sums/buckets/min/max: rotel sees the SDK's points."""
    endpoint, out = collector
    sink = OtlpMetricSink(endpoint, protocol=protocol, resource_attributes={"service.name": "otlp-metrics"})
    expected = await _both(sink)
    assert sink.stats().exports == 1 and sink.stats().export_failures == 0
    text = _wait_for(out, ["otlp-metrics", "gym.checkpoint.events_total"])
    assert set(expected) == {
        "gym.checkpoint.operation_duration_ms",
        "gym.checkpoint.loop_lag_ms",
        "gym.checkpoint.records_total",
        "gym.checkpoint.bytes_total",
        "gym.checkpoint.events_total",
        "gym.checkpoint.open_operations",
        "gym.checkpoint.oldest_open_s",
    }
    assert _rotel_points(text) == expected
    assert len(expected["gym.checkpoint.events_total"]) == 6  # 2 refused, lease, not ready, 2 cut
    assert "AGGREGATION_TEMPORALITY_CUMULATIVE" in text and "IsMonotonic: true" in text


async def test_configure_uses_it_for_otlp_http_unless_a_meter_provider_is_given() -> None:
    """An endpoint: OtlpMetricSink at base + /v1/metrics with OTEL_METRIC_EXPORT_INTERVAL; a given
    meter_provider: the SDK MetricSink only."""
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_METRIC_EXPORT_INTERVAL": "1500",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json",
        "OTEL_TRACES_EXPORTER": "none",
    }
    async with Bus() as bus:
        configured = configure(bus, environ=environ, service_instance_id="i-1")
        sink = configured.metric_sink
        assert isinstance(sink, OtlpMetricSink)
        assert [s.name for s in configured.subscriptions] == ["otel-metrics"]
        assert (sink.sender.url, sink.export_interval, sink.protocol) == (
            "http://127.0.0.1:9/v1/metrics",
            1.5,
            "http/json",
        )
        assert sink.encoder.resource_attributes["service.instance.id"] == "i-1"
        configured.close_timeout = 2.0
        await configured.aclose()  # nothing recorded: nothing sent to the closed port
        provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        async with configure(bus, environ=environ, meter_provider=provider) as given:
            assert isinstance(given.metric_sink, MetricSink) and len(given.metric_sinks) == 1
        provider.shutdown()


async def test_built_directly_or_by_configure_it_exports_at_the_same_default_interval() -> None:
    """With no interval asked for, ``OtlpMetricSink(endpoint)`` and the one ``configure`` builds
    export alike, every ``DEFAULT_METRIC_INTERVAL_MS`` (10 s): built directly it exported every
    60 s, six times less often than the sink of the same name ``configure`` builds."""
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}
    direct = OtlpMetricSink("http://127.0.0.1:9", max_retries=0)
    try:
        async with Bus() as bus:
            configured = configure(bus, environ=environ)
            configured.close_timeout = 2.0
            async with configured:
                built = configured.metric_sink
                assert isinstance(built, OtlpMetricSink)
                assert direct.export_interval == built.export_interval == DEFAULT_METRIC_INTERVAL_MS / 1000
    finally:
        direct.shutdown()


async def test_a_collector_that_is_down_is_counted_not_raised() -> None:
    """Nothing listening: the last export at close fails, is counted, and close still returns."""
    from ckpt_events.benchmarks.rotel import free_port

    sink = OtlpMetricSink(f"http://127.0.0.1:{free_port()}", max_retries=0, timeout=2.0)
    async with Bus() as bus:
        bus.subscribe(sink)
        Telemetry(bus, kind="model", instance="m0").refused("unauthorized")
    stats = sink.stats()
    assert (stats.events, stats.exports, stats.export_failures) == (1, 0, 1)


async def test_events_after_shutdown_are_counted_as_dropped_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Subscribed again after its bus closed it, the sink folded the events (counted as events,
    delivered by the bus) and no export ever carried them: now dropped, counted, warned once."""
    from ckpt_events.benchmarks.rotel import free_port

    sink = OtlpMetricSink(f"http://127.0.0.1:{free_port()}", max_retries=0, timeout=2.0)
    async with Bus() as bus:
        bus.subscribe(sink)
        Telemetry(bus, kind="model", instance="m0").refused("unauthorized")
    async with Bus() as bus:
        bus.subscribe(sink)
        model = Telemetry(bus, kind="model", instance="m0")
        model.refused("unauthorized")
        await bus.flush()
        model.refused("unauthorized")
    stats = sink.stats()
    assert (stats.events, stats.dropped) == (1, 2)
    assert sink.snapshot().sums[2] == {("refused", "unauthorized"): 1}
    said = [r for r in caplog.records if "was shut down" in r.getMessage()]
    assert len(said) == 1 and "stats().dropped" in said[0].getMessage()


async def test_points_a_partial_success_rejects_are_counted_and_named() -> None:
    """A 200 whose partial success rejects 2 data points: counted in ``rejected``, named in
    ``last_failure``; the export itself was accepted (they showed as a clean export before)."""
    body = b'{"partialSuccess":{"rejectedDataPoints":"2","errorMessage":"bad points"}}'
    server, thread = _partial_collector(body, "application/json")
    try:
        sink = OtlpMetricSink(f"http://127.0.0.1:{server.server_address[1]}", protocol="http/json", timeout=2)
        async with Bus() as bus:
            bus.subscribe(sink)
            Telemetry(bus, kind="model", instance="m0").refused("unauthorized")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    stats = sink.stats()
    assert (stats.exports, stats.export_failures, stats.rejected) == (1, 0, 2), stats
    assert stats.last_failure == "rejected 2 data points: 'bad points'"


class _CountingMetricSink(OtlpMetricSink):
    """Counts the batches the bus hands over."""

    batches = 0

    def handle(self, batch: list[Any]) -> None:
        self.batches += 1
        super().handle(batch)


@pytest.mark.collector
async def test_a_busy_servers_events_come_in_few_batches_and_all_count_at_close(
    collector: tuple[str, Path],
) -> None:
    """Operations over many loop turns reach the sink in a few batches (the bus lingers), and those
    still lingering when the bus closes (no flush) are in the last export the collector gets."""
    endpoint, out = collector
    sink = _CountingMetricSink(endpoint, resource_attributes={"service.name": "otlp-linger"})
    assert sink.linger > 0
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for _ in range(30):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set(records=2, bytes=10)
            await anyio.sleep(0)
    assert sink.batches <= 3
    stats = sink.stats()
    # Each operation is two events: its start (open work) and its end.
    assert (stats.events, stats.exports, stats.export_failures) == (60, 1, 0)
    points = _rotel_points(_wait_for(out, ["otlp-linger", "gym.checkpoint.records_total"]))
    attributes = {
        ("nemo.gym.checkpoint.operation", "commit"),
        ("nemo.gym.checkpoint.participant_kind", "resources"),
    }
    assert points["gym.checkpoint.records_total"] == {frozenset(attributes): (60,)}


async def test_both_sinks_export_each_instrument_as_the_core_table_spells_it() -> None:
    """MetricSink (through the SDK) and our encoder give every instrument of ckpt_events.vocab.INSTRUMENTS
    and OPEN_WORK_INSTRUMENTS its kind, unit and description, in the table's order within each kind."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

    from ckpt_events.vocab import INSTRUMENTS, OPEN_WORK_INSTRUMENTS, InstrumentKind

    def sdk_kind(data: Any) -> InstrumentKind:
        if isinstance(data, Histogram):
            return InstrumentKind.HISTOGRAM
        if isinstance(data, Gauge):
            return InstrumentKind.GAUGE
        return InstrumentKind.COUNTER if data.is_monotonic else InstrumentKind.UP_DOWN_COUNTER

    def otlp_kind(m: Any) -> InstrumentKind:
        if m.HasField("histogram"):
            return InstrumentKind.HISTOGRAM
        if m.HasField("gauge"):
            return InstrumentKind.GAUGE
        return InstrumentKind.COUNTER if m.sum.is_monotonic else InstrumentKind.UP_DOWN_COUNTER

    table = INSTRUMENTS + OPEN_WORK_INSTRUMENTS
    want = {(i.name, i.kind, i.unit, i.description) for i in table}
    events: list[Any] = []

    class Keep:
        def handle(self, batch: list[Any]) -> None:
            events.extend(batch)

    reader = InMemoryMetricReader()
    async with Bus() as bus:
        bus.subscribe(MetricSink(MeterProvider(metric_readers=[reader])))
        bus.subscribe(Keep())
        await _event_mix(bus)
    data = reader.get_metrics_data()
    assert data is not None
    sdk = {
        (m.name, sdk_kind(m.data), m.unit, m.description)
        for m in data.resource_metrics[0].scope_metrics[0].metrics
        if isinstance(m.data, Histogram | Sum | Gauge)
    }
    # The open-work instruments the event mix left open or published are exported too.
    assert {i.name for i in INSTRUMENTS} <= {name for name, *_ in sdk} and sdk <= want
    totals = MetricTotals()
    totals.add(events)
    request = ExportMetricsServiceRequest.FromString(
        MetricEncoder({"service.name": "s"}).protobuf(totals, 1, 2)
    )
    ours = [
        (m.name, otlp_kind(m), m.unit, m.description)
        for m in request.resource_metrics[0].scope_metrics[0].metrics
    ]
    histograms = [i for i in INSTRUMENTS if i.kind is InstrumentKind.HISTOGRAM]
    counters = [i for i in INSTRUMENTS if i.kind is InstrumentKind.COUNTER]
    spelled = [(i.name, i.kind, i.unit, i.description) for i in histograms + counters]
    assert ours[: len(spelled)] == spelled
    assert set(ours[len(spelled) :]) <= want


def _overflow_mix() -> list[Any]:
    """Five new codes, four new kinds (started, then finished with a volume): past a limit of 2 everywhere."""
    from ckpt_events import OperationFinished, OperationStarted, Refused

    events: list[Any] = [Refused(kind="model", instance="m0", time_ns=1, code=f"code-{i}") for i in range(5)]
    for i in range(4):
        ident: dict[str, Any] = {"kind": f"kind-{i}", "instance": "i0", "trace_id": 1, "span_id": i + 1}
        events.append(OperationStarted(**ident, start_ns=1, operation="commit"))
        events.append(
            OperationFinished(
                **ident, start_ns=1, end_ns=2_000_001, operation="commit", records=i, bytes=10 * i
            )
        )
    return events


def _request_points(body: bytes) -> Points:
    """Our protobuf request's points, keyed as ``_sdk_points`` keys the SDK's (values as ``str``)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    found: Points = {}
    request = ExportMetricsServiceRequest.FromString(body)
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        points = found.setdefault(metric.name, {})
        data = (
            metric.histogram if metric.HasField("histogram") else getattr(metric, metric.WhichOneof("data"))
        )
        for point in data.data_points:
            attrs = frozenset(
                (a.key, str(getattr(a.value, a.value.WhichOneof("value")))) for a in point.attributes
            )
            if metric.HasField("histogram"):
                points[attrs] = (
                    point.count,
                    round(point.sum, 6),
                    tuple(point.bucket_counts),
                    round(point.min, 6),
                    round(point.max, 6),
                )
            else:
                points[attrs] = (point.as_int if point.WhichOneof("value") == "as_int" else point.as_double,)
    return found


async def test_past_the_cardinality_limit_our_points_are_the_sdks() -> None:
    """Limit 2: the OTLP request holds the SDK-backed MetricSink's points, overflow series included
    (``otel.metric.overflow`` a boolean, as the SDK writes it)."""
    events = _overflow_mix()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sdk_sink = MetricSink(provider, cardinality_limit=2)
    sdk_sink.handle(events)
    expected = _sdk_points(reader)
    provider.shutdown()
    totals = MetricTotals(2)
    totals.add(events)
    ours = _request_points(MetricEncoder({"service.name": "s"}).protobuf(totals.snapshot(), 1, 2))
    overflow = frozenset({("otel.metric.overflow", "True")})
    assert ours["gym.checkpoint.events_total"][overflow] == (3,)
    assert ours["gym.checkpoint.operation_duration_ms"][overflow][0] == 2
    assert ours["gym.checkpoint.bytes_total"][overflow] == (50,)
    del ours["gym.checkpoint.oldest_open_s"]  # an age: read at different times
    del expected["gym.checkpoint.oldest_open_s"]
    assert ours == expected
    assert sdk_sink.stats().overflowed > 0 and totals.overflow.measurements == 3 + 2 + 2 + 2 + 2
    json_request = msgspec.json.decode(MetricEncoder({}).json(totals, 1, 2))
    metrics = json_request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    events_total = next(m for m in metrics if m["name"] == "gym.checkpoint.events_total")
    assert {"key": "otel.metric.overflow", "value": {"boolValue": True}} in events_total["sum"]["dataPoints"][
        -1
    ]["attributes"]


async def test_the_sink_takes_a_cardinality_limit_and_counts_its_overflow() -> None:
    """``cardinality_limit=`` is checked like any argument; ``stats().overflowed`` counts what overflowed."""
    from ckpt_events import InvalidValueError
    from ckpt_events.benchmarks.rotel import free_port

    with pytest.raises(InvalidValueError, match="cardinality_limit"):
        OtlpMetricSink("http://127.0.0.1:9", cardinality_limit=0)
    sink = OtlpMetricSink(f"http://127.0.0.1:{free_port()}", max_retries=0, timeout=2.0, cardinality_limit=2)
    sink.handle(_overflow_mix())
    assert sink.stats().overflowed == 11
    sink.shutdown(timeout=2.0)
