"""``OtlpMetricSink``: the four checkpoint instruments, aggregated here, posted over OTLP/HTTP.

No OpenTelemetry SDK is involved: the bus gathers events for ``BUS_LINGER`` (a flush or close
cuts it short), ``handle`` folds a batch into cumulative totals (on the event loop, a few
dict operations per event under a lock), and one worker thread posts a
snapshot every ``export_interval`` seconds (``OTEL_METRIC_EXPORT_INTERVAL``), at
``force_flush`` and at shutdown, through the same kept-alive sender as ``OtlpSpanSink``
(retries with backoff on 429/502/503/504). Cumulative temporality: a lost export loses no
counts, the next one carries them. The thread, its counters, its one warning and its
deadline-bounded stop are the ``ExportWorker`` the span sink runs too.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ckpt_events._errors import check_number, shown
from ckpt_events._logs import said_in_log
from ckpt_events._public_home import publish
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT, check_cardinality_limit
from ckpt_events.sinks._metric_totals import MetricTotals
from ckpt_events.sinks.otel._env import DEFAULT_METRIC_INTERVAL_MS
from ckpt_events.sinks.otlp._export_worker import ExportWorker, logger, timeout_or
from ckpt_events.sinks.otlp._http import BUS_LINGER, check_protocol, resource_with_service_name, signal_sender
from ckpt_events.sinks.otlp._metric_encoder import MetricEncoder

__all__ = ["OtlpMetricSink", "OtlpMetricSinkStats"]

METRICS_PATH: Final = "/v1/metrics"


class OtlpMetricSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``OtlpMetricSink``: events folded in, export requests accepted and
    failed (after retries), and requests repeated after a retryable answer; ``invalid_values``
    attribute texts written with U+FFFD for what UTF-8 cannot hold (a lone surrogate);
    ``overflowed`` measurements recorded in an instrument's ``otel.metric.overflow=true``
    series because it already held ``cardinality_limit`` attribute sets; ``rejected`` data
    points a collector took the request of but rejected (its partial success; cumulative
    totals carry them again in the next export); ``dropped`` events handed to the sink after
    its shutdown (subscribed again once its bus had closed it), never exported."""

    events: int
    exports: int
    export_failures: int
    retries: int
    invalid_values: int = 0
    overflowed: int = 0
    rejected: int = 0
    #: How the latest failed export failed (``"answered 404"``, ``"got no answer"``), or ``None``.
    last_failure: str | None = None
    dropped: int = 0
    #: Measurements refused as OpenTelemetry's SDK refuses them (a negative amount or duration,
    #: a non-finite or negative loop lag: an event built by hand), counted and logged once.
    invalid: int = 0
    #: Operations started while ``MAX_OPEN`` (10,000) were open already (handles never left,
    #: ends lost): not in the open-work gauges, which undercount; the first one logged.
    untracked: int = 0


class OtlpMetricSink:
    """A bus sink posting checkpoint metrics to ``endpoint`` over OTLP/HTTP.

    ``endpoint`` is the collector's base URL; points go to its ``/v1/metrics`` unless
    ``metrics_path`` says otherwise (``""``: the URL as is, as
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is). ``protocol``, ``headers``, ``timeout``,
    ``compression``, ``tls`` and ``resource_attributes`` as for ``OtlpSpanSink``. Records what
    ``MetricSink`` records for the same events: same names, units and attribute sets.
    Each instrument keeps at most ``cardinality_limit`` attribute sets (OpenTelemetry's 2,000
    by default); measurements of sets first seen after that go to its one
    ``otel.metric.overflow=true`` series, counted in ``stats().overflowed`` and logged once.
    A snapshot is posted every ``export_interval`` seconds (default ``DEFAULT_METRIC_INTERVAL_MS``,
    10 s, as ``configure`` builds it when ``OTEL_METRIC_EXPORT_INTERVAL`` is unset).
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
        export_interval: float = DEFAULT_METRIC_INTERVAL_MS / 1000,
        max_retries: int = 5,
        initial_backoff: float = 1.0,
        cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        check_protocol(protocol)
        check_cardinality_limit(cardinality_limit)
        interval_wrong = f"export_interval must be seconds in (0, 86400], not {shown(export_interval)}"
        check_number(export_interval, interval_wrong, high=86_400, low_open=True)
        self.protocol = protocol
        attributes = resource_with_service_name(resource_attributes)
        self.encoder = MetricEncoder(attributes)
        self._encode = self.encoder.protobuf if protocol == "http/protobuf" else self.encoder.json
        self.sender = signal_sender(
            endpoint,
            metrics_path,
            protocol=protocol,
            headers=headers,
            timeout=timeout,
            compression=compression,
            max_retries=max_retries,
            initial_backoff=initial_backoff,
            tls=tls,
        )
        self.export_interval = export_interval
        self.timeout = timeout
        self.start_ns = time.time_ns()
        self._totals = MetricTotals(cardinality_limit, owner="OtlpMetricSink")
        self._export_lock = threading.Lock()  # one export at a time: worker, flush, shutdown
        self._events = 0
        self._said_closed = False  # the one warning for events after shutdown
        self._worker = ExportWorker(
            self.sender,
            name="ckpt-events-otlp-metrics",
            signal="metric",
            lost="counted in OtlpMetricSink.stats()",
            unit="data points",
            counted_in="OtlpMetricSink.stats()",
            # What it drops is events handed to it after its shutdown: never exported.
            dropped_unit="events",
        )
        self._lock = self._worker.wake
        self._worker.start(self._run)

    def handle(self, batch: list[Any]) -> None:
        """Fold ``batch`` into the cumulative totals; after ``shutdown``, or in a process forked
        from the one that made the sink, count it as dropped."""
        if self._worker.dropped_in_fork(len(batch)):
            return
        with self._lock:
            worker = self._worker
            if not worker.closed:
                self._totals.add(batch)
                self._events += len(batch)
                return
            # Shut down (a sink subscribed again after its bus closed it): these were folded,
            # counted as events and delivered by the bus, and no export ever carried them.
            worker.dropped += len(batch)
            first = not self._said_closed
            self._said_closed = True
        if first:
            logger.warning(
                "OtlpMetricSink to %s was shut down; events handed to it since are dropped "
                "(counted in OtlpMetricSink.stats().dropped): subscribe a new sink instead",
                self.sender.shown_url,
            )

    def snapshot(self) -> MetricTotals:
        """A copy of the cumulative totals (what a Prometheus scrape endpoint renders)."""
        with self._lock:
            return self._totals.snapshot()

    def _run(self) -> None:
        worker = self._worker
        while True:
            with worker.wake:
                # Each wait ends by the interval or by shutdown.
                if worker.wake.wait_for(lambda: worker.closed, self.export_interval):
                    return
            self._export()

    def _export(self, deadline: float | None = None) -> bool:
        with self._export_lock:
            with self._lock:
                if not self._totals:
                    return True
                snapshot = self._totals.snapshot()
            try:
                body = self._encode(snapshot, self.start_ns, time.time_ns())
            except Exception as exc:  # a bug of ours: this export fails, counted; the thread goes on
                self._worker.count(failed=True)
                self._worker.last_failure = f"could not be encoded ({type(exc).__name__})"
                self._worker.log_failure(f"could not be encoded ({said_in_log(exc)})", exc_info=exc)
                return False
            # Points are not counted one by one: cumulative totals lose nothing to a failed export.
            return self._worker.send(body, 0, deadline)

    def force_flush(self) -> bool:
        """Export the totals now; ``True`` when the collector accepted them (or there were none)."""
        return self._export()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the worker, export the totals one last time, close the connection: all within
        ``timeout`` seconds (default the sink's ``timeout``), whatever the collector does. Idempotent."""
        seconds = timeout_or(timeout, self.timeout)
        worker = self._worker
        if worker.closed:
            return
        deadline = time.monotonic() + seconds
        self.sender.close_by(deadline)  # the export under way too: its backoff ends now
        worker.request_stop()
        # Half the time for an export in flight to end by itself; then it is cancelled, and the
        # last export (which carries every count) gets the rest.
        worker.join(deadline, patience=0.5, slack=0.0, resume=True)
        self._export(deadline)
        self.sender.stop()  # no thread of ours outlives the shutdown
        worker.say_total()

    async def aclose(self) -> None:
        """Export the last totals and shut down (the bus awaits this after the last batch);
        cancelled (the bus's close deadline), the export in flight ends at once."""
        await self._worker.aclose_with(self.shutdown)

    def stats(self) -> OtlpMetricSinkStats:
        """The counters so far."""
        worker = self._worker
        with self._lock:
            return OtlpMetricSinkStats(
                events=self._events,
                exports=worker.exports,
                export_failures=worker.failures,
                retries=worker.retries,
                invalid_values=self.encoder.invalid_values,
                overflowed=self._totals.overflow.measurements,
                rejected=worker.rejected,
                last_failure=worker.last_failure,
                dropped=worker.dropped,
                invalid=self._totals.invalid.measurements,
                untracked=self._totals.open_work.untracked,
            )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel", OtlpMetricSink, OtlpMetricSinkStats)
