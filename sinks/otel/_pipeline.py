"""OpenTelemetry parts from ``OtelSettings``: exporters, metric readers, the resource.

Every setting is passed to OpenTelemetry's gRPC exporters explicitly, so the caller's
``environ`` decides the endpoint, headers, timeout, compression, TLS files and (metrics) the
temporality preference; what an exporter is not given it reads from ``os.environ``. One read is
beyond our reach: a per-signal ``OTEL_EXPORTER_OTLP_*_TIMEOUT`` in ``os.environ`` is parsed by
the exporter whatever it is given, so a bad one is a ``ConfigurationError`` saying so.
"""

from __future__ import annotations

import importlib
import inspect
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ckpt_events import ConfigurationError
from ckpt_events._errors import shown
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks.otel._env import (
    DEFAULT_METRIC_EXPORT_TIMEOUT_MS,
    GRPC_EXTRA,
    OtelSettings,
    OtlpSettings,
    TlsFiles,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "GRPC_EXTRA",
    "build_resource",
    "check_resource_arguments",
    "metric_readers_for",
    "span_exporters_for",
]


def _grpc_missing(exc: ImportError) -> ConfigurationError:
    return ConfigurationError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc; "
        f"install the grpc extra: pip install '{GRPC_EXTRA}' ({exc})"
    )


def _grpc_module(name: str) -> Any:
    # Imported by name: the grpc extra is optional, and mypy runs without it.
    try:
        return importlib.import_module(f"opentelemetry.exporter.otlp.proto.grpc.{name}")
    except ImportError as exc:
        raise _grpc_missing(exc) from None


class _Headers(tuple[tuple[str, str], ...]):
    """gRPC metadata that is true even when empty: the exporters take ``headers or`` the process's
    header variables, so no headers in ``environ`` sent ``os.environ``'s."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True


def _otlp_kwargs(otlp: OtlpSettings) -> dict[str, Any]:
    """Every option of OpenTelemetry's gRPC exporter, given explicitly: what it is not given it
    reads from ``os.environ`` (headers, timeout, compression, CA and client files), not from the
    mapping ``configure`` was given."""
    from ckpt_events.sinks.otlp._factory import DEFAULT_TIMEOUT_S

    grpc = importlib.import_module("grpc")  # present whenever the grpc exporter is
    compression = "none" if otlp.compression is None else otlp.compression
    insecure = otlp.endpoint.startswith("http://")
    return {
        "endpoint": otlp.endpoint,
        "headers": _Headers(otlp.headers.items()),
        "timeout": DEFAULT_TIMEOUT_S if otlp.timeout_s is None else otlp.timeout_s,
        "compression": {
            "gzip": grpc.Compression.Gzip,
            "deflate": grpc.Compression.Deflate,
            "none": grpc.Compression.NoCompression,
        }[compression],
        "insecure": insecure,
        # Given for https: without them, the exporter read the CA and client files of os.environ.
        "credentials": None if insecure else _grpc_credentials(grpc, otlp.tls_files),
    }


def _grpc_credentials(grpc: Any, files: TlsFiles) -> Any:
    """gRPC channel credentials from ``files`` (checked when the settings were read): the CA, else
    the system's roots; the client pair for mutual TLS (its key may sit in the certificate's file)."""

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as exc:  # gone since the settings were read
            raise ConfigurationError(
                f"{shown(path)} cannot be read ({exc.strerror or exc}); give a PEM file's path"
            ) from None

    chain = read(files.client_certificate)
    key = read(files.client_key) if files.client_key is not None else chain
    return grpc.ssl_channel_credentials(
        root_certificates=read(files.certificate), private_key=key, certificate_chain=chain
    )


#: The first release of OpenTelemetry's gRPC exporter that parses a per-signal timeout with
#: ``float()``: before it, ``int()``, so a fractional one (``0.5``) raised its bare ``ValueError``.
FRACTIONAL_TIMEOUT_SINCE: Final = (1, 35)


def _grpc_exporter_release() -> tuple[int, ...] | None:
    """The installed gRPC exporter's release (``(1, 34, 1)``), ``None`` if it cannot be read."""
    # Here, not at the top: importlib.metadata brings email, csv and zipfile, and only the gRPC
    # path asks (configure() with nothing set loads none of it: tests/test_light_imports.py).
    import importlib.metadata

    try:
        version = importlib.metadata.version("opentelemetry-exporter-otlp-proto-grpc")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts) or None


def _check_process_timeout(signal: str) -> None:
    """``ConfigurationError`` if the process's per-signal timeout, which OpenTelemetry's gRPC
    exporter parses itself whatever it is given, is not a number it parses (its bare
    ``ValueError``): before 1.35 the exporter took whole seconds only."""
    name = f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"
    raw = os.environ.get(name)
    if raw is None:
        return
    try:
        float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{name}={shown(raw)} in the process environment is not a number; OpenTelemetry's gRPC exporter "
            "reads it there itself, whatever configure() is given: fix it or unset it"
        ) from None
    try:
        int(raw)
    except ValueError:
        release = _grpc_exporter_release()
        if release is not None and release < FRACTIONAL_TIMEOUT_SINCE:
            shown_release = ".".join(map(str, release))
            raise ConfigurationError(
                f"{name}={shown(raw)} in the process environment is not a whole number of seconds, which "
                f"opentelemetry-exporter-otlp-proto-grpc {shown_release} requires (it reads it there itself, "
                "whatever configure() is given): give whole seconds, unset it, or upgrade it to 1.35 or later"
            ) from None


def _temporality(preference: str | None) -> dict[type, Any]:
    """``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` as the SDK maps it, for every
    instrument class (the exporter reads the process's preference under what it is given)."""
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    cumulative = AggregationTemporality.CUMULATIVE
    delta = AggregationTemporality.DELTA
    counters = delta if preference in ("delta", "lowmemory") else cumulative
    return {
        Counter: counters,
        UpDownCounter: cumulative,
        Histogram: counters,
        ObservableCounter: delta if preference == "delta" else cumulative,
        ObservableUpDownCounter: cumulative,
        ObservableGauge: cumulative,
    }


def span_exporters_for(settings: OtelSettings) -> list[tuple[str, SpanExporter]]:
    """(name, exporter) for each trace exporter the settings ask for that goes through
    OpenTelemetry: the console and OTLP over gRPC. (OTLP over HTTP is our own
    ``OtlpSpanSink``, built by ``ckpt_events.sinks.otlp._factory``.)"""
    exporters: list[tuple[str, SpanExporter]] = []
    for name in settings.traces:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(("console", ConsoleSpanExporter()))
            continue
        otlp = settings.traces_otlp
        assert otlp is not None
        if otlp.protocol == "grpc":
            grpc_exporter = _grpc_module("trace_exporter")
            _check_process_timeout("TRACES")
            exporters.append(("otlp", grpc_exporter.OTLPSpanExporter(**_otlp_kwargs(otlp))))
    return exporters


def metric_readers_for(
    settings: OtelSettings, *, cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT
) -> list[MetricReader]:
    """A periodic reader for each metric exporter the settings ask for that goes through
    OpenTelemetry: the console and OTLP over gRPC. ``cardinality_limit`` is also the reader's
    per instrument, where the SDK has one (opentelemetry-sdk >= 1.45.2; its default is 2,000),
    so raising ``MetricSink``'s is not undone by the SDK's."""
    from opentelemetry.sdk.metrics import Counter, Histogram, ObservableGauge, UpDownCounter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from ckpt_events.sinks.otel._this_process import ThisProcessOnly

    limits: dict[str, Any] = {}
    if "cardinality_limits" in inspect.signature(PeriodicExportingMetricReader).parameters:
        classes = (Counter, UpDownCounter, Histogram, ObservableGauge)  # what MetricSink creates
        limits["cardinality_limits"] = dict.fromkeys(classes, cardinality_limit)
    # Every exporter first: a reader's export thread runs from its start, and one built before a
    # later exporter failed (the console's, then gRPC without its extra) went on warning every
    # interval that it was never registered.
    exporters = _metric_exporters(settings)
    return [
        PeriodicExportingMetricReader(
            ThisProcessOnly(exporter),  # not from a forked child's copy (see the module)
            export_interval_millis=settings.metric_interval_ms,
            # Always given: unset, the SDK read OTEL_METRIC_EXPORT_TIMEOUT from os.environ, not
            # from the mapping configure() was given.
            export_timeout_millis=DEFAULT_METRIC_EXPORT_TIMEOUT_MS
            if settings.metric_export_timeout_ms is None
            else settings.metric_export_timeout_ms,
            **limits,
        )
        for exporter in exporters
    ]


def _metric_exporters(settings: OtelSettings) -> list[MetricExporter]:
    """The metric exporters of ``metric_readers_for``'s readers, in the settings' order."""
    exporters: list[MetricExporter] = []
    for name in settings.metrics:
        if name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            exporters.append(ConsoleMetricExporter())
        elif name == "prometheus":
            continue  # our own scrape endpoint over our aggregation (ckpt_events.sinks.prometheus)
        else:
            otlp = settings.metrics_otlp
            assert otlp is not None
            if otlp.protocol == "grpc":
                metric_exporter = _grpc_module("metric_exporter")
                _check_process_timeout("METRICS")
                exporters.append(
                    metric_exporter.OTLPMetricExporter(
                        **_otlp_kwargs(otlp), preferred_temporality=_temporality(settings.metric_temporality)
                    )
                )
            # else OTLP over HTTP: our own OtlpMetricSink (ckpt_events.sinks.otlp._factory)
    return exporters


def check_resource_arguments(service_name: object, attributes: object, instance_id: object) -> None:
    """``ConfigurationError`` naming the argument unless ``service_name`` is ``None`` or a
    non-empty string, ``attributes`` ``None`` or a mapping of str to str, bool, int or float, and
    ``instance_id`` ``None`` or a string (``configure`` checks them before either of its modes:
    a list of pairs was an ``AttributeError`` in process and taken as a dict by the child)."""
    if attributes is not None:
        if not isinstance(attributes, Mapping):
            raise ConfigurationError(
                f"resource_attributes must be a mapping of str to str, bool, int or float, not "
                f"{shown(attributes)}"
            )
        for key, val in attributes.items():
            if not isinstance(key, str) or not isinstance(val, str | bool | int | float):
                raise ConfigurationError(
                    f"resource_attributes: bad entry {shown(key)}={shown(val)}; "
                    "use str keys and str, bool, int or float values"
                )
    if service_name is not None and (not isinstance(service_name, str) or not service_name.strip()):
        raise ConfigurationError(f"service_name must be a non-empty string, not {shown(service_name)}")
    # A blank one was taken: every process then shared service.instance.id "" (no fresh UUID).
    if instance_id is not None and (not isinstance(instance_id, str) or not instance_id.strip()):
        raise ConfigurationError(f"service_instance_id must be a non-empty string, not {shown(instance_id)}")


def build_resource(
    settings: OtelSettings,
    *,
    service_name: str | None,
    attributes: Mapping[str, str] | None,
    instance_id: str | None,
    default_service_name: str,
) -> Resource:
    """``Resource.create`` (so resource detectors run) with, winning in this order: the
    arguments, then ``environ``'s ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``.
    ``service.instance.id`` is ``instance_id`` or a fresh UUID, one per configured process.
    ``os.environ``'s ``OTEL_RESOURCE_ATTRIBUTES`` is not read (``environ``'s is)."""
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource

    check_resource_arguments(service_name, attributes, instance_id)
    merged: dict[str, str] = dict(settings.resource_attributes)
    # The environment first (OTEL_SERVICE_NAME over its attributes, as the spec says), then the
    # arguments over both: a service.name in resource_attributes= lost to OTEL_SERVICE_NAME.
    if settings.service_name is not None:
        merged[SERVICE_NAME] = settings.service_name
    if attributes is not None:
        for key, val in attributes.items():
            merged[key] = val if isinstance(val, str) else str(val)
    if service_name is not None:
        merged[SERVICE_NAME] = service_name.strip()
    merged.setdefault(SERVICE_NAME, default_service_name)
    if instance_id is not None:
        merged[SERVICE_INSTANCE_ID] = instance_id
    merged.setdefault(SERVICE_INSTANCE_ID, str(uuid.uuid4()))
    resource = Resource.create(merged)
    # Resource.create's OTEL detector reads os.environ's OTEL_RESOURCE_ATTRIBUTES whatever
    # ``environ`` says: its pairs were added unchecked (%FF as U+FFFD). ``merged`` holds
    # ``environ``'s; drop the keys only the process's variable named.
    leaked = _process_resource_keys() - merged.keys()
    if not leaked:
        return resource
    kept = {key: value for key, value in resource.attributes.items() if key not in leaked}
    return Resource(kept, resource.schema_url)


def _process_resource_keys() -> set[str]:
    """The keys of ``os.environ``'s ``OTEL_RESOURCE_ATTRIBUTES``, as OpenTelemetry's detector
    reads them (``service.name`` is always in the resource built here)."""
    raw = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return {item.split("=", 1)[0].strip() for item in raw.split(",") if "=" in item}
