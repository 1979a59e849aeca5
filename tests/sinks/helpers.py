"""Helpers for reading what the OpenTelemetry in-memory parts received."""

from __future__ import annotations

import socket
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan

from ckpt_events import Bus, Stalled, Telemetry
from ckpt_events.vocab import Kind, Operation, Phase


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    """Spans grouped by name."""
    grouped: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        grouped.setdefault(span.name, []).append(span)
    return grouped


def metric_points(reader: InMemoryMetricReader) -> dict[str, Any]:
    """``{instrument: (unit, {frozenset(attributes): value or histogram count})}``."""
    data = reader.get_metrics_data()
    found: dict[str, Any] = {}
    if data is None:
        return found
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                points = {}
                for point in metric.data.data_points:
                    value = point.count if hasattr(point, "count") else point.value
                    points[frozenset(point.attributes.items())] = value
                found[metric.name] = (metric.unit, points)
    return found


def histogram_sums(reader: InMemoryMetricReader) -> dict[frozenset[Any], float]:
    """The duration histogram's sum per attribute set."""
    data = reader.get_metrics_data()
    sums: dict[frozenset[Any], float] = {}
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "gym.checkpoint.operation_duration_ms":
                    for point in metric.data.data_points:
                        sums[frozenset(point.attributes.items())] = point.sum
    return sums


async def every_event_type(bus: Bus) -> None:
    """Emit at least one event of every type in CheckpointEvent."""
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    model = Telemetry(bus, kind="model", instance="model-0")
    with ctl.coordinate("prepare", checkpoint_id="c1") as co:
        with co.stage("model") as stage:
            stage.set(participants=1)
            with model.operation("prepare", checkpoint_id="c1", traceparent=stage.traceparent()) as op:
                with op.step("generation_cut") as cut:
                    cut.set(calls=2, cut_durable_prefix=2, cut_durable_failure=0)
                model.generation_cut("durable_prefix", 2, checkpoint_id="c1")
                op.set_attribute("user.note", 'héllo "quoted"\n')
                op.set(phase="preparing", blockers=3)
        co.set(participants=1, prepared=False, stopped_at="model")
    model.prepare_not_ready(3, checkpoint_id="c1")
    model.lease_expired("preparing", checkpoint_id="c1")
    model.refused("stale_checkpoint", checkpoint_id="c1")
    # Built by sinks.StallWatch from the stalled operation, not by a Telemetry.
    bus.emit(Stalled(Kind.MODEL, "model-0", 1, Operation.PREPARE, 31.5, Phase.PREPARING, "c1"))
    with ctl.collection("checkpoint", checkpoint_id="c1") as col:
        col.set(in_flight=1, stop=True, published=False)


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ``::1`` (tests of an IPv6 host skip without it)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True
