"""``OtlpSpanSink``: checkpoint spans sent to an OTLP/HTTP collector, encoded from the events.

No OpenTelemetry objects are made: the bus gathers events for a short linger (``BUS_LINGER``,
at most the export linger; a flush or close cuts it short), ``handle`` only queues the sampled
finished ones (on the event loop, a list extend under a lock), and one worker thread batches them like a
collector client (an export when ``max_export_batch`` spans are queued or ``linger`` has
passed since the oldest queued one, whichever comes first, under sustained load too),
encodes each batch with ``SpanEncoder`` and posts it with ``OtlpHttpSender``. The queue is
bounded (``max_queue``); what does not fit, and what the collector finally refuses, is
dropped and counted in ``stats()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import anyio.to_thread
import msgspec

from ckpt_events import InvalidArgumentError, Redactor, resolve_span_groups
from sinks._span_attrs import FINISHED
from sinks.otlp._http import BUS_LINGER, OtlpHttpSender
from sinks.otlp._span_encoder import SpanEncoder

__all__ = ["OtlpSpanSink", "OtlpSpanSinkStats"]

logger: Final = logging.getLogger("sinks.otel")

#: How long a shutdown waits for the worker after cancelling its request (it returns at once
#: but for a thread switch); past it, the spans it held are counted as dropped.
_JOIN_SLACK: Final = 0.25
PROTOCOLS: Final = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}
TRACES_PATH: Final = "/v1/traces"


class OtlpSpanSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``OtlpSpanSink``.

    ``exported`` spans the collector accepted; ``dropped`` spans lost (queue full, refused
    or unreachable collector, handed in after shutdown); ``exports`` requests accepted;
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


class OtlpSpanSink:
    """A bus sink that posts checkpoint spans to ``endpoint`` over OTLP/HTTP.

    ``endpoint`` is the collector's base URL (``http://host:4318``); spans go to its
    ``/v1/traces`` unless ``traces_path`` says otherwise (``""`` for a URL used as is, as
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is). ``protocol`` is ``"http/protobuf"`` (default)
    or ``"http/json"``; ``compression`` ``"none"``, ``"gzip"`` or ``"deflate"``; ``headers`` go with every
    request; ``resource_attributes`` describe the process (``service.name`` defaults to
    ``"unknown_service"``). ``timeout`` bounds each request (the whole reply, however slowly
    it comes), and ``shutdown`` ends within that long, whatever the collector does: what it
    could not send by then is counted in ``dropped``.
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
        max_export_batch: int = 512,
        max_queue: int = 8192,
        linger: float = 1.0,
        max_retries: int = 5,
        initial_backoff: float = 1.0,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise InvalidArgumentError(f"protocol is one of {sorted(PROTOCOLS)}, not {protocol!r}")
        for name, value in (("max_export_batch", max_export_batch), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive int, not {value!r}")
        if not 0 <= linger <= 60:
            raise InvalidArgumentError(f"linger must be a number of seconds in [0, 60], not {linger!r}")
        self.protocol = protocol
        self.span_groups = resolve_span_groups(span_groups)
        self.enabled = "checkpoint" in self.span_groups
        self.interests: tuple[type, ...] = FINISHED if self.enabled else ()
        attributes = {"service.name": "unknown_service", **dict(resource_attributes or {})}
        self.encoder = SpanEncoder(attributes, redactor)
        self._encode = self.encoder.protobuf if protocol == "http/protobuf" else self.encoder.json
        self.sender = OtlpHttpSender(
            endpoint.rstrip("/") + traces_path if traces_path else endpoint,
            content_type=PROTOCOLS[protocol],
            headers=headers,
            timeout=timeout,
            compression=compression,
            max_retries=max_retries,
            initial_backoff=initial_backoff,
        )
        self.max_export_batch = max_export_batch
        self.max_queue = max_queue
        self.export_linger = linger
        # The bus gathers events a little (at most the export linger) before handing them over.
        self.linger = min(BUS_LINGER, linger)
        self.timeout = timeout
        self._queue: list[Any] = []
        self._oldest = 0.0  # monotonic time the oldest queued event arrived
        self._in_flight = 0
        self._flush_requested = False
        self._closed = False
        self._deadline: float | None = None  # a shutdown's: the worker's sends end by it
        self._abandoned = False  # shutdown counted the worker's batch as dropped
        self._wake = threading.Condition()
        self._exported = self._dropped = self._exports = self._failures = 0
        self._retries = self._unsampled = self._skipped = 0
        self._logged_failure = False
        self._worker = threading.Thread(target=self._run, name="ckpt-events-otlp", daemon=True)
        self._worker.start()

    # -- the sink (event loop side) -----------------------------------------------------------

    def handle(self, batch: list[Any]) -> None:
        """Queue the sampled events of ``batch``; what the bounded queue cannot take is dropped."""
        sampled = [event for event in batch if event.sampled]
        self._unsampled += len(batch) - len(sampled)
        wake = self._wake
        with wake:
            if self._closed:
                self._dropped += len(sampled)
                return
            queue = self._queue
            was_empty = not queue
            if was_empty:
                self._oldest = time.monotonic()
            room = self.max_queue - len(queue)
            if len(sampled) > room:
                self._dropped += len(sampled) - room
                sampled = sampled[:room]
            queue.extend(sampled)
            # Wake the worker on a full batch, and on the first span of an empty queue: it then
            # sleeps out the linger from that span (asleep on an empty queue it has no deadline).
            if (was_empty and sampled) or len(queue) >= self.max_export_batch:
                wake.notify()

    # -- the worker thread --------------------------------------------------------------------

    def _run(self) -> None:
        wake = self._wake
        while True:
            with wake:
                for _ in range(1_000_000):  # bounded: each wait ends by linger, notify or close
                    queue = self._queue
                    if len(queue) >= self.max_export_batch or self._flush_requested or self._closed:
                        break
                    if queue:
                        remaining = self._oldest + self.export_linger - time.monotonic()
                        if remaining <= 0:
                            break
                        wake.wait(remaining)
                    else:
                        wake.wait()
                taken = self._queue[: self.max_export_batch]
                del self._queue[: self.max_export_batch]
                if self._queue:
                    self._oldest = time.monotonic()
                self._in_flight = len(taken)
                if not taken:
                    self._flush_requested = False
                    wake.notify_all()  # flushers waiting for an empty queue
                    if self._closed:
                        return
                    continue
            self._export(taken)
            with wake:
                self._in_flight = 0
                wake.notify_all()

    def _export(self, events: list[Any]) -> None:
        try:
            body, spans = self._encode(events)
        except Exception:
            self._count(dropped=len(events), failed=True)
            self._log_failure("could not encode a batch")
            return
        skipped = len(events) - spans
        if not spans:
            self._count(skipped=skipped)
            return
        result = self.sender.send(body, self._deadline)
        retries = max(result.attempts - 1, 0)
        if result.accepted:
            self._count(exported=spans, skipped=skipped, retries=retries)
        else:
            self._count(dropped=spans, skipped=skipped, retries=retries, failed=True)
            self._log_failure(f"refused or unreachable (last status {result.status})")

    def _count(
        self, *, exported: int = 0, dropped: int = 0, skipped: int = 0, retries: int = 0, failed: bool = False
    ) -> None:
        with self._wake:
            if self._abandoned:
                return  # shutdown gave up on this batch and counted it
            self._exported += exported
            self._exports += 1 if exported else 0
            self._dropped += dropped
            self._skipped += skipped
            self._retries += retries
            self._failures += 1 if failed else 0

    def _log_failure(self, how: str) -> None:
        # Logged once; later failures only count, so a dead collector cannot flood the log.
        if self._logged_failure:
            return
        self._logged_failure = True
        logger.warning(
            "OTLP span export to %s %s; spans are dropped and counted in OtlpSpanSink.stats(), "
            "not logged again",
            self.sender.url,
            how,
        )

    # -- flush, shutdown, stats ---------------------------------------------------------------

    def force_flush(self, timeout: float | None = None) -> bool:
        """Export everything queued now; ``True`` when it was all handed over within ``timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        wake = self._wake
        with wake:
            self._flush_requested = True
            wake.notify_all()
            for _ in range(1_000_000):
                if not self._queue and not self._in_flight:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._worker.is_alive():
                    return False
                self._flush_requested = True
                wake.wait(remaining)
        return False

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush, stop the worker, close the connection: all within ``timeout`` seconds (default
        the sink's ``timeout``). Spans not exported by then are counted in ``dropped``. Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._deadline = deadline
        self.sender.close_by(deadline)  # the export under way too: its backoff ends now
        self.force_flush(max(deadline - time.monotonic(), 0.0))
        with self._wake:
            self._closed = True
            self._dropped += len(self._queue)
            self._queue.clear()
            self._wake.notify_all()
        self.sender.cancel()  # ends a backoff wait and the request in flight
        self._worker.join(_JOIN_SLACK)
        with self._wake:
            if self._worker.is_alive() and self._in_flight:
                self._dropped += self._in_flight
                self._abandoned = True
        self.sender.close()

    async def aclose(self) -> None:
        """Flush and shut down (the bus awaits this after the last batch); cancelled (the bus's
        close deadline), the export in flight ends at once and its spans count as dropped."""
        try:
            await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.sender.cancel()
            raise

    def stats(self) -> OtlpSpanSinkStats:
        """The counters so far."""
        with self._wake:
            return OtlpSpanSinkStats(
                exported=self._exported,
                dropped=self._dropped,
                exports=self._exports,
                export_failures=self._failures,
                retries=self._retries,
                unsampled=self._unsampled,
                skipped=self._skipped,
                invalid_values=self.encoder.invalid_values,
            )
