"""``SpanSink``: finished checkpoint events become finished OpenTelemetry spans.

Every ``*Finished`` event carries both timestamps, its ids and its parent, so a span is
built directly as a ``ReadableSpan`` (no tracer, no context switch) and the tree is right
whatever order events arrive in. Spans go to an exporter in batches, or one by one to a
``SpanProcessor``'s ``on_end`` (the user's pipeline: their batch processor, scrubbing, tail
sampling), always off the request path. Span kinds follow ``ckpt_events.vocab.span_kind_of``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import anyio.to_thread
import msgspec
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEventRecord
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from ckpt_events import InvalidTypeError, InvalidValueError, Redactor, __version__
from ckpt_events._errors import check_int, check_number, shown
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events.sinks._span_attrs import FINISHED, AttributeLimits, limited_span, span_tracestate
from ckpt_events.sinks.otel._env import DEFAULT_SERVICE_NAME, MAX_TIMEOUT_MS
from ckpt_events.vocab import Outcome, resolve_span_groups, span_kind_of
from ckpt_events.vocab import SpanKind as CkptSpanKind

__all__ = ["SpanSink", "SpanSinkStats"]

logger: Final = library_logger("ckpt_events.sinks.otel")

SCOPE: Final = InstrumentationScope("ckpt_events", __version__)
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_UNSET: Final = Status(StatusCode.UNSET)
_KINDS: Final = {CkptSpanKind(k.name.lower()): k for k in SpanKind if k.name.lower() in set(CkptSpanKind)}
_ERROR: Final = Outcome.ERROR.value
_NO_STATE: Final = TraceState()
#: The SDK's ``TraceState`` per W3C header (``span_tracestate``'s): a trace's spans share one,
#: parsed once (bounded: emptied when full).
_STATES: Final[dict[str, TraceState]] = {}
_STATES_MAX: Final = 1024


class SpanSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``SpanSink``.

    ``exported`` spans the exporter (or processor) took; ``dropped`` spans lost to a failed
    or raising export, to a processor or tracer provider of yours that was shut down, or after
    this sink's own shutdown; ``unsampled`` events skipped by the root's sampling decision;
    ``skipped`` events with no span (``renew``); ``last_failure`` says why spans were last
    dropped (``None`` while none was).
    """

    exported: int
    dropped: int
    export_failures: int
    unsampled: int
    skipped: int
    last_failure: str | None = None


class SpanSink:
    """A bus sink that turns checkpoint events into OpenTelemetry spans, for exactly one of
    ``exporter`` (any ``SpanExporter``), ``processor`` (any ``SpanProcessor``: its ``on_end``)
    or ``tracer_provider``. ``processor`` is the public way into your pipeline: your
    ``BatchSpanProcessor(exporter)``, or the ``SynchronousMultiSpanProcessor`` you built your
    ``TracerProvider(active_span_processor=...)`` with, to share every processor it has (pass
    ``resource=provider.resource`` too). ``tracer_provider`` (an SDK ``TracerProvider``: its
    processors and its resource) still works, through a private attribute of the SDK (it has
    no public getter); a provider without it is ``InvalidTypeError``, naming ``processor=``.
    A processor or provider is the caller's: flushed at close, never shut down; once you shut
    it down, the spans handed to it are counted as dropped (the SDK's processors drop them,
    mostly without a word) and that is logged once. Spans are made
    only when ``span_groups`` contains ``checkpoint`` (else ``interests`` is empty and emit
    sites stay off). ``resource`` defaults to ``Resource.create()`` named ``ckpt-events``
    unless ``OTEL_SERVICE_NAME`` names it.
    ``redactor`` (default: ``ckpt_events.Redactor()``) applies to user-supplied attributes.
    ``attribute_limits`` (default: ``tracer_provider``'s ``SpanLimits``, else
    ``AttributeLimits()``, the specification's: 128 attributes, no length limit) bounds each
    span's attributes and its exception event's values.
    ``handle`` may block, so the bus runs it in a worker thread (``blocking``) after
    gathering events for ``linger`` seconds (each handoff to a thread can cost the loop a GIL
    switch interval): a checkpoint's spans go out in one batch. ``bus.flush()`` skips linger.
    ``export_timeout`` bounds ``force_flush`` and ``shutdown``. An exporter that raises or
    fails is counted and logged once; it never raises out of ``handle``.
    """

    def __init__(
        self,
        exporter: SpanExporter | None = None,
        *,
        processor: SpanProcessor | None = None,
        tracer_provider: TracerProvider | None = None,
        span_groups: str | Iterable[str] | None = "default,checkpoint",
        resource: Resource | None = None,
        redactor: Redactor | None = None,
        max_export_batch: int = 512,
        blocking: bool = True,
        linger: float = 1.0,
        export_timeout: float = 30.0,
        attribute_limits: AttributeLimits | None = None,
    ) -> None:
        targets = {"exporter": exporter, "processor": processor, "tracer_provider": tracer_provider}
        given = [name for name, value in targets.items() if value is not None]
        if len(given) != 1:
            raise InvalidValueError(
                f"SpanSink takes exactly one of exporter, processor or tracer_provider, got "
                f"{' and '.join(given) or 'none'}"
            )
        if exporter is not None and not callable(getattr(exporter, "export", None)):
            raise InvalidTypeError(f"exporter must be an OpenTelemetry SpanExporter, not {shown(exporter)}")
        if tracer_provider is not None:
            processor = _processors_of(tracer_provider)
            provider = _sdk_provider(tracer_provider)
            if resource is None:
                resource = provider.resource
            if attribute_limits is None:
                attribute_limits = _limits_of(provider)
        if processor is not None and not callable(getattr(processor, "on_end", None)):
            raise InvalidTypeError(
                f"processor must be an OpenTelemetry SpanProcessor, not {shown(processor)}"
            )
        # Checked here: taken as they were, every span failed later, blamed on the exporter
        # (a dict resource: "span exporter ConsoleSpanExporter raised") or on the whole batch.
        if resource is not None and not isinstance(resource, Resource):
            raise InvalidTypeError(
                f"resource must be an OpenTelemetry Resource or None, not {shown(resource)}"
            )
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidTypeError(f"redactor must be a ckpt_events.Redactor or None, not {shown(redactor)}")
        if attribute_limits is not None and not isinstance(attribute_limits, AttributeLimits):
            raise InvalidTypeError(
                f"attribute_limits must be an AttributeLimits or None, not {shown(attribute_limits)}"
            )
        check_int(
            max_export_batch,
            f"max_export_batch must be a positive int, not {shown(max_export_batch)}",
            minimum=1,
        )
        limit = MAX_TIMEOUT_MS / 1000  # an hour: a larger one overflowed the waits bounded by it
        check_number(
            export_timeout,
            f"export_timeout must be seconds in (0, {limit:g}], not {shown(export_timeout)}",
            high=limit,
            low_open=True,
        )
        self.exporter = exporter
        self.processor = processor
        self.span_groups = resolve_span_groups(span_groups)
        self.enabled = "checkpoint" in self.span_groups
        self.interests: tuple[type, ...] = FINISHED if self.enabled else ()
        self.resource = resource if resource is not None else _default_resource()
        self.redactor = redactor if redactor is not None else Redactor()
        self.attribute_limits = attribute_limits if attribute_limits is not None else AttributeLimits()
        self.max_export_batch = max_export_batch
        self.blocking = blocking
        self.linger = linger
        self.export_timeout = export_timeout
        self._lock = threading.Lock()
        self._shutdown = False
        self._exported = 0
        self._dropped = 0
        self._export_failures = 0
        self._unsampled = 0
        self._skipped = 0
        self._last_failure: str | None = None
        self._logged_failure = False
        self._contexts: dict[int, SpanContext] = {}  # per batch; see _span

    # -- the sink ---------------------------------------------------------------------------

    def handle(self, batch: list[Any]) -> None:
        """Build a span per sampled finished event and export them in batches."""
        redactor = self.redactor
        self._contexts = {}
        spans: list[ReadableSpan] = []
        unsampled = 0
        skipped = 0
        limit = self.max_export_batch
        limits = self.attribute_limits
        for event in batch:
            if not event.sampled:
                unsampled += 1
                continue
            named = limited_span(event, redactor, limits)
            if named is None:  # renew: counted in metrics, no span
                skipped += 1
                continue
            spans.append(self._span(event, *named))
            if len(spans) >= limit:
                self._export(spans)
                spans = []
        self._contexts = {}
        self._unsampled += unsampled
        self._skipped += skipped
        if spans:
            self._export(spans)

    def _export(self, spans: list[ReadableSpan]) -> None:
        with self._lock:
            if self._shutdown:
                self._dropped += len(spans)
                return
            if self.exporter is None:
                assert self.processor is not None
                if _was_shut_down(self.processor):
                    self._dropped += len(spans)
                    self._export_failures += 1
                    self._log_failure("was shut down")
                    return
                self._hand_over(spans)
                return
            try:
                result = self.exporter.export(spans)
            except Exception:
                self._dropped += len(spans)
                self._export_failures += 1
                self._log_failure("raised")
                return
            if result is SpanExportResult.FAILURE:
                self._dropped += len(spans)
                self._export_failures += 1
                self._log_failure("reported a failure")
            else:
                self._exported += len(spans)

    def _hand_over(self, spans: list[ReadableSpan]) -> None:
        assert self.processor is not None
        on_end = self.processor.on_end
        is_down = _shutdown_check(self.processor)
        done = 0
        # Per span: a processor that raises on one span (a scrubber's bug on one value) loses
        # that span only; stopping at the first raise lost every later span of the batch, other
        # checkpoints' included.
        for index, span in enumerate(spans):
            # Also per span (~0.1 us): shut down while a batch was handed over (a signal
            # handler, another thread), the rest went to a SimpleSpanProcessor that warned once
            # per span and dropped them, counted as exported (100 spans: 19 delivered, 80 lines).
            if is_down is not None and is_down():
                self._dropped += len(spans) - index
                self._export_failures += 1
                self._log_failure("was shut down")
                break
            try:
                on_end(span)
            except Exception:
                self._dropped += 1
                self._export_failures += 1
                self._log_failure("raised")
            else:
                done += 1
        self._exported += done

    def _log_failure(self, how: str) -> None:
        self._last_failure = how
        # Logged once; later failures only count, so a dead collector cannot flood the log.
        if self._logged_failure:
            return
        self._logged_failure = True
        logger.warning(
            "span %s %s %s; spans are dropped and counted in SpanSink.stats(), not logged again",
            "exporter" if self.exporter is not None else "processor",
            type(self.exporter if self.exporter is not None else self.processor).__name__,
            how,
            exc_info=how == "raised",
        )

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Flush the exporter or processor (spans are handed over at the end of every batch)."""
        millis = int(self.export_timeout * 1000) if timeout_millis is None else timeout_millis
        with self._lock:
            if self._shutdown:
                return True
            try:
                target = self.exporter if self.exporter is not None else self.processor
                assert target is not None
                return bool(target.force_flush(millis))
            except Exception:
                self._log_failure("raised in force_flush")
                return False

    def shutdown(self) -> None:
        """Flush and shut the exporter down (a processor is only flushed: it is the caller's);
        later spans are dropped (counted). Idempotent."""
        # Under the lock: handle() runs in a worker thread while shutdown() may come from another.
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            millis = int(self.export_timeout * 1000)
            target = self.exporter if self.exporter is not None else self.processor
            assert target is not None
            try:
                target.force_flush(millis)
            except Exception:
                self._log_failure("raised in force_flush at shutdown")
            if self.exporter is not None:
                # Shut down even when its flush raised: it may hold a thread or a connection.
                try:
                    self.exporter.shutdown()
                except Exception:
                    self._log_failure("raised in shutdown")

    async def aclose(self) -> None:
        """Flush and shut down the exporter (the bus awaits this after the last batch); cancelled
        (the bus's close deadline), it returns at once and the flush ends in its thread by
        ``export_timeout`` (an exporter cannot be interrupted)."""
        # Not abandoned, a flush against a hung collector held Bus(close_timeout=1) for the
        # whole export_timeout (4 s here, 30 by default).
        await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)

    def stats(self) -> SpanSinkStats:
        """The counters so far."""
        return SpanSinkStats(
            exported=self._exported,
            dropped=self._dropped,
            export_failures=self._export_failures,
            unsampled=self._unsampled,
            skipped=self._skipped,
            last_failure=self._last_failure,
        )

    # -- the span of one event (name and attributes from ckpt_events.sinks._span_attrs) --------------------

    def _span(self, event: Any, name: str, attributes: dict[str, Any], dropped: int) -> ReadableSpan:
        kind = _KINDS[span_kind_of(event)]
        trace_id = event.trace_id
        contexts = self._contexts
        # A local span's own context is its children's parent context: build each once per
        # batch (children finish first, so the parent usually finds its context made).
        # The caller's W3C tracestate on the span's context (and its parent's: a child inherits
        # it), as the SDK's own spans carry theirs, for the vendors' exporters that read it.
        state = _NO_STATE if event.tracestate is None else _trace_state(event)
        span_id = event.span_id
        context = contexts.get(span_id)
        if context is None or context[0] != trace_id or context[4] is not state:
            context = contexts[span_id] = SpanContext(trace_id, span_id, False, _SAMPLED, state)
        parent_id = event.parent_span_id
        if parent_id is None:
            parent = None
        elif event.parent_remote:
            parent = SpanContext(trace_id, parent_id, True, _SAMPLED, state)
        else:
            parent = contexts.get(parent_id)
            if parent is None or parent[0] != trace_id:
                parent = contexts[parent_id] = SpanContext(trace_id, parent_id, False, _SAMPLED, state)
        span_attributes: Mapping[str, Any] = attributes
        if dropped:  # the span's dropped attributes count, which the SDK reads from BoundedAttributes
            bounded = BoundedAttributes(attributes=attributes, immutable=False)
            bounded.dropped = dropped
            span_attributes = bounded
        if event.outcome == _ERROR:
            cut = self.attribute_limits.cut
            error_type = cut(event.error_type or "Exception")
            message = cut(self.redactor.redact_message(event.error_message or ""))
            status = Status(StatusCode.ERROR, f"{error_type}: {message}" if message else error_type)
            events: tuple[SpanEventRecord, ...] = (
                SpanEventRecord(
                    "exception",
                    {"exception.type": error_type, "exception.message": message},
                    event.end_ns,
                ),
            )
        else:
            status = _UNSET
            events = ()
        # Positional, in ReadableSpan's documented parameter order: this is the hot path.
        return ReadableSpan(
            name,
            context,
            parent,
            self.resource,
            span_attributes,
            events,
            (),
            kind,
            None,
            status,
            event.start_ns,
            event.end_ns,
            SCOPE,
        )


def _trace_state(event: Any) -> TraceState:
    """The SDK's ``TraceState`` of ``event``'s tracestate (empty when it has none valid)."""
    header = span_tracestate(event)
    if header is None:
        return _NO_STATE
    state = _STATES.get(header)
    if state is None:
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()
        state = _STATES[header] = TraceState.from_header([header])
    return state


def _sdk_provider(tracer_provider: object) -> Any:
    """The provider whose processors, resource and limits ``tracer_provider`` stands for.

    Itself, unless it is a wrapper of the SDK's provider that users get from
    ``trace.get_tracer_provider()``: OpenTelemetry's own ``ProxyTracerProvider`` (returned
    before a global provider is set) stands for the global one once it is; logfire's (returned
    after ``logfire.configure()``) holds the SDK provider it built in its public ``provider``
    field. Each is unwrapped only to an SDK ``TracerProvider``, and once, at construction: a
    later ``logfire.configure()`` shuts the provider we hold down, and our spans are then
    counted as dropped (``was shut down``), as with any provider of yours that was shut down.
    """
    if isinstance(tracer_provider, trace_api.ProxyTracerProvider):
        tracer_provider = trace_api.get_tracer_provider()
    if isinstance(tracer_provider, TracerProvider):
        return tracer_provider
    inner = getattr(tracer_provider, "provider", None)
    return inner if isinstance(inner, TracerProvider) else tracer_provider


def _processors_of(tracer_provider: TracerProvider) -> SpanProcessor:
    """The span processor every span of ``tracer_provider`` goes through (all it was given).

    The fallback of ``SpanSink(tracer_provider=)``: the SDK keeps them in a private attribute
    and has no public getter (its public route is ``TracerProvider(active_span_processor=)``
    with a processor the caller keeps, then ``SpanSink(processor=)``). Read only here, once, at
    construction; a provider without it (not the SDK's, or an SDK that renamed it) is refused
    with the fix, never guessed at.
    """
    found: SpanProcessor | None = getattr(_sdk_provider(tracer_provider), "_active_span_processor", None)
    if found is None or not callable(getattr(found, "on_end", None)):
        raise InvalidTypeError(
            f"tracer_provider {shown(tracer_provider)} has no OpenTelemetry SDK span processors to hand "
            "spans to (a proxy or no-op provider? OpenTelemetry's before a global provider is set, "
            "logfire's before logfire.configure() runs): pass the SDK's TracerProvider, or an exporter "
            "(configure()'s span_exporter=, or SpanSink's processor=BatchSpanProcessor(exporter))"
        )
    return found


def _limits_of(tracer_provider: TracerProvider) -> AttributeLimits:
    """The span attribute limits of ``tracer_provider`` (its ``SpanLimits``), so our spans
    through it are held to what its own spans are; the default ``AttributeLimits()`` when it
    has none we can read.

    Taken with ``_processors_of``: the SDK keeps them in a private attribute, read once here.
    Without it, a provider built with ``SpanLimits(max_span_attributes=3)`` had our spans
    reach its exporter with every attribute and whole values.
    """
    limits = getattr(tracer_provider, "_span_limits", None)
    count = getattr(limits, "max_span_attributes", None)
    length = getattr(limits, "max_span_attribute_length", None)
    if not isinstance(count, int) or count < 0:
        return AttributeLimits()
    return AttributeLimits(length if isinstance(length, int) and length >= 0 else None, count)


def _was_shut_down(processor: SpanProcessor) -> bool:
    """Whether ``processor`` is one of the SDK's that was shut down (for a multi processor,
    a provider's: every processor it has), so the spans handed to it would be lost.

    The SDK says so only in private flags (its ``SimpleSpanProcessor`` logs a warning per span,
    its ``BatchSpanProcessor`` one line at INFO, and both drop the span); read per batch, never
    guessed at: a processor that is not the SDK's, or an SDK that renamed a flag, is taken as
    live, as it was before.
    """
    is_down = _shutdown_check(processor)
    return is_down is not None and is_down()


def _shutdown_check(processor: SpanProcessor) -> Callable[[], bool] | None:
    """A cheap test of ``_was_shut_down(processor)`` for one batch (``None``: never down, a
    multi processor with none), reading the flags of the processors found now."""
    checks = _down_checks(processor)
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda: all(check() for check in checks)


def _down_checks(processor: SpanProcessor) -> list[Callable[[], bool]]:
    """One reader a processor found below ``processor``: each says whether its processor is
    down (all of them must be for ``processor`` to be)."""
    children = getattr(processor, "_span_processors", None)
    if isinstance(children, tuple):
        return [check for child in children for check in _down_checks(child)]
    batch = getattr(processor, "_batch_processor", None)
    owner = processor if batch is None else batch
    if getattr(owner, "_shutdown", None) is not None:
        return [lambda: getattr(owner, "_shutdown", None) is True]
    return [_older_sdk_down_check(processor)]


def _older_sdk_down_check(processor: SpanProcessor) -> Callable[[], bool]:
    """The same fact from an SDK before 1.45, whose processors had no ``_shutdown`` flag (spans
    handed to a shut-down one were counted as exported): a ``BatchSpanProcessor``'s ``done``; for
    a ``SimpleSpanProcessor``, which kept no flag but shut its exporter down, the SDK's in-memory
    exporter's ``_stopped`` or an OTLP exporter's ``_shutdown`` (each refuses every later export).
    Any other exporter: unknown, taken as live."""
    if isinstance(processor, BatchSpanProcessor):
        return lambda: getattr(processor, "done", None) is True
    if isinstance(processor, SimpleSpanProcessor):
        exporter = processor.span_exporter
        if isinstance(exporter, InMemorySpanExporter):
            return lambda: getattr(exporter, "_stopped", None) is True
        if type(exporter).__module__.startswith("opentelemetry.exporter.otlp."):
            return lambda: getattr(exporter, "_shutdown", None) is True
    return lambda: False


def _default_resource() -> Resource:
    # Resource.create honours OTEL_SERVICE_NAME; only its unknown_service fallback is replaced.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel", SpanSink, SpanSinkStats)
