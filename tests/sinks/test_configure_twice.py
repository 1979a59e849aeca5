"""One bus configured twice to one place: refused in one line, not every span sent twice.

Before, a second ``configure()`` of a bus (a server's lifespan configuring the bus that
``instrument()`` had configured) subscribed a second span sink and metric sink to the same
collector: every span went twice and every metric point was counted twice.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, ConfigurationError, Telemetry, sinks
from ckpt_events.sinks.jsonl import read_events

DEAD = "http://127.0.0.1:9"  # nothing listens: nothing is emitted, nothing is sent


def _names(bus: Bus) -> list[str]:
    return [stats.name for stats in bus.stats().sinks]


async def test_a_second_configure_to_the_same_collector_is_refused_and_the_first_keeps_working(
    tmp_path: Path,
) -> None:
    async with Bus() as bus:
        first = sinks.configure(bus, otlp_endpoint=DEAD, jsonl_path=tmp_path / "a.jsonl")
        before = _names(bus)
        with pytest.raises(ConfigurationError) as refused:
            sinks.configure(bus, otlp_endpoint=DEAD, jsonl_path=tmp_path / "b.jsonl")
        message = str(refused.value)
        assert "\n" not in message
        assert f"already exports OTLP spans to {DEAD}/v1/traces" in message
        assert "aclose()" in message
        assert _names(bus) == before  # nothing of the second was left subscribed
        assert not (tmp_path / "b.jsonl").exists()
        with Telemetry(bus, kind="environment", instance="e-0").operation("commit"):
            pass
        first.close_timeout = 1.0
        await first.aclose()
    assert [type(e).__name__ for _, e in read_events(tmp_path / "a.jsonl")] == [
        "OperationStarted",
        "OperationFinished",
    ]


async def test_once_the_first_is_closed_the_place_is_free_again(tmp_path: Path) -> None:
    async with Bus() as bus:
        first = sinks.configure(bus, otlp_endpoint=DEAD)
        first.close_timeout = 1.0
        await first.aclose()
        second = sinks.configure(bus, otlp_endpoint=DEAD)
        assert second.enabled
        second.close_timeout = 1.0
        await second.aclose()


async def test_one_log_by_two_names_is_one_place_and_two_logs_are_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with Bus() as bus:
        first = sinks.configure(bus, jsonl_path=tmp_path / "events.jsonl", environ={})
        with pytest.raises(
            ConfigurationError, match=f"already exports JSON lines to {tmp_path / 'events.jsonl'}"
        ):
            sinks.configure(bus, environ={"CKPT_EVENTS_JSONL": "events.jsonl"})  # relative: the same file
        other = sinks.configure(bus, jsonl_path=tmp_path / "other.jsonl", environ={})  # a second log: fine
        await other.aclose()
        await first.aclose()


async def test_two_buses_may_export_to_one_collector() -> None:
    async with Bus() as one, Bus() as two:
        a = sinks.configure(one, otlp_endpoint=DEAD)
        b = sinks.configure(two, otlp_endpoint=DEAD)
        for configured in (a, b):
            configured.close_timeout = 1.0
            await configured.aclose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the export process is started as on POSIX")
async def test_the_export_process_claims_its_places_too(tmp_path: Path) -> None:
    async with Bus() as bus:
        first = sinks.configure(bus, jsonl_path=tmp_path / "a.jsonl", export_process=True)
        with pytest.raises(ConfigurationError, match="already exports JSON lines to"):
            sinks.configure(bus, jsonl_path=tmp_path / "a.jsonl")
        await first.aclose()


async def test_a_second_configure_with_the_same_providers_of_yours_is_refused() -> None:
    """Your ``tracer_provider``/``meter_provider`` given twice to one bus is refused (it got
    every span twice and counted every metric twice), and is free again once the first closes."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    async with Bus() as bus:
        options = {"span_groups": "default,checkpoint", "environ": {}}
        first = sinks.configure(
            bus, tracer_provider=tracer_provider, meter_provider=meter_provider, **options
        )
        before = _names(bus)
        with pytest.raises(ConfigurationError) as refused:
            sinks.configure(bus, tracer_provider=tracer_provider, **options)
        assert "\n" not in str(refused.value)
        assert "already exports spans to your TracerProvider" in str(refused.value)
        with pytest.raises(ConfigurationError, match="already exports metrics to your MeterProvider"):
            sinks.configure(bus, meter_provider=meter_provider, **options)
        assert _names(bus) == before
        with Telemetry(bus, kind="resources", instance="r-0").operation("commit", checkpoint_id="c1") as op:
            op.set(records=3)
        await bus.flush()
        await first.aclose()
        # Closed, the providers are free again for another configure() of the bus.
        await sinks.configure(bus, tracer_provider=tracer_provider, **options).aclose()
    assert len(exporter.get_finished_spans()) == 1
    data = reader.get_metrics_data()
    assert data is not None
    records = [
        point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "gym.checkpoint.records_total"
        for point in metric.data.data_points
    ]
    assert records == [3]
    meter_provider.shutdown()
