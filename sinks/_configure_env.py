"""What ``configure`` reads and checks before it builds anything: the ``CKPT_EVENTS_*``
variables, its arguments, and the extras an export needs.

Each bad value raises ``ConfigurationError`` naming the argument or variable and what is valid,
in one line, before a sink, file, thread or process exists (both modes, in process and in an
export process, check the same way). The ``OTEL_*`` variables are parsed by
``ckpt_events.sinks.otel._env``; ``ckpt_events.sinks._configure`` builds and subscribes.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ckpt_events import CkptEventsError, ConfigurationError
from ckpt_events._errors import InvalidTypeError, shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks._cardinality import check_cardinality_limit
from ckpt_events.sinks.otel._env import MAX_METRIC_INTERVAL_MS, OtelSettings, read_otel_env
from ckpt_events.sinks.stall_watch import ENV_STALL_AFTER
from ckpt_events.vocab import resolve_span_groups

__all__ = [
    "DEFAULT_SPAN_GROUPS",
    "ENV_DISABLED",
    "ENV_EXPORT_PROCESS",
    "ENV_JSONL",
    "ENV_METRIC_INTERVAL",
    "ENV_SPAN_GROUPS",
    "check_installed",
    "check_jsonl_path",
    "check_otel_parts",
    "checked_settings",
    "export_process_on",
    "jsonl_path_of",
    "stall_after",
    "switched_off",
    "warn_multiprocess_dir",
]

ENV_METRIC_INTERVAL: Final = "OTEL_METRIC_EXPORT_INTERVAL"
ENV_SPAN_GROUPS: Final = "CKPT_EVENTS_SPAN_GROUPS"
ENV_JSONL: Final = "CKPT_EVENTS_JSONL"
#: The off switch: ``true`` subscribes nothing, whatever the arguments and other variables.
ENV_DISABLED: Final = "CKPT_EVENTS_DISABLED"
ENV_EXPORT_PROCESS: Final = "CKPT_EVENTS_EXPORT_PROCESS"

DEFAULT_SPAN_GROUPS: Final = "default,checkpoint"
#: prometheus-client's multiprocess mode: its MultiProcessCollector reads only the files its
#: own Counter/Gauge/Histogram objects write in this folder, none of ours.
ENV_PROMETHEUS_MULTIPROC: Final = "PROMETHEUS_MULTIPROC_DIR"

logger: Final = library_logger("ckpt_events.sinks")


def switched_off(env: Mapping[str, str]) -> bool:
    raw = env.get(ENV_DISABLED, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ConfigurationError(f"{ENV_DISABLED}={shown(env[ENV_DISABLED])}: use true or false")
    return raw == "true"


def checked_settings(
    env: Mapping[str, str],
    *,
    otlp_endpoint: str | None,
    span_groups: str | Iterable[str] | None,
    metric_export_interval_ms: int | None,
    metric_cardinality_limit: int,
) -> tuple[OtelSettings, frozenset[str], int]:
    """The settings of ``env`` with the arguments applied, the span groups and the cardinality
    limit; a bad argument or variable raises ``ConfigurationError`` naming it."""
    if otlp_endpoint is not None and not isinstance(otlp_endpoint, str):
        raise ConfigurationError(f"otlp_endpoint must be a URL string, not {shown(otlp_endpoint)}")
    settings = read_otel_env(env, otlp_endpoint=otlp_endpoint)
    groups_spec = span_groups if span_groups is not None else env.get(ENV_SPAN_GROUPS)
    try:
        groups = resolve_span_groups(DEFAULT_SPAN_GROUPS if groups_spec is None else groups_spec)
    except CkptEventsError as exc:
        where = "span_groups" if span_groups is not None else ENV_SPAN_GROUPS
        raise ConfigurationError(f"{where}: {exc}") from None
    if metric_export_interval_ms is not None:
        interval = metric_export_interval_ms
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int)
            or not 1 <= interval <= MAX_METRIC_INTERVAL_MS
        ):
            raise ConfigurationError(
                f"metric_export_interval_ms must be a whole number of milliseconds from 1 to "
                f"{MAX_METRIC_INTERVAL_MS}, not {shown(interval)}"
            )
        settings = _replaced(settings, metric_interval_ms=interval)
    try:
        cardinality_limit = check_cardinality_limit(metric_cardinality_limit, "metric_cardinality_limit")
    except CkptEventsError as exc:
        raise ConfigurationError(str(exc)) from None
    return settings, groups, cardinality_limit


def _replaced(settings: OtelSettings, **changes: Any) -> OtelSettings:
    import msgspec

    return msgspec.structs.replace(settings, **changes)


def stall_after(env: Mapping[str, str]) -> float | None:
    """The seconds of ``CKPT_EVENTS_STALL_AFTER``, or ``None`` when it is unset or blank; anything
    but a finite number > 0 raises ``ConfigurationError`` naming the variable."""
    raw = env.get(ENV_STALL_AFTER, "").strip()
    if not raw:
        return None
    try:
        after = float(raw)
    except ValueError:
        after = float("nan")
    if not after > 0 or after == float("inf"):
        raise ConfigurationError(
            f"{ENV_STALL_AFTER} must be a finite number of seconds > 0, not {shown(raw)}"
        )
    return after


def export_process_on(export_process: bool | None, env: Mapping[str, str]) -> bool:
    if export_process is not None:
        if not isinstance(export_process, bool):
            raise ConfigurationError(f"export_process must be True or False, not {shown(export_process)}")
        return export_process
    raw = env.get(ENV_EXPORT_PROCESS, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ConfigurationError(f"{ENV_EXPORT_PROCESS}={shown(env[ENV_EXPORT_PROCESS])}: use true or false")
    return raw == "true"


def check_otel_parts(
    tracer_provider: object, meter_provider: object, span_exporter: object, metric_readers: object
) -> list[Any] | None:
    """The OpenTelemetry parts passed in, checked (``ConfigurationError`` naming the argument);
    ``metric_readers`` read once, as a list. An exporter or readers beside a provider of the
    caller's were dropped without a word: they go to what ``configure`` builds, so the two are
    refused together, with where they go instead."""
    # The providers' own checks, made before anything is built: made when their sinks were,
    # a wrong provider was refused after the JSON-lines file had been created.
    if tracer_provider is not None:
        from ckpt_events.sinks.otel._span_sink import _processors_of

        _processors_of(tracer_provider)  # type: ignore[arg-type]  # what it checks
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise InvalidTypeError(
            f"meter_provider must be an OpenTelemetry MeterProvider, not {shown(meter_provider)}"
        )
    if tracer_provider is not None and span_exporter is not None:
        raise ConfigurationError(
            "span_exporter= goes to the tracer provider configure() builds; with tracer_provider=, add "
            "it to your provider instead (provider.add_span_processor(BatchSpanProcessor(exporter)))"
        )
    if span_exporter is not None and (
        isinstance(span_exporter, type) or not callable(getattr(span_exporter, "export", None))
    ):
        raise ConfigurationError(
            "span_exporter must be an OpenTelemetry SpanExporter instance (with export()), "
            f"not {shown(span_exporter)}"
        )
    if metric_readers is None:
        return None
    if isinstance(metric_readers, str | bytes) or not isinstance(metric_readers, Iterable):
        raise ConfigurationError(
            f"metric_readers must be a list of MetricReader instances, not {shown(metric_readers)}"
        )
    readers = list(metric_readers)
    if meter_provider is not None and readers:
        raise ConfigurationError(
            "metric_readers= go to the meter provider configure() builds; with meter_provider=, give "
            "them to your provider instead (MeterProvider(metric_readers=[...]))"
        )
    if readers:
        try:
            from opentelemetry.sdk.metrics.export import MetricReader
        except ImportError:
            raise ConfigurationError(
                "metric_readers need the OpenTelemetry SDK: pip install 'ckpt-events[otel]'"
            ) from None
        for reader in readers:
            if not isinstance(reader, MetricReader):
                raise ConfigurationError(
                    f"metric_readers must hold MetricReader instances, not {shown(reader)}"
                )
    return readers


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (the export process's
    parent imports no exporter)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing: opentelemetry for opentelemetry.sdk
        return False


def check_installed(settings: OtelSettings) -> None:
    """``ConfigurationError`` naming the extra to install when ``settings`` ask for an export
    whose package is missing; checked before either mode builds anything. Without it, an OTLP
    endpoint or ``OTEL_TRACES_EXPORTER=console`` without the SDK was a bare ModuleNotFoundError
    from deep inside (in the export process, a child's traceback on stderr)."""
    if settings.sdk_disabled:
        return
    asked = [f"traces to {name}" for name in settings.traces]
    asked += [f"metrics to {name}" for name in settings.metrics if name != "prometheus"]
    # opentelemetry.sdk, not opentelemetry: the server extra's FastAPI brings the API alone.
    if asked and not _installed("opentelemetry.sdk"):
        raise ConfigurationError(
            f"exporting {' and '.join(asked)} needs OpenTelemetry's SDK, which is not installed: "
            "pip install 'ckpt-events[otel]'"
        )
    if "prometheus" in settings.metrics and not _installed("prometheus_client"):
        raise ConfigurationError(
            # The words of PrometheusEndpoint's own check, made here before the export process starts.
            "OTEL_METRICS_EXPORTER=prometheus needs prometheus-client: pip install 'ckpt-events[prometheus]'"
        )


def warn_multiprocess_dir(settings: OtelSettings, env: Mapping[str, str], *, own_metrics: bool) -> None:
    """One warning when ``PROMETHEUS_MULTIPROC_DIR`` is set and our metrics go nowhere: a user
    scraping one ``MultiProcessCollector`` page for all workers found none of our series on it
    (uvicorn --workers 2, 200 commits: 0 of them), and nothing said why. Silent when any metric
    export is configured (``own_metrics``: a ``meter_provider`` or ``metric_readers``, whose
    destination is not known here) or ``OTEL_METRICS_EXPORTER`` is set at all (``none``: on
    purpose)."""
    if not env.get(ENV_PROMETHEUS_MULTIPROC, "").strip() or settings.sdk_disabled or own_metrics:
        return
    if settings.metrics or env.get("OTEL_METRICS_EXPORTER", "").strip():
        return
    logger.warning(
        "ckpt-events: PROMETHEUS_MULTIPROC_DIR is set, but ckpt-events writes none of its metrics "
        "to prometheus-client's multiprocess files, so a MultiProcessCollector /metrics page has "
        "none of them: serve them from each worker with OTEL_METRICS_EXPORTER=prometheus and "
        "CKPT_EVENTS_PROMETHEUS_PORTS=N (N workers), export them over OTLP, or set "
        "OTEL_METRICS_EXPORTER=none to want none"
    )


def check_jsonl_path(path: object, where: str) -> None:
    """``ConfigurationError`` naming ``where`` unless ``path`` is ``None`` or a path the OS can
    open (a NUL byte in it was ``open``'s bare ``ValueError``)."""
    if path is None:
        return
    if not isinstance(path, str | os.PathLike):
        raise ConfigurationError(f"{where} must be a path (a str or os.PathLike), not {shown(path)}")
    if "\0" in str(os.fspath(path)):
        raise ConfigurationError(f"{where}={shown(str(path))} has a NUL byte; a file path cannot hold one")
    try:
        os.fsencode(path)
    except UnicodeError:  # a lone surrogate: open()'s bare UnicodeEncodeError
        raise ConfigurationError(
            f"{where}={shown(str(path))} cannot be encoded as a file name; use a path of valid characters"
        ) from None


def jsonl_path_of(
    jsonl_path: str | os.PathLike[str] | None, env: Mapping[str, str]
) -> tuple[str | os.PathLike[str], str] | None:
    """The JSON-lines path asked for (``jsonl_path``, else ``CKPT_EVENTS_JSONL`` stripped) and
    where it came from (the argument's or the variable's name, for an error), or ``None`` when
    neither asks for one; an empty or unusable path raises ``ConfigurationError`` naming it."""
    where = "jsonl_path" if jsonl_path is not None else ENV_JSONL
    path: Any = jsonl_path
    if path is None:
        raw = env.get(ENV_JSONL)
        if raw is None or not raw.strip():
            return None
        path = raw.strip()
        check_jsonl_path(path, where)
    if not str(path).strip():
        raise ConfigurationError(f"{where} is empty")
    return path, where
