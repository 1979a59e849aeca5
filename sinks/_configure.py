"""``configure``: the standard set of sinks from arguments and the standard environment.

With nothing set, nothing is subscribed, and every emit site stays off.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import anyio
import anyio.to_thread

from ckpt_events import Bus, CkptEventsError, ConfigurationError, Subscription, resolve_span_groups
from sinks._jsonl import JsonLinesSink

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

    from sinks._metric_sink import MetricSink
    from sinks._span_sink import SpanSink

__all__ = ["Configured", "configure"]

ENV_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
ENV_RESOURCE_ATTRIBUTES: Final = "OTEL_RESOURCE_ATTRIBUTES"
ENV_METRIC_INTERVAL: Final = "OTEL_METRIC_EXPORT_INTERVAL"
ENV_SPAN_GROUPS: Final = "CKPT_EVENTS_SPAN_GROUPS"
ENV_JSONL: Final = "CKPT_EVENTS_JSONL"

DEFAULT_SPAN_GROUPS: Final = "default,checkpoint"
DEFAULT_METRIC_INTERVAL_MS: Final = 10_000
SUPPORTED_PROTOCOL: Final = "http/protobuf"
DEFAULT_SERVICE_NAME: Final = "ckpt-events"


class Configured:
    """What ``configure`` subscribed: the sinks, their subscriptions, and what they own.

    ``aclose()`` (or leaving ``async with``) flushes the bus and unsubscribes; the bus closes
    each sink (the span exporter, the JSON-lines file), and this shuts down the meter
    provider ``configure`` built. Idempotent.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        subscriptions: Sequence[Subscription] = (),
        span_sink: SpanSink | None = None,
        metric_sink: MetricSink | None = None,
        jsonl_sink: JsonLinesSink | None = None,
        meter_provider: MeterProvider | None = None,
        close_timeout: float = 10.0,
    ) -> None:
        self.bus = bus
        self.subscriptions = tuple(subscriptions)
        self.span_sink = span_sink
        self.metric_sink = metric_sink
        self.jsonl_sink = jsonl_sink
        self.meter_provider = meter_provider
        self.close_timeout = close_timeout
        self._closed = False

    @property
    def enabled(self) -> bool:
        """Whether anything was subscribed."""
        return bool(self.subscriptions)

    def __repr__(self) -> str:
        names = ", ".join(sub.name for sub in self.subscriptions) or "nothing"
        return f"<Configured: {names}>"

    async def aclose(self) -> None:
        """Deliver what was emitted, unsubscribe (the bus closes each sink), then shut down
        the meter provider ``configure`` built. All within ``close_timeout``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(self.close_timeout):
            await self.bus.flush(timeout=self.close_timeout)
            for sub in self.subscriptions:
                await sub.aclose()
            if self.meter_provider is not None:
                provider = self.meter_provider
                timeout_ms = int(self.close_timeout * 1000)
                await anyio.to_thread.run_sync(lambda: provider.shutdown(timeout_millis=timeout_ms))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def configure(
    bus: Bus,
    *,
    jsonl_path: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    span_groups: str | Iterable[str] | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    metric_export_interval_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
) -> Configured:
    """Subscribe the standard sinks to ``bus``; arguments win over the environment.

    * JSON lines: ``jsonl_path`` or ``CKPT_EVENTS_JSONL``.
    * OpenTelemetry over OTLP/HTTP: ``otlp_endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
      (a base URL; ``/v1/traces`` and ``/v1/metrics`` are appended), protocol
      ``OTEL_EXPORTER_OTLP_PROTOCOL`` (only ``http/protobuf``), ``OTEL_SERVICE_NAME``,
      ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_METRIC_EXPORT_INTERVAL`` (ms). Spans use
      ``span_groups`` or ``CKPT_EVENTS_SPAN_GROUPS`` (default ``"default,checkpoint"``).
    * ``span_exporter`` / ``metric_readers`` plug in other OpenTelemetry parts (tests, the
      console) instead of, or besides, OTLP.

    With nothing set, nothing is subscribed. A bad value raises ``ConfigurationError``
    naming the argument or variable.
    """
    env = os.environ if environ is None else environ
    subscriptions: list[Subscription] = []
    jsonl_sink: JsonLinesSink | None = None
    span_sink: SpanSink | None = None
    metric_sink: MetricSink | None = None
    meter_provider: MeterProvider | None = None

    path = _pick(jsonl_path, env, ENV_JSONL)
    endpoint = _pick(otlp_endpoint, env, ENV_ENDPOINT)
    if endpoint is not None:
        endpoint = _check_endpoint(endpoint, "otlp_endpoint" if otlp_endpoint is not None else ENV_ENDPOINT)
        protocol = env.get(ENV_PROTOCOL, "").strip().lower()
        if protocol and protocol != SUPPORTED_PROTOCOL:
            raise ConfigurationError(
                f"{ENV_PROTOCOL}={env[ENV_PROTOCOL]!r} is not supported; use {SUPPORTED_PROTOCOL!r}"
            )
    groups_spec = span_groups if span_groups is not None else env.get(ENV_SPAN_GROUPS)
    try:
        groups = resolve_span_groups(DEFAULT_SPAN_GROUPS if groups_spec is None else groups_spec)
    except CkptEventsError as exc:
        where = "span_groups" if span_groups is not None else ENV_SPAN_GROUPS
        raise ConfigurationError(f"{where}: {exc}") from None
    interval = _interval(metric_export_interval_ms, env)

    wants_otel = endpoint is not None or span_exporter is not None or bool(metric_readers)
    if path is not None:
        if not str(path).strip():
            raise ConfigurationError(f"{'jsonl_path' if jsonl_path is not None else ENV_JSONL} is empty")
        try:
            jsonl_sink = JsonLinesSink(Path(path))
        except OSError as exc:
            where = "jsonl_path" if jsonl_path is not None else ENV_JSONL
            raise ConfigurationError(f"{where}: cannot open {str(path)!r} for appending: {exc}") from None
    if wants_otel:
        resource = _resource(service_name, resource_attributes, env)
        span_sink, metric_sink, meter_provider = _otel(
            endpoint, groups, resource, interval, span_exporter, metric_readers
        )
    try:
        if jsonl_sink is not None:
            subscriptions.append(bus.subscribe(jsonl_sink, name="jsonl"))
        if span_sink is not None and span_sink.enabled:
            subscriptions.append(bus.subscribe(span_sink, name="otel-spans"))
        if metric_sink is not None:
            subscriptions.append(bus.subscribe(metric_sink, name="otel-metrics"))
    except BaseException:
        for sub in subscriptions:
            sub.close()
        raise
    return Configured(
        bus,
        subscriptions=subscriptions,
        span_sink=span_sink,
        metric_sink=metric_sink,
        jsonl_sink=jsonl_sink,
        meter_provider=meter_provider,
    )


def _otel(
    endpoint: str | None,
    groups: frozenset[str],
    resource: Resource,
    interval_ms: int,
    span_exporter: SpanExporter | None,
    metric_readers: Sequence[MetricReader] | None,
) -> tuple[SpanSink | None, MetricSink, MeterProvider]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from sinks._metric_sink import MetricSink
    from sinks._span_sink import SpanSink

    readers: list[MetricReader] = list(metric_readers or ())
    exporter = span_exporter
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=endpoint + "/v1/metrics"), export_interval_millis=interval_ms
            )
        )
        if exporter is None and "checkpoint" in groups:
            exporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces")
    span_sink = None
    if exporter is not None:
        span_sink = SpanSink(exporter, span_groups=groups, resource=resource)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return span_sink, MetricSink(meter_provider), meter_provider


def _pick(value: Any, env: Mapping[str, str], name: str) -> Any:
    if value is not None:
        return value
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip()


def _check_endpoint(endpoint: str, where: str) -> str:
    if not isinstance(endpoint, str):
        raise ConfigurationError(f"{where} must be a URL string, not {endpoint!r}")
    parsed = urllib.parse.urlsplit(endpoint.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigurationError(
            f"{where}={endpoint!r} is not an http(s) URL such as 'http://127.0.0.1:4318'"
        )
    try:
        parsed.port  # noqa: B018  # raises on a bad port
    except ValueError:
        raise ConfigurationError(f"{where}={endpoint!r} has an invalid port") from None
    return endpoint.strip().rstrip("/")


def _interval(value: int | None, env: Mapping[str, str]) -> int:
    where = "metric_export_interval_ms"
    raw: object = value
    if value is None:
        text = env.get(ENV_METRIC_INTERVAL)
        if text is None or not text.strip():
            return DEFAULT_METRIC_INTERVAL_MS
        where, raw = ENV_METRIC_INTERVAL, text.strip()
        try:
            raw = int(text)
        except ValueError:
            pass
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigurationError(f"{where} must be a positive number of milliseconds, not {raw!r}")
    return raw


def _resource(
    service_name: str | None, attributes: Mapping[str, str] | None, env: Mapping[str, str]
) -> Resource:
    # Built explicitly (not Resource.create) so that ``environ`` is the only source read.
    from opentelemetry.sdk.resources import (
        SERVICE_NAME,
        TELEMETRY_SDK_LANGUAGE,
        TELEMETRY_SDK_NAME,
        TELEMETRY_SDK_VERSION,
        Resource,
    )
    from opentelemetry.sdk.version import __version__ as sdk_version

    merged: dict[str, str] = {
        TELEMETRY_SDK_LANGUAGE: "python",
        TELEMETRY_SDK_NAME: "opentelemetry",
        TELEMETRY_SDK_VERSION: sdk_version,
    }
    merged.update(_parse_resource_attributes(env.get(ENV_RESOURCE_ATTRIBUTES, "")))
    if attributes is not None:
        for key, val in attributes.items():
            if not isinstance(key, str) or not isinstance(val, str | bool | int | float):
                raise ConfigurationError(f"resource_attributes: bad entry {key!r}={val!r}")
            merged[key] = str(val) if not isinstance(val, str) else val
    name = service_name if service_name is not None else env.get(ENV_SERVICE_NAME, "").strip() or None
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"service_name must be a non-empty string, not {name!r}")
        merged[SERVICE_NAME] = name.strip()
    merged.setdefault(SERVICE_NAME, DEFAULT_SERVICE_NAME)
    return Resource(merged)


def _parse_resource_attributes(text: str) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigurationError(
                f"{ENV_RESOURCE_ATTRIBUTES} must be 'key=value' pairs separated by commas; "
                f"bad entry {item.strip()!r}"
            )
        parsed[urllib.parse.unquote(key)] = urllib.parse.unquote(value.strip())
    return parsed
