"""The OpenTelemetry sinks ``configure()`` builds from the settings, and their undoing.

``otel_sinks`` turns ``OtelSettings`` (and the caller's own OpenTelemetry parts) into named span
sinks, named metric sinks and the meter provider built for them: our own OTLP/HTTP sinks, and
OpenTelemetry's exporters for the console and gRPC (``ckpt_events.sinks.otel._pipeline``).
Each part it starts is registered in a ``Built`` with how to stop it, so a ``configure()`` that
fails later stops them instead of leaving their threads running. OpenTelemetry is imported only
when something is built: the core installs without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from ckpt_events import ConfigurationError
from ckpt_events._errors import shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks.otel._env import DEFAULT_SERVICE_NAME, ENV_TEMPORALITY, OtelSettings, given

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from ckpt_events.sinks.otel._metric_sink import MetricSink
    from ckpt_events.sinks.otel._span_sink import SpanSink
    from ckpt_events.sinks.otlp._metric_sink import OtlpMetricSink
    from ckpt_events.sinks.otlp._span_sink import OtlpSpanSink

    AnySpanSink: TypeAlias = SpanSink | OtlpSpanSink
    AnyMetricSink: TypeAlias = MetricSink | OtlpMetricSink

__all__ = ["Built", "otel_sinks"]

logger: Final = library_logger("ckpt_events.sinks")
_T = TypeVar("_T")

#: How long a failed ``configure`` gives the meter provider it built to shut down.
_RELEASE_MILLIS: Final = 1000


class Built:
    """What ``configure`` built and owns, each with how to stop it, released at once if
    ``configure`` fails before returning.

    A failed ``configure`` left these running for the life of the process: the OTLP sinks'
    export threads, the SDK's periodic metric reader (exporting every interval to the console or
    a collector), the JSON-lines file open. Nothing was emitted to them yet, so nothing is lost:
    each is stopped without waiting for a collector. What the caller passed in (a span
    exporter, a tracer or meter provider) stays the caller's.
    """

    def __init__(self) -> None:
        self._stops: list[tuple[object, Callable[[Any], object]]] = []

    def add(self, made: _T, stop: Callable[[_T], object]) -> _T:
        """``made``, to be stopped with ``stop(made)`` if ``configure`` fails."""
        self._stops.append((made, stop))
        return made

    def release(self) -> None:
        """Stop everything added, the last first; a failure here is logged, never raised (the
        error that stopped ``configure`` is the one to see)."""
        for made, stop in reversed(self._stops):
            try:
                stop(made)
            except Exception:
                logger.debug("ckpt_events: releasing %r after configure() failed", made, exc_info=True)


def _stop_now(sink: OtlpSpanSink | OtlpMetricSink) -> None:
    sink.shutdown(timeout=0.0)  # nothing was emitted: no export to wait for


def _shut_down(provider: MeterProvider) -> None:
    provider.shutdown(timeout_millis=_RELEASE_MILLIS)


def otel_sinks(
    settings: OtelSettings,
    groups: frozenset[str],
    built: Built,
    *,
    tracer_provider: TracerProvider | None,
    meter_provider: MeterProvider | None,
    span_exporter: SpanExporter | None,
    metric_readers: Sequence[MetricReader] | None,
    resource_args: tuple[str | None, Mapping[str, str] | None, str | None],
    cardinality_limit: int,
) -> tuple[list[tuple[str, AnySpanSink]], list[tuple[str, AnyMetricSink]], MeterProvider | None]:
    """(named span sinks, named metric sinks, the meter provider built here) for ``settings``."""
    wants_spans = tracer_provider is not None or span_exporter is not None or bool(settings.traces)
    # The scrape endpoint (OTEL_METRICS_EXPORTER=prometheus) is our own aggregation, built beside
    # these: asking for it alone built an OpenTelemetry resource no sink read, and so needed the
    # SDK the prometheus extra does not bring.
    wants_metrics = (
        meter_provider is not None
        or bool(metric_readers)
        or any(name != "prometheus" for name in settings.metrics)
    )
    if not wants_spans and not wants_metrics:
        return [], [], None
    from ckpt_events.sinks.otel._pipeline import build_resource

    service_name, attributes, instance_id = resource_args
    resource = build_resource(
        settings,
        service_name=service_name,
        attributes=attributes,
        instance_id=instance_id,
        default_service_name=DEFAULT_SERVICE_NAME,
    )
    span_sinks = _span_sinks(
        settings, groups, resource, built, tracer_provider=tracer_provider, span_exporter=span_exporter
    )
    metric_sinks, own_provider = _metric_sinks(
        settings,
        resource,
        built,
        meter_provider=meter_provider,
        metric_readers=metric_readers,
        cardinality_limit=cardinality_limit,
    )
    return span_sinks, metric_sinks, own_provider


def _span_sinks(
    settings: OtelSettings,
    groups: frozenset[str],
    resource: Resource,
    built: Built,
    *,
    tracer_provider: TracerProvider | None,
    span_exporter: SpanExporter | None,
) -> list[tuple[str, AnySpanSink]]:
    """The named span sinks: through ``tracer_provider`` alone if given, else to
    ``span_exporter``, our own OTLP/HTTP sink and the environment's other exporters."""
    from ckpt_events.sinks._span_attrs import AttributeLimits
    from ckpt_events.sinks.otel._pipeline import span_exporters_for
    from ckpt_events.sinks.otel._span_sink import SpanSink
    from ckpt_events.sinks.otlp._factory import is_own_http, own_span_sink

    batch = settings.batch
    options: dict[str, Any] = {
        "span_groups": groups,
        "attribute_limits": settings.attribute_limits,
        **given(
            max_export_batch=batch.max_export_batch,
            linger=batch.linger_s,
            export_timeout=batch.export_timeout_s,
        ),
    }
    made: list[tuple[str, AnySpanSink]] = []
    if tracer_provider is not None:
        # Your provider's SpanLimits hold our spans as they hold yours, unless the environment
        # sets limits (then those, as for every span sink). Limits equal to the default are
        # taken as unset: the provider's own default is the same unless set in code.
        if settings.attribute_limits == AttributeLimits():
            options["attribute_limits"] = None
        made.append(("otel-spans", SpanSink(tracer_provider=tracer_provider, **options)))
    else:
        if span_exporter is not None:
            made.append(("otel-spans", SpanSink(span_exporter, resource=resource, **options)))
        if "checkpoint" in groups and "otlp" in settings.traces and is_own_http(settings.traces_otlp):
            assert settings.traces_otlp is not None
            own = own_span_sink(
                settings.traces_otlp,
                batch,
                resource_attributes=dict(resource.attributes),
                span_groups=groups,
                attribute_limits=settings.attribute_limits,
            )
            made.append(("otlp", built.add(own, _stop_now)))
        if "checkpoint" in groups:
            for name, exporter in span_exporters_for(settings):
                made.append(
                    (name, built.add(SpanSink(exporter, resource=resource, **options), SpanSink.shutdown))
                )
    # The first is "otel-spans"; more (OTEL_TRACES_EXPORTER=otlp,console) get suffixes.
    return [
        ("otel-spans" if index == 0 else f"otel-spans-{name}", sink)
        for index, (name, sink) in enumerate(made)
    ]


def _metric_sinks(
    settings: OtelSettings,
    resource: Resource,
    built: Built,
    *,
    meter_provider: MeterProvider | None,
    metric_readers: Sequence[MetricReader] | None,
    cardinality_limit: int,
) -> tuple[list[tuple[str, AnyMetricSink]], MeterProvider | None]:
    """The named metric sinks (our own OTLP/HTTP one, then one through the SDK) and the meter
    provider built here for ``metric_readers`` and the environment's readers (``None``: none
    built, or ``meter_provider`` given)."""
    from ckpt_events.sinks.otel._metric_sink import MetricSink
    from ckpt_events.sinks.otel._pipeline import metric_readers_for
    from ckpt_events.sinks.otlp._factory import is_own_http, own_metric_sink

    own_http = meter_provider is None and "otlp" in settings.metrics and is_own_http(settings.metrics_otlp)
    if own_http and settings.metric_temporality not in (None, "cumulative"):
        # Before anything is built. delta was taken without a word, and cumulative points sent.
        raise ConfigurationError(
            f"{ENV_TEMPORALITY}={shown(settings.metric_temporality)}: ckpt-events' OTLP/HTTP metric sink "
            "exports cumulative temporality only; use cumulative (or leave it unset), or "
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=grpc for OpenTelemetry's exporter"
        )
    own_provider: MeterProvider | None = None
    ours = metric_readers_for(settings, cardinality_limit=cardinality_limit) if meter_provider is None else []
    readers = [*(metric_readers or ()), *ours] if meter_provider is None else []
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

        try:
            made = SdkMeterProvider(resource=resource, metric_readers=readers)
        except Exception as exc:  # the SDK's own refusal, e.g. a reader registered elsewhere already
            for reader in ours:  # the environment's, built here (the caller's stay the caller's)
                with contextlib.suppress(Exception):
                    reader.shutdown(timeout_millis=1000)
            raise ConfigurationError(f"metric_readers: {exc}") from None
        own_provider = built.add(made, _shut_down)
    provider = meter_provider if meter_provider is not None else own_provider
    metrics: list[tuple[str, AnyMetricSink]] = []
    if own_http:
        assert settings.metrics_otlp is not None
        own_metrics = own_metric_sink(
            settings.metrics_otlp,
            resource_attributes=dict(resource.attributes),
            interval_ms=settings.metric_interval_ms,
            cardinality_limit=cardinality_limit,
            export_timeout_ms=settings.metric_export_timeout_ms,
        )
        metrics.append(("otel-metrics", built.add(own_metrics, _stop_now)))
    if provider is not None:
        label = "otel-metrics-sdk" if metrics else "otel-metrics"
        metrics.append((label, MetricSink(provider, cardinality_limit=cardinality_limit)))
    return metrics, own_provider
