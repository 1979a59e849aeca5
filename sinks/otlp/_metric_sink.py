"""``OtlpMetricSink``: the four checkpoint instruments, aggregated here, posted over OTLP/HTTP.

No OpenTelemetry SDK is involved: the bus gathers events for ``BUS_LINGER`` (a flush or close
cuts it short), ``handle`` folds a batch into cumulative totals (on the event loop, a few
dict operations per event under a lock), and one worker thread posts a
snapshot every ``export_interval`` seconds (``OTEL_METRIC_EXPORT_INTERVAL``), at
``force_flush`` and at shutdown, through the same kept-alive sender as ``OtlpSpanSink``
(retries with backoff on 429/502/503/504). Cumulative temporality: a lost export loses no
counts, the next one carries them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio.to_thread
import msgspec

from ckpt_events import InvalidArgumentError
from sinks import _metric_keys as keys
from sinks.otlp._http import BUS_LINGER, OtlpHttpSender
from sinks.otlp._metric_aggregation import MetricEncoder, MetricTotals

__all__ = ["OtlpMetricSink", "OtlpMetricSinkStats"]

logger: Final = logging.getLogger("sinks.otel")

PROTOCOLS: Final = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}
METRICS_PATH: Final = "/v1/metrics"


class OtlpMetricSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``OtlpMetricSink``: events folded in, export requests accepted and
    failed (after retries), and requests repeated after a retryable answer; ``invalid_values``
    attribute texts written with U+FFFD for what UTF-8 cannot hold (a lone surrogate)."""

    events: int
    exports: int
    export_failures: int
    retries: int
    invalid_values: int = 0


class OtlpMetricSink:
    """A bus sink posting checkpoint metrics to ``endpoint`` over OTLP/HTTP.

    ``endpoint`` is the collector's base URL; points go to its ``/v1/metrics`` unless
    ``metrics_path`` says otherwise (``""``: the URL as is, as
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is). ``protocol``, ``headers``, ``timeout``,
    ``compression`` and ``resource_attributes`` as for ``OtlpSpanSink``. Records what
    ``MetricSink`` records for the same events: same names, units and attribute sets.
    """

    interests: Final = keys.INTERESTS
    blocking: Final = False  # handle() only folds counts; the worker thread does the I/O
    linger: Final = BUS_LINGER  # the bus gathers events before a delivery; flush and close do not wait

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: str = "http/protobuf",
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        compression: str = "none",
        resource_attributes: Mapping[str, object] | None = None,
        metrics_path: str = METRICS_PATH,
        export_interval: float = 60.0,
        max_retries: int = 5,
        initial_backoff: float = 1.0,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise InvalidArgumentError(f"protocol is one of {sorted(PROTOCOLS)}, not {protocol!r}")
        if not 0 < export_interval <= 86_400:
            raise InvalidArgumentError(
                f"export_interval must be seconds in (0, 86400], not {export_interval!r}"
            )
        self.protocol = protocol
        attributes = {"service.name": "unknown_service", **dict(resource_attributes or {})}
        self.encoder = MetricEncoder(attributes)
        self._encode = self.encoder.protobuf if protocol == "http/protobuf" else self.encoder.json
        self.sender = OtlpHttpSender(
            endpoint.rstrip("/") + metrics_path if metrics_path else endpoint,
            content_type=PROTOCOLS[protocol],
            headers=headers,
            timeout=timeout,
            compression=compression,
            max_retries=max_retries,
            initial_backoff=initial_backoff,
        )
        self.export_interval = export_interval
        self.timeout = timeout
        self.start_ns = time.time_ns()
        self._totals = MetricTotals()
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()  # one export at a time: worker, flush, shutdown
        self._stop = threading.Event()
        self._closed = False
        self._events = self._exports = self._failures = self._retries = 0
        self._logged_failure = False
        self._worker = threading.Thread(target=self._run, name="ckpt-events-otlp-metrics", daemon=True)
        self._worker.start()

    def handle(self, batch: list[Any]) -> None:
        """Fold ``batch`` into the cumulative totals."""
        with self._lock:
            self._totals.add(batch)
            self._events += len(batch)

    def snapshot(self) -> MetricTotals:
        """A copy of the cumulative totals (what a Prometheus scrape endpoint renders)."""
        with self._lock:
            return self._totals.snapshot()

    def _run(self) -> None:
        # Bounded: each wait ends by the interval or by shutdown.
        for _ in range(1 << 40):
            if self._stop.wait(self.export_interval):
                return
            self._export()

    def _export(self, deadline: float | None = None) -> bool:
        with self._export_lock:
            with self._lock:
                if not self._totals:
                    return True
                snapshot = self._totals.snapshot()
            body = self._encode(snapshot, self.start_ns, time.time_ns())
            result = self.sender.send(body, deadline)
            with self._lock:
                self._retries += max(result.attempts - 1, 0)
                if result.accepted:
                    self._exports += 1
                else:
                    self._failures += 1
            if not result.accepted and not self._logged_failure:
                # Logged once; later failures only count (cumulative points lose nothing).
                self._logged_failure = True
                logger.warning(
                    "OTLP metric export to %s refused or unreachable (last status %s); counted in "
                    "OtlpMetricSink.stats(), not logged again",
                    self.sender.url,
                    result.status,
                )
            return result.accepted

    def force_flush(self) -> bool:
        """Export the totals now; ``True`` when the collector accepted them (or there were none)."""
        return self._export()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the worker, export the totals one last time, close the connection: all within
        ``timeout`` seconds (default the sink's ``timeout``), whatever the collector does. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self.sender.close_by(deadline)  # the export under way too: its backoff ends now
        self._stop.set()
        self._worker.join(max(deadline - time.monotonic(), 0.0) / 2)
        if self._worker.is_alive():  # stuck in a request or a backoff: end it, then the last export
            self.sender.cancel()
            self._worker.join(max(deadline - time.monotonic(), 0.0))
            self.sender.resume()
        self._export(deadline)
        self.sender.close()

    async def aclose(self) -> None:
        """Export the last totals and shut down (the bus awaits this after the last batch);
        cancelled (the bus's close deadline), the export in flight ends at once."""
        try:
            await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.sender.cancel()
            raise

    def stats(self) -> OtlpMetricSinkStats:
        """The counters so far."""
        with self._lock:
            return OtlpMetricSinkStats(
                events=self._events,
                exports=self._exports,
                export_failures=self._failures,
                retries=self._retries,
                invalid_values=self.encoder.invalid_values,
            )
