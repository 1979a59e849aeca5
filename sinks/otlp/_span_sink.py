"""``OtlpSpanSink``: checkpoint spans sent to an OTLP/HTTP collector, encoded from the events.

No OpenTelemetry objects are made: the bus gathers events for a short linger (``SPAN_BUS_LINGER``,
at most the export linger; a flush or close cuts it short), ``handle`` only queues the sampled
finished ones (on the event loop, a list extend under a lock), and one worker thread batches them like a
collector client (an export when ``max_export_batch`` spans are queued or ``linger`` has
passed since the oldest queued one, whichever comes first, under sustained load too),
except that a finished top-level span (a participant's operation, a coordinate or collection
span: its steps and stages finished before it) has the queue exported at once, a few times
in a row (``PROMPT_BURST``), then at most once per ``prompt_interval`` (0.2 s): a checkpoint's
spans leave the process before the crash a checkpoint exists for, while a stream of them still
goes in batches. It encodes each batch with ``SpanEncoder`` and posts it with
``OtlpHttpSender``. The queue is bounded (``max_queue``); what does not fit, and what the
collector finally refuses, is dropped and counted in ``stats()``. The thread, its counters,
its one warning and its deadline-bounded stop are the ``ExportWorker`` the metric sink runs too.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    InvalidTypeError,
    InvalidValueError,
    OperationFinished,
    Redactor,
)
from ckpt_events._errors import check_int, check_number, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._span_attrs import FINISHED, AttributeLimits
from ckpt_events.sinks.otlp._export_worker import ExportWorker, timeout_or
from ckpt_events.sinks.otlp._http import check_protocol, resource_with_service_name, signal_sender
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from ckpt_events.vocab import resolve_span_groups

__all__ = ["OtlpSpanSink", "OtlpSpanSinkStats"]

#: How long a shutdown waits for the worker after cancelling its request (it returns at once
#: but for a thread switch); past it, the spans it held are counted as dropped.
_JOIN_SLACK: Final = 0.25
TRACES_PATH: Final = "/v1/traces"
#: The spans that close a process's part of a trace (their children finished before them).
#: Queued, they are exported at once: in ``demo --processes``, the first servers' prepare and
#: commit spans waited out the 1 s linger and died with the SIGKILL ~100 ms after the commit.
TOP_LEVEL: Final = frozenset({OperationFinished, CoordinateFinished, CollectionFinished})
#: ``prompt_interval``'s default: a stream of operations makes at most 5 prompt exports a
#: second (at 1,000 commits a second, 3.2 requests per 1,000 spans against 2.1 on the batch
#: schedule alone, the same CPU; every 50 ms made it 10 and cost ~20% more CPU per span).
PROMPT_INTERVAL: Final = 0.2
#: Prompt exports allowed back to back (a token bucket refilled one per ``prompt_interval``): a
#: checkpoint's prepare, commit and what follows each go at once, however close together.
PROMPT_BURST: Final = 4
#: Seconds the bus gathers events before handing them to this sink: 10 ms (not the metric
#: sink's 50, ``BUS_LINGER``) so that a finished operation is at the collector ~15 ms after it
#: ends; a busy server's deliveries stay at most 100 a second.
SPAN_BUS_LINGER: Final = 0.01
#: ``max_queue``'s default: the most spans queued for export (``OTEL_BSP_MAX_QUEUE_SIZE`` unset).
DEFAULT_MAX_QUEUE: Final = 8192
#: ``max_export_batch``'s default (OpenTelemetry's), or ``max_queue`` when that is smaller.
DEFAULT_MAX_EXPORT_BATCH: Final = 512
#: A batch whose request would pass this is split in halves until each fits (a span alone
#: goes whatever its size): gRPC's default message limit, below the OpenTelemetry
#: Collector's 20 MiB for a request. Three spans with a 10 MB attribute among 50 made one
#: 31 MB request, answered 413: all 50 spans lost. A usual batch is far under it (512
#: spans, ~0.2 MB).
MAX_REQUEST_BYTES: Final = 4 * 1024 * 1024


class OtlpSpanSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``OtlpSpanSink``.

    ``exported`` spans the collector accepted; ``dropped`` spans lost (queue full, refused
    or unreachable collector, rejected in a 2xx answer's partial success, handed in after
    shutdown); ``exports`` requests accepted;
    ``retries`` requests repeated after a retryable answer; ``unsampled`` events skipped by
    the root's sampling decision; ``skipped`` events with no span (``renew``);
    ``invalid_values`` attribute values the wire cannot carry (a lone surrogate, an int outside
    int64), left out of their span (or, in a status or exception text, replaced) while the
    span itself is exported.
    """

    exported: int
    dropped: int
    exports: int
    export_failures: int
    retries: int
    unsampled: int
    skipped: int
    invalid_values: int = 0
    #: How the latest failed export failed (``"answered 404"``, ``"got no answer"``,
    #: ``"rejected 3 spans (...)"``), or ``None``.
    last_failure: str | None = None


class OtlpSpanSink:
    """A bus sink that posts checkpoint spans to ``endpoint`` over OTLP/HTTP.

    ``endpoint`` is the collector's base URL (``http://host:4318``); spans go to its
    ``/v1/traces`` unless ``traces_path`` says otherwise (``""`` for a URL used as is, as
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is). ``protocol`` is ``"http/protobuf"`` (default)
    or ``"http/json"``; ``compression`` ``"none"``, ``"gzip"`` or ``"deflate"``; ``headers`` go with every
    request; ``tls`` is the ``ssl.SSLContext`` of an ``https`` endpoint (its CA bundle, a client
    certificate for mutual TLS; default: the system's trust store); ``resource_attributes``
    describe the process (``service.name`` defaults to ``"unknown_service"``). ``timeout``
    bounds each request (the whole reply, however slowly it comes), and ``shutdown`` ends
    within that long, whatever the collector does: what it could not send by then is counted
    in ``dropped``. ``linger`` is the longest a queued span
    waits for a batch to fill; a top-level span (``TOP_LEVEL``: an operation, coordinate or
    collection span) has the queue exported at once, up to ``PROMPT_BURST`` times in a row and
    then once per ``prompt_interval`` seconds at most; ``prompt_interval=None`` keeps to the
    batch schedule alone. ``max_export_batch`` is at most ``max_queue`` (as OpenTelemetry's
    ``BatchSpanProcessor`` requires); left out, it is 512, or ``max_queue`` if that is smaller.
    ``attribute_limits`` (default: ``AttributeLimits()``, the specification's: 128 attributes a
    span, no length limit) bounds each span's attributes and its exception event's values.
    """

    blocking: Final = False  # handle() only queues; the worker thread does the I/O

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: str = "http/protobuf",
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        compression: str = "none",
        resource_attributes: Mapping[str, object] | None = None,
        traces_path: str = TRACES_PATH,
        span_groups: str | Iterable[str] | None = "default,checkpoint",
        redactor: Redactor | None = None,
        max_export_batch: int | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        linger: float = 1.0,
        prompt_interval: float | None = PROMPT_INTERVAL,
        max_retries: int = 5,
        initial_backoff: float = 1.0,
        tls: ssl.SSLContext | None = None,
        attribute_limits: AttributeLimits | None = None,
    ) -> None:
        check_protocol(protocol)
        check_int(max_queue, f"max_queue must be a positive int, not {shown(max_queue)}", minimum=1)
        if max_export_batch is None:
            max_export_batch = min(DEFAULT_MAX_EXPORT_BATCH, max_queue)
        check_int(
            max_export_batch,
            f"max_export_batch must be a positive int, not {shown(max_export_batch)}",
            minimum=1,
        )
        if max_export_batch > max_queue:
            # A batch that never fits was sent only at each linger, the queue dropping past its bound.
            raise InvalidValueError(
                f"max_export_batch ({max_export_batch}) must be at most max_queue ({max_queue})"
            )
        for name, seconds in (("linger", linger), ("prompt_interval", prompt_interval)):
            if seconds is None and name == "prompt_interval":
                continue
            check_number(
                seconds, f"{name} must be a number of seconds in [0, 60], not {shown(seconds)}", high=60
            )
        self.protocol = protocol
        self.span_groups = resolve_span_groups(span_groups)
        self.enabled = "checkpoint" in self.span_groups
        self.interests: tuple[type, ...] = FINISHED if self.enabled else ()
        attributes = resource_with_service_name(resource_attributes)
        if attribute_limits is not None and not isinstance(attribute_limits, AttributeLimits):
            raise InvalidTypeError(
                f"attribute_limits must be an AttributeLimits or None, not {shown(attribute_limits)}"
            )
        self.encoder = SpanEncoder(attributes, redactor, attribute_limits)
        self._encode = self.encoder.protobuf if protocol == "http/protobuf" else self.encoder.json
        self.sender = signal_sender(
            endpoint,
            traces_path,
            protocol=protocol,
            headers=headers,
            timeout=timeout,
            compression=compression,
            max_retries=max_retries,
            initial_backoff=initial_backoff,
            tls=tls,
        )
        self.max_export_batch = max_export_batch
        self.max_queue = max_queue
        self.export_linger = linger
        self.prompt_interval = prompt_interval
        # The bus gathers events a little (at most the export linger) before handing them over.
        self.linger = min(SPAN_BUS_LINGER, linger)
        self.timeout = timeout
        self._queue: list[Any] = []
        self._oldest = 0.0  # monotonic time the oldest queued event arrived
        self._prompt_at: float | None = None  # export by then: a top-level span is queued
        # Prompt exports left (a token bucket of PROMPT_BURST, one back per prompt_interval).
        self._prompt_tokens = float(PROMPT_BURST)
        self._refilled = time.monotonic()
        self._in_flight = 0  # spans of the batch being sent (dropped if the send outlives shutdown)
        self._flush_requested = False
        self._deadline: float | None = None  # a shutdown's: the worker's sends end by it
        self._unsampled = 0
        self._skipped = 0
        self._worker = ExportWorker(
            self.sender,
            name="ckpt-events-otlp",
            signal="span",
            lost="spans are dropped and counted in OtlpSpanSink.stats()",
            unit="spans",
            counted_in="OtlpSpanSink.stats()",
        )
        self._wake = self._worker.wake
        self._worker.start(self._run)

    # -- the sink (event loop side) -----------------------------------------------------------

    def handle(self, batch: list[Any]) -> None:
        """Queue the sampled events of ``batch``; what the bounded queue cannot take is dropped."""
        sampled = [event for event in batch if event.sampled]
        self._unsampled += len(batch) - len(sampled)
        if self._worker.dropped_in_fork(len(sampled)):
            return
        wake = self._wake
        with wake:
            worker = self._worker
            if worker.closed:
                worker.dropped += len(sampled)
                return
            queue = self._queue
            was_empty = not queue
            if was_empty:
                self._oldest = time.monotonic()
            room = self.max_queue - len(queue)
            if len(sampled) > room:
                worker.dropped += len(sampled) - room
                sampled = sampled[:room]
            queue.extend(sampled)
            prompt = False
            if (
                self._prompt_at is None
                and self.prompt_interval is not None
                and not TOP_LEVEL.isdisjoint(map(type, sampled))
            ):
                self._prompt_at = self._prompt_time()
                prompt = True
            # Wake the worker on a full batch, on the first span of an empty queue (it then
            # sleeps out the linger from that span: asleep on an empty queue it has no deadline),
            # and on a top-level span (its deadline is nearer).
            if (was_empty and sampled) or prompt or len(queue) >= self.max_export_batch:
                wake.notify()

    def _prompt_time(self) -> float:
        """When a top-level span just queued is exported (under ``wake``): now while the bucket
        holds a prompt export, else when it holds one again; either way it takes one."""
        now = time.monotonic()
        interval = self.prompt_interval
        if not interval:  # 0: every top-level span at once (None never comes here)
            return now
        tokens = min(PROMPT_BURST, self._prompt_tokens + (now - self._refilled) / interval)
        self._prompt_tokens = tokens - 1
        self._refilled = now
        return now if tokens >= 1 else now + (1 - tokens) * interval

    # -- the worker thread --------------------------------------------------------------------

    def _export_at(self) -> float:
        """When the queued spans are due by time (under ``wake``, with a non-empty queue)."""
        at = self._oldest + self.export_linger
        prompt_at = self._prompt_at
        return at if prompt_at is None or prompt_at > at else prompt_at

    def _due(self) -> bool:
        """Whether the worker should take a batch now (under ``wake``)."""
        queue = self._queue
        if len(queue) >= self.max_export_batch or self._flush_requested or self._worker.closed:
            return True
        return bool(queue) and time.monotonic() >= self._export_at()

    def _run(self) -> None:
        wake = self._wake
        while True:
            with wake:
                # One wait per turn, the deadline read again after each wake-up: a top-level
                # span queued meanwhile brings it nearer. An empty queue has no deadline: sleep
                # until its first span, a flush or shutdown.
                if not self._due():
                    wake.wait(max(self._export_at() - time.monotonic(), 0.0) if self._queue else None)
                    if not self._due():
                        continue
                taken = self._queue[: self.max_export_batch]
                del self._queue[: self.max_export_batch]
                rest = self._queue
                if rest:
                    self._oldest = time.monotonic()
                # The rest of a full batch keeps a top-level span's deadline only if it holds
                # one: under sustained load the next batches fill up again, not go out at once.
                if not rest or (self._prompt_at is not None and TOP_LEVEL.isdisjoint(map(type, rest))):
                    self._prompt_at = None
                self._in_flight = len(taken)
                if not taken:
                    self._flush_requested = False
                    wake.notify_all()  # flushers waiting for an empty queue
                    if self._worker.closed:
                        return
                    continue
            self._export(taken)
            with wake:
                self._in_flight = 0
                wake.notify_all()

    def _export(self, events: list[Any]) -> None:
        worker = self._worker
        try:
            pieces = self._requests(events)
        except Exception:
            worker.count(dropped=len(events), failed=True)
            worker.log_failure("could not encode a batch")
            return
        spans = sum(piece_spans for _, piece_spans in pieces)
        with self._wake:
            if not worker.abandoned:
                self._skipped += len(events) - spans
                # Only the spans are lost if the send outlives shutdown; the skipped are counted.
                self._in_flight = spans
        for body, piece_spans in pieces:
            if piece_spans:
                worker.send(body, piece_spans, self._deadline)
            with self._wake:
                if not worker.abandoned:
                    self._in_flight -= piece_spans  # what is still to send, if shutdown abandons it

    def _requests(self, events: list[Any]) -> list[tuple[bytes, int]]:
        """``events`` encoded as requests of at most ``MAX_REQUEST_BYTES`` each (a span alone may
        pass it), with the number of spans each holds."""
        body, spans = self._encode(events)
        if len(body) <= MAX_REQUEST_BYTES or len(events) == 1:
            return [(body, spans)]
        half = len(events) // 2  # at most log2(max_export_batch) levels deep
        return self._requests(events[:half]) + self._requests(events[half:])

    # -- flush, shutdown, stats ---------------------------------------------------------------

    def force_flush(self, timeout: float | None = None) -> bool:
        """Export everything queued now; ``True`` when it was all handed over within ``timeout``."""
        deadline = time.monotonic() + timeout_or(timeout, self.timeout)
        wake = self._wake
        with wake:
            self._flush_requested = True
            wake.notify_all()
            wake.wait_for(self._flushed_or_stuck, max(deadline - time.monotonic(), 0.0))
            return not self._queue and not self._in_flight

    def _flushed_or_stuck(self) -> bool:
        if not self._queue and not self._in_flight:
            return True
        # Spans that came after the worker found the queue empty (and ended the flush) need
        # the flush asked for again.
        self._flush_requested = True
        return not self._worker.is_alive()

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush, stop the worker, close the connection: all within ``timeout`` seconds (default
        the sink's ``timeout``). Spans not exported by then are counted in ``dropped``. Idempotent."""
        seconds = timeout_or(timeout, self.timeout)
        worker = self._worker
        if worker.closed:
            return
        deadline = time.monotonic() + seconds
        self._deadline = deadline
        self.sender.close_by(deadline)  # the export under way too: its backoff ends now
        self.force_flush(max(deadline - time.monotonic(), 0.0))
        with self._wake:
            worker.request_stop()
            worker.count(dropped=len(self._queue))
            self._queue.clear()
        # The flush had the time; the sender is cancelled at once (ending the request in flight),
        # and the worker gets a thread switch's worth to return.
        worker.join(deadline, patience=0.0, slack=_JOIN_SLACK)
        with self._wake:
            if worker.is_alive() and self._in_flight:
                worker.abandon(self._in_flight)
        self.sender.stop()  # no thread of ours outlives the shutdown
        worker.say_total()

    async def aclose(self) -> None:
        """Flush and shut down (the bus awaits this after the last batch); cancelled (the bus's
        close deadline), the export in flight ends at once and its spans count as dropped."""
        await self._worker.aclose_with(self.shutdown)

    def stats(self) -> OtlpSpanSinkStats:
        """The counters so far."""
        worker = self._worker
        with self._wake:
            return OtlpSpanSinkStats(
                exported=worker.exported,
                dropped=worker.dropped,
                exports=worker.exports,
                export_failures=worker.failures,
                retries=worker.retries,
                unsampled=self._unsampled,
                skipped=self._skipped,
                invalid_values=self.encoder.invalid_values,
                last_failure=worker.last_failure,
            )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel", OtlpSpanSink, OtlpSpanSinkStats)
