"""Our own OTLP/HTTP sinks built from ``OtelSettings`` (``http/protobuf`` and ``http/json``).

``configure`` uses these for OTLP over HTTP: the events are encoded straight into OTLP
request bodies and posted over one kept-alive connection, with no OpenTelemetry SDK objects
per span or metric point. gRPC, the console exporter and a pipeline the user hands in
(``tracer_provider``, ``span_exporter``, ``meter_provider``) keep OpenTelemetry's path.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_events import ConfigurationError
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks._span_attrs import AttributeLimits
from ckpt_events.sinks.otel._env import BatchSettings, OtlpSettings, given
from ckpt_events.sinks.otlp._metric_sink import OtlpMetricSink
from ckpt_events.sinks.otlp._span_sink import DEFAULT_MAX_QUEUE, OtlpSpanSink

__all__ = ["DEFAULT_TIMEOUT_S", "is_own_http", "own_metric_sink", "own_span_sink"]

#: OTEL_EXPORTER_OTLP_TIMEOUT's default (10 000 ms).
DEFAULT_TIMEOUT_S = 10.0


def is_own_http(otlp: OtlpSettings | None) -> bool:
    """Whether ``otlp`` is OTLP over HTTP (protobuf or JSON): the protocols we encode ourselves."""
    return otlp is not None and otlp.protocol in ("http/protobuf", "http/json")


def _compression(otlp: OtlpSettings) -> str:
    return "none" if otlp.compression is None else otlp.compression


def own_span_sink(
    otlp: OtlpSettings,
    batch: BatchSettings,
    *,
    resource_attributes: Mapping[str, object],
    span_groups: frozenset[str],
    attribute_limits: AttributeLimits | None = None,
) -> OtlpSpanSink:
    """An ``OtlpSpanSink`` posting to ``otlp.endpoint`` as is (the signal path is already in
    it), with the ``OTEL_BSP_*`` batch, linger and queue; the request timeout is the OTLP
    timeout, else ``OTEL_BSP_EXPORT_TIMEOUT``, else 10 s. A batch size larger than the queue's
    default (``OTEL_BSP_MAX_QUEUE_SIZE`` unset) raises ``ConfigurationError``."""
    if batch.max_buffer is None and (batch.max_export_batch or 0) > DEFAULT_MAX_QUEUE:
        raise ConfigurationError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={batch.max_export_batch} is larger than the span queue "
            f"(OTEL_BSP_MAX_QUEUE_SIZE unset: {DEFAULT_MAX_QUEUE}); a batch must fit in the queue: "
            f"set OTEL_BSP_MAX_QUEUE_SIZE to at least {batch.max_export_batch}, or lower the batch size"
        )
    options = given(
        max_export_batch=batch.max_export_batch, max_queue=batch.max_buffer, linger=batch.linger_s
    )
    timeout = otlp.timeout_s if otlp.timeout_s is not None else batch.export_timeout_s
    return OtlpSpanSink(
        otlp.endpoint,
        traces_path="",
        protocol=otlp.protocol,
        headers=otlp.headers,
        timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout,
        compression=_compression(otlp),
        tls=otlp.tls,
        resource_attributes=resource_attributes,
        span_groups=span_groups,
        attribute_limits=attribute_limits,
        **options,
    )


def own_metric_sink(
    otlp: OtlpSettings,
    *,
    resource_attributes: Mapping[str, object],
    interval_ms: int,
    cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT,
    export_timeout_ms: int | None = None,
) -> OtlpMetricSink:
    """An ``OtlpMetricSink`` posting to ``otlp.endpoint`` as is every ``interval_ms``
    (``OTEL_METRIC_EXPORT_INTERVAL``), keeping ``cardinality_limit`` attribute sets per instrument;
    the request timeout is the OTLP timeout, else ``export_timeout_ms``
    (``OTEL_METRIC_EXPORT_TIMEOUT``), else 10 s."""
    timeout = otlp.timeout_s
    if timeout is None and export_timeout_ms is not None:
        timeout = export_timeout_ms / 1000
    return OtlpMetricSink(
        otlp.endpoint,
        metrics_path="",
        protocol=otlp.protocol,
        headers=otlp.headers,
        timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout,
        compression=_compression(otlp),
        tls=otlp.tls,
        resource_attributes=resource_attributes,
        export_interval=interval_ms / 1000,
        cardinality_limit=cardinality_limit,
    )
