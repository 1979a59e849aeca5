"""``configure``: the standard set of sinks from arguments and the OpenTelemetry environment.

With nothing set, nothing is subscribed, and every emit site stays off. What is asked for is
read and checked by ``ckpt_events.sinks._configure_env`` (the ``CKPT_EVENTS_*`` variables and the
arguments) and ``ckpt_events.sinks.otel._env`` (the ``OTEL_*`` ones; README: "Environment
variables"), before anything is built; this module builds and subscribes. The OpenTelemetry
sinks are built by ``ckpt_events.sinks._otel_build`` (their exporters and resource by
``ckpt_events.sinks.otel._pipeline``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ckpt_events import Bus, ConfigurationError, Sink, Subscription
from ckpt_events._errors import InvalidTypeError, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks._configure_env import (
    ENV_JSONL,
    check_installed,
    check_jsonl_path,
    check_otel_parts,
    checked_settings,
    export_process_on,
    jsonl_path_of,
    stall_after,
    switched_off,
    warn_multiprocess_dir,
)
from ckpt_events.sinks._configured import Configured
from ckpt_events.sinks._destinations import check_free, claim, destinations, provider_places
from ckpt_events.sinks._otel_build import Built, otel_sinks
from ckpt_events.sinks.otel._env import OtelSettings, check_environ
from ckpt_events.sinks.otel._pipeline import check_resource_arguments
from ckpt_events.sinks.stall_watch import ENV_STALL_AFTER, StallWatch

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from ckpt_events.sinks._export.process import ExportProcess
    from ckpt_events.sinks._otel_build import AnyMetricSink, AnySpanSink
    from ckpt_events.sinks.jsonl._writer import JsonLinesSink
    from ckpt_events.sinks.prometheus import PrometheusEndpoint

__all__ = ["aconfigure", "configure"]


def configure(
    bus: Bus,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    jsonl_path: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    span_groups: str | Iterable[str] | None = None,
    service_name: str | None = None,
    service_instance_id: str | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    metric_export_interval_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
    metric_cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT,
    export_process: bool | None = None,
) -> Configured:
    """Subscribe the standard sinks to ``bus``; arguments win over the environment.

    * JSON lines: ``jsonl_path`` or ``CKPT_EVENTS_JSONL``.
    * OpenTelemetry, from the standard variables (``OTEL_SDK_DISABLED``,
      ``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER``, ``OTEL_EXPORTER_OTLP_*`` base and
      per signal, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_PROPAGATORS``,
      ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_METRIC_EXPORT_INTERVAL``,
      ``OTEL_METRIC_EXPORT_TIMEOUT``, the span attribute limits ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``
      / ``_COUNT_LIMIT`` and their generic ``OTEL_ATTRIBUTE_*``).
      ``otlp_endpoint`` is a base URL winning over every endpoint variable. Spans use
      ``span_groups`` or ``CKPT_EVENTS_SPAN_GROUPS`` (default ``"default,checkpoint"``).
    * OTLP over HTTP (``http/protobuf``, ``http/json``) is our own ``OtlpSpanSink`` and
      ``OtlpMetricSink``: spans and aggregated metric points encoded straight from the events;
      gRPC and console go through OpenTelemetry's exporters.
    * A ``StallWatch`` when ``CKPT_EVENTS_STALL_AFTER`` is a number of seconds.
    * ``tracer_provider``: our finished spans go through its span processors (with its
      resource), and no span exporter is built. ``meter_provider``: the metric sink records
      through it, and none is built (nor shut down here).
    * ``span_exporter`` / ``metric_readers`` plug in other OpenTelemetry parts (tests)
      besides what the environment asks for.
    * ``metric_cardinality_limit`` (default 2,000, OpenTelemetry's): attribute sets kept per
      instrument by every metric sink built here (and by the SDK readers built here); a
      measurement of a set first seen past it goes to the ``otel.metric.overflow=true`` series.

    * ``export_process`` (or ``CKPT_EVENTS_EXPORT_PROCESS=true``): every sink above but the
      stall watch runs in a child process (``ExportProcess``) fed each batch through a pipe;
      this process keeps the events' building, one JSON encoding per batch and the write. It
      cannot take the in-process parts (``tracer_provider``, ``meter_provider``,
      ``span_exporter``, ``metric_readers``). The child's Prometheus URL is
      ``Configured.export_process.prometheus_url``. ``configure`` waits for the child to build
      its sinks (0.2-0.3 s measured, at most 20 s) in the calling thread: on the
      event loop, the loop is held that long; ``aconfigure`` waits in a worker thread instead.

    ``environ`` (default ``os.environ``) is the only mapping read. With nothing set, or with
    ``OTEL_SDK_DISABLED=true`` (OpenTelemetry off; JSON lines still honoured), nothing
    OpenTelemetry is subscribed. ``CKPT_EVENTS_DISABLED=true`` subscribes nothing at all, the
    arguments included: the emit sites stay on the no-op path without a change to the code. A
    bad value raises ``ConfigurationError`` naming the argument or variable and what is valid.
    Whatever fails, what ``configure`` had built is stopped before the error reaches you: no
    export thread, metric reader, open file or export process is left running. While the
    returned ``Configured`` is open, another ``configure()`` of ``bus`` to one of its OTLP
    endpoints or its JSON-lines file raises ``ConfigurationError`` (every span sent twice).
    """
    planned = _planned(
        bus,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        jsonl_path=jsonl_path,
        otlp_endpoint=otlp_endpoint,
        span_groups=span_groups,
        service_name=service_name,
        service_instance_id=service_instance_id,
        resource_attributes=resource_attributes,
        metric_export_interval_ms=metric_export_interval_ms,
        environ=environ,
        span_exporter=span_exporter,
        metric_readers=metric_readers,
        metric_cardinality_limit=metric_cardinality_limit,
        export_process=export_process,
    )
    if isinstance(planned, Configured):
        return planned
    from ckpt_events.sinks._export.process import ExportProcess

    return planned.finish(ExportProcess.start(planned.arguments))


async def aconfigure(
    bus: Bus,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    jsonl_path: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    span_groups: str | Iterable[str] | None = None,
    service_name: str | None = None,
    service_instance_id: str | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    metric_export_interval_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
    metric_cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT,
    export_process: bool | None = None,
) -> Configured:
    """``configure`` for a caller on the event loop: the same arguments, checks, errors and
    result, with the one slow part, starting the export process (``export_process=True`` or
    ``CKPT_EVENTS_EXPORT_PROCESS=true``: a Python interpreter that imports the sinks and builds
    them, 0.2-0.3 s measured here, at most 20 s), waited for in a worker thread, so
    the loop runs on meanwhile (``configure`` holds it that long: a 1 ms ticker's worst gap was
    the whole start, with ``aconfigure`` 3-5 ms). Without an export process it is
    ``configure``, building the sinks in this thread. Cancelled while the child starts, the
    start is waited for (never abandoned), then the child is ended and nothing is subscribed."""
    planned = _planned(
        bus,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        jsonl_path=jsonl_path,
        otlp_endpoint=otlp_endpoint,
        span_groups=span_groups,
        service_name=service_name,
        service_instance_id=service_instance_id,
        resource_attributes=resource_attributes,
        metric_export_interval_ms=metric_export_interval_ms,
        environ=environ,
        span_exporter=span_exporter,
        metric_readers=metric_readers,
        metric_cardinality_limit=metric_cardinality_limit,
        export_process=export_process,
    )
    if isinstance(planned, Configured):
        return planned
    from ckpt_events.sinks._export.process import ExportProcess

    # Not abandoned on cancel: the thread's child is always ours to end (``discard``).
    process = await anyio.to_thread.run_sync(ExportProcess.start, planned.arguments)
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        process.discard()
        raise
    return planned.finish(process)


def _planned(
    bus: Bus,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    jsonl_path: str | os.PathLike[str] | None = None,
    otlp_endpoint: str | None = None,
    span_groups: str | Iterable[str] | None = None,
    service_name: str | None = None,
    service_instance_id: str | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    metric_export_interval_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
    metric_cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT,
    export_process: bool | None = None,
) -> Configured | _ExportPlan:
    """``configure`` up to starting an export process: what it returns, or with an export
    process asked for, what is left to do once the child is up (``_ExportPlan``)."""
    if not isinstance(bus, Bus):  # was a TypeError from a weak reference, naming no argument
        raise InvalidTypeError(f"bus must be a ckpt_events.Bus, not {shown(bus)}")
    env = os.environ if environ is None else check_environ(environ, "environ")
    if switched_off(env):
        return Configured(bus)
    check_jsonl_path(jsonl_path, "jsonl_path")
    if isinstance(span_groups, Iterable) and not isinstance(span_groups, str):
        span_groups = list(span_groups)  # read once: checked here, then used (or sent to the child)
    # Checked before either mode, so a bad value is the same ConfigurationError in both.
    settings, groups, cardinality_limit = checked_settings(
        env,
        otlp_endpoint=otlp_endpoint,
        span_groups=span_groups,
        metric_export_interval_ms=metric_export_interval_ms,
        metric_cardinality_limit=metric_cardinality_limit,
    )
    check_resource_arguments(service_name, resource_attributes, service_instance_id)
    metric_readers = check_otel_parts(tracer_provider, meter_provider, span_exporter, metric_readers)
    check_installed(settings)
    places = destinations(settings, jsonl_path, env, ENV_JSONL)
    if not settings.sdk_disabled:  # with the SDK off, a provider given is not used
        places += provider_places(tracer_provider, meter_provider)
    check_free(bus, places)  # one bus configured twice to one place: every span sent twice
    if export_process_on(export_process, env):
        return _export_plan(
            bus,
            env,
            settings,
            places,
            in_process={
                "tracer_provider": tracer_provider,
                "meter_provider": meter_provider,
                "span_exporter": span_exporter,
                "metric_readers": metric_readers,
            },
            arguments={
                "jsonl_path": None if jsonl_path is None else os.fspath(jsonl_path),
                "otlp_endpoint": otlp_endpoint,
                "span_groups": span_groups,
                "service_name": service_name,
                "service_instance_id": service_instance_id,
                "resource_attributes": None if resource_attributes is None else dict(resource_attributes),
                "metric_export_interval_ms": metric_export_interval_ms,
                "metric_cardinality_limit": metric_cardinality_limit,
            },
        )
    # Here, past the export process's branch: its child runs this with our environment and says it once.
    warn_multiprocess_dir(settings, env, own_metrics=meter_provider is not None or bool(metric_readers))
    stall_watch = _stall_watch(env, bus)
    built = Built()
    try:
        jsonl_sink = _jsonl(jsonl_path, env)
        if jsonl_sink is not None:
            built.add(jsonl_sink, type(jsonl_sink).close)
        span_sinks: list[tuple[str, AnySpanSink]] = []
        metric_sinks: list[tuple[str, AnyMetricSink]] = []
        own_provider: MeterProvider | None = None
        if not settings.sdk_disabled:
            span_sinks, metric_sinks, own_provider = otel_sinks(
                settings,
                groups,
                built,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                span_exporter=span_exporter,
                metric_readers=metric_readers,
                resource_args=(service_name, resource_attributes, service_instance_id),
                cardinality_limit=cardinality_limit,
            )
        plain_sinks: list[tuple[str, Sink]] = []
        if jsonl_sink is not None:
            plain_sinks.append(("jsonl", jsonl_sink))
        if stall_watch is not None:
            plain_sinks.append(("stall-watch", stall_watch))
        subscriptions, prometheus = _subscribe(
            bus, settings, plain_sinks, span_sinks, metric_sinks, cardinality_limit
        )
    except BaseException:
        built.release()
        raise
    configured = Configured(
        bus,
        subscriptions=subscriptions,
        span_sinks=[sink for _, sink in span_sinks],
        metric_sinks=[sink for _, sink in metric_sinks],
        jsonl_sink=jsonl_sink,
        meter_provider=own_provider,
        settings=settings,
        prometheus=prometheus,
    )
    claim(bus, places, configured)
    _closed_with(bus, configured)
    return configured


def _closed_with(bus: Bus, configured: Configured) -> None:
    """Close ``configured`` as ``bus`` closes, after its sinks, if it is still open then: a sync
    server's ``configure(bus)`` beside ``BusThread().start()`` is never closed by hand, and the
    meter provider's export thread and the Prometheus endpoint's thread and port outlived the bus
    (and at exit the provider shut down before the bus drained, its last records lost)."""
    pid = os.getpid()

    async def close() -> None:
        # Not in a process forked after configure() (gunicorn --preload, the bus entered in each
        # worker): the endpoint's thread, the reader's thread and the child are the parent's, and
        # closing them here waited for ever on a scrape thread that is not in this process.
        if os.getpid() == pid:
            await configured.aclose()

    bus._on_close(configured, close)


def _subscribe(
    bus: Bus,
    settings: OtelSettings,
    plain_sinks: Sequence[tuple[str, Sink]],
    span_sinks: Sequence[tuple[str, AnySpanSink]],
    metric_sinks: Sequence[tuple[str, AnyMetricSink]],
    cardinality_limit: int,
) -> tuple[list[Subscription], PrometheusEndpoint | None]:
    """Subscribe every sink by name (``plain_sinks`` as they are, then the enabled span sinks, then the
    metric sinks) and the scrape endpoint's; on a failure, close what was subscribed."""
    batch = settings.batch
    subscriptions: list[Subscription] = []
    try:
        for name, sink in plain_sinks:
            subscriptions.append(bus.subscribe(sink, name=name))
        for name, span_sink in span_sinks:
            if not span_sink.enabled:
                continue
            # Here, not at the top: the OTLP modules (16 ms) load only when a span sink is made.
            from ckpt_events.sinks.otlp._span_sink import OtlpSpanSink

            if isinstance(span_sink, OtlpSpanSink):  # batches and bounds its own queue (OTEL_BSP_*)
                subscriptions.append(bus.subscribe(span_sink, name=name))
            else:
                subscriptions.append(
                    bus.subscribe(
                        span_sink,
                        name=name,
                        buffer_size=batch.max_buffer,
                        batch_size=batch.max_export_batch,
                        linger=batch.linger_s,
                    )
                )
        for name, metric_sink in metric_sinks:
            subscriptions.append(bus.subscribe(metric_sink, name=name))
        prometheus = _prometheus(bus, settings, metric_sinks, subscriptions, cardinality_limit)
    except BaseException:
        for sub in subscriptions:
            sub.close()
        raise
    return subscriptions, prometheus


def _prometheus(
    bus: Bus,
    settings: OtelSettings,
    metric_sinks: Sequence[tuple[str, AnyMetricSink]],
    subscriptions: list[Subscription],
    cardinality_limit: int,
) -> PrometheusEndpoint | None:
    """The scrape endpoint over our own aggregation: the ``OtlpMetricSink``'s when OTLP is on
    too (one aggregation, read by the exporter and by each scrape), else a ``PrometheusSink``
    subscribed here."""
    if "prometheus" not in settings.metrics or settings.sdk_disabled:
        return None
    from ckpt_events.sinks.otlp._metric_sink import OtlpMetricSink
    from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink, TotalsSource

    source: TotalsSource
    own = [sink for _, sink in metric_sinks if isinstance(sink, OtlpMetricSink)]
    if own:
        source = own[0]
    else:
        source = PrometheusSink(cardinality_limit=cardinality_limit)
        subscriptions.append(bus.subscribe(source, name="prometheus"))
    return PrometheusEndpoint(
        source, settings.prometheus_host, settings.prometheus_port, bus=bus, ports=settings.prometheus_ports
    )


class _ExportPlan:
    """What ``configure`` does once its export process is up (``finish``): checked, with the
    child's arguments, not started, so ``aconfigure`` can start it in a worker thread."""

    def __init__(
        self,
        bus: Bus,
        env: Mapping[str, str],
        settings: OtelSettings,
        places: list[str],
        arguments: Mapping[str, object],
    ) -> None:
        self.bus = bus
        self.env = env
        self.settings = settings
        self.places = places
        # The child runs the sinks in process (export_process=False wins over the variable).
        child_env = {key: value for key, value in env.items() if key != ENV_STALL_AFTER}
        self.arguments: Mapping[str, object] = {**arguments, "environ": child_env, "export_process": False}

    def finish(self, process: ExportProcess) -> Configured:
        """Subscribe ``process`` (and the stall watch, which stays here: it watches this bus and
        emits onto it, so its events reach the child too); ``process`` is ended if that fails."""
        bus = self.bus
        try:
            # Again: another configure() of the bus may have claimed a place while it started.
            check_free(bus, self.places)
            stall_watch = _stall_watch(self.env, bus)
        except BaseException:
            process.discard()
            raise
        if not process.sinks:  # nothing set: as in process, no child kept and every site stays off
            process.discard()
            return Configured(
                bus,
                subscriptions=[bus.subscribe(stall_watch, name="stall-watch")] if stall_watch else [],
                settings=self.settings,
            )
        subscriptions: list[Subscription] = []
        try:
            subscriptions.append(bus.subscribe(process, name="export-process"))
            if stall_watch is not None:
                subscriptions.append(bus.subscribe(stall_watch, name="stall-watch"))
        except BaseException:
            for sub in subscriptions:
                sub.close()
            process.discard()  # it was left running, its input open, for as long as this process
            raise
        configured = Configured(
            bus, subscriptions=subscriptions, export_process=process, settings=self.settings
        )
        claim(bus, self.places, configured)
        _closed_with(bus, configured)
        return configured


def _export_plan(
    bus: Bus,
    env: Mapping[str, str],
    settings: OtelSettings,
    places: list[str],
    *,
    in_process: Mapping[str, object],
    arguments: Mapping[str, object],
) -> _ExportPlan:
    """``configure`` with the sinks in an ``ExportProcess``, checked and not yet started.
    ``settings`` (the same the child parses) is kept on the ``Configured``: it was left at its
    defaults, so ``sample_ratio`` said 1.0 whatever ``OTEL_TRACES_SAMPLER_ARG`` asked for."""
    given = [name for name, value in in_process.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"export_process cannot take {', '.join(given)}: they live in this process; "
            "pass them without export_process, or set the exporters through the environment"
        )
    return _ExportPlan(bus, env, settings, places, arguments)


def _jsonl(jsonl_path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> JsonLinesSink | None:
    """The JSON-lines sink asked for, opened for appending, or ``None``."""
    asked = jsonl_path_of(jsonl_path, env)
    if asked is None:
        return None
    path, where = asked
    # Here, not at the top: the writer (with its encoders) loads only when a log is asked for.
    from ckpt_events.sinks.jsonl._writer import JsonLinesSink

    try:
        return JsonLinesSink(Path(path))
    except OSError as exc:
        raise ConfigurationError(
            f"{where}: cannot open {shown(str(path))} for appending: {exc}{_jsonl_fix(Path(path), exc)}"
        ) from None


def _jsonl_fix(path: Path, exc: OSError) -> str:
    """What to do about a log that cannot be opened: the one line said the cause alone (a
    folder that does not exist read as ``[Errno 2] No such file or directory``, no fix)."""
    if isinstance(exc, FileNotFoundError) and not path.parent.is_dir():
        # A link to nowhere on the way: mkdir -p of it fails ("File exists"), as that fix said.
        for on_the_way in (path.parent, *path.parent.parents):
            if on_the_way.is_symlink() and not on_the_way.exists():
                target = shown(os.readlink(on_the_way))
                missing = f"{shown(str(on_the_way))} is a link to {target}, which does not exist"
                return f": {missing}; make that or give a path in a folder that exists"
        parent = str(path.parent)
        # Quoted for the shell it is pasted into; a name it cannot paste on one line (a newline
        # in it) is shown escaped, and said as a folder to make, not as a command.
        if parent.isprintable():
            return (
                f": make the folder first (mkdir -p {shlex.quote(parent)}) or give a path in one that exists"
            )
        return f": make the folder {shown(parent)} first or give a path in one that exists"
    if isinstance(exc, NotADirectoryError):
        # A file where a folder of the path should be (mkdir -p would fail "File exists").
        return ": a part of the path before the file's name is a file, not a folder; give a path in a folder"
    if isinstance(exc, PermissionError):
        return ": give a path in a folder this process may write"
    if isinstance(exc, IsADirectoryError):
        return f": it is a folder: give the path of a file in it, such as {shown(str(path / 'events.jsonl'))}"
    return ""


def _stall_watch(env: Mapping[str, str], bus: Bus) -> StallWatch | None:
    after = stall_after(env)
    return None if after is None else StallWatch(after, bus=bus)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", aconfigure, configure)
