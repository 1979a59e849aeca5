"""``Configured``: what ``configure`` subscribed, and how it is closed within its deadline.

The handle ``configure()``/``aconfigure()`` return (``ckpt_events.sinks._configure`` builds it):
its ``aclose()`` flushes the bus, unsubscribes the sinks, ends the exports in flight by
``close_timeout`` and shuts down the meter provider it built, from async or synchronous code.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ckpt_events import Bus, Subscription
from ckpt_events._errors import InvalidValueError, check_number, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._destinations import release
from ckpt_events.sinks.otel._env import OtelSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

    from ckpt_events.sinks._export.process import ExportProcess
    from ckpt_events.sinks._otel_build import AnyMetricSink, AnySpanSink
    from ckpt_events.sinks.jsonl._writer import JsonLinesSink
    from ckpt_events.sinks.prometheus import PrometheusEndpoint

__all__ = ["Configured"]

#: Seconds a cancelled ``Configured.aclose`` gives the meter provider's shutdown.
_CANCELLED_CLOSE_S: Final = 1.0


class Configured:
    """What ``configure`` subscribed: the sinks, their subscriptions, and what they own.

    ``aclose()`` (or leaving ``async with``; ``close()`` and ``with`` from synchronous code)
    flushes the bus and unsubscribes; the bus closes
    each sink (the span exporter, the JSON-lines file), and this shuts down the meter
    provider ``configure`` built (never one the caller passed in). Idempotent. One still open
    when its bus closes is closed by the bus, once the sinks have drained (a synchronous server's
    ``configure(bus)`` beside ``BusThread().start()``, never closed by hand).
    ``sample_ratio`` is what ``OTEL_TRACES_SAMPLER``/``_ARG`` ask for: pass it to
    ``Telemetry(sample_ratio=...)``. ``settings`` is the parsed environment.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        subscriptions: Sequence[Subscription] = (),
        span_sink: AnySpanSink | None = None,
        span_sinks: Sequence[AnySpanSink] = (),
        metric_sink: AnyMetricSink | None = None,
        metric_sinks: Sequence[AnyMetricSink] = (),
        jsonl_sink: JsonLinesSink | None = None,
        meter_provider: MeterProvider | None = None,
        close_timeout: float = 10.0,
        settings: OtelSettings | None = None,
        prometheus: PrometheusEndpoint | None = None,
        export_process: ExportProcess | None = None,
    ) -> None:
        self.bus = bus
        self.subscriptions = tuple(subscriptions)
        self.span_sink = span_sink if span_sink is not None else (span_sinks[0] if span_sinks else None)
        self.span_sinks = tuple(span_sinks) if span_sinks else ((span_sink,) if span_sink else ())
        self.settings = settings if settings is not None else OtelSettings()
        self.sample_ratio = self.settings.sample_ratio
        self.metric_sinks = tuple(metric_sinks) if metric_sinks else ((metric_sink,) if metric_sink else ())
        self.metric_sink = metric_sink if metric_sink is not None else next(iter(metric_sinks), None)
        self.jsonl_sink = jsonl_sink
        self.meter_provider = meter_provider
        self.close_timeout = close_timeout
        #: The scrape endpoint of ``OTEL_METRICS_EXPORTER=prometheus`` (closed last, by ``aclose``).
        self.prometheus = prometheus
        #: The child process running the sinks (``export_process=True``), else ``None``.
        self.export_process = export_process
        #: Set when the first ``aclose`` is done; a second one meanwhile waits on it.
        self._closed: anyio.Event | None = None
        self._provider_down = False

    @property
    def close_timeout(self) -> float:
        """Seconds ``aclose()`` takes at most (a number >= 0), checked when set: a NaN was a bare
        ``ValueError`` from the close's deadline, and a negative one blamed the bus's flush."""
        return self._close_timeout

    @close_timeout.setter
    def close_timeout(self, seconds: float) -> None:
        self._close_timeout = check_number(
            seconds, f"close_timeout must be a number of seconds >= 0, not {shown(seconds)}"
        )

    @property
    def enabled(self) -> bool:
        """Whether anything was subscribed."""
        return bool(self.subscriptions)

    def __repr__(self) -> str:
        names = ", ".join(sub.name for sub in self.subscriptions) or "nothing"
        return f"<Configured: {names}>"

    async def aclose(self) -> None:
        """Deliver what was emitted, unsubscribe (the bus closes each sink, side by side), and shut
        down the meter provider ``configure`` built once the sinks recording through it are
        closed, in what is left. All within ``close_timeout``, also on a bus never started (its
        sinks are run here to deliver what they hold and close). Idempotent: a second call
        returns when the first is done. A close
        cancelled or failing still shuts the meter provider down (in at most a second) and
        closes the Prometheus endpoint, last."""
        if self._closed is not None:
            # A second close meanwhile (a lifespan's and a finally's) returned at once, the
            # sinks still subscribed and the meter provider still running.
            await self._closed.wait()
            return
        self._closed = anyio.Event()
        deadline = anyio.current_time() + self.close_timeout
        closed_in_time = False
        try:
            with anyio.move_on_after(self.close_timeout):
                await self.bus.flush(timeout=self.close_timeout)
                if self.export_process is not None:
                    # The child closes in what is left of this deadline (serve and instrument() set
                    # close_timeout after configure(); the child was given 8 s of a 10 s default).
                    self.export_process.close_timeout = max(0.0, deadline - anyio.current_time())
                bus = self.bus
                if bus._tg is None and not bus._closed:
                    # A bus never started (a server whose startup failed first): the sinks'
                    # delivery tasks never ran, so the flush and unsubscribing delivered and closed
                    # nothing (the export child ran on, the JSON-lines file open with 0 lines).
                    remaining = max(0.0, deadline - anyio.current_time())
                    await bus._close_unstarted(
                        list(self.subscriptions), remaining, "configure()'s sinks closed"
                    )
                feeding = self._feeding_provider()
                # Side by side: one after the other, a span sink's and a metric sink's last exports
                # to a hanging collector took their two timeouts (10 + 5 s past a 10 s close). The
                # meter provider too, once the sinks recording through it are closed: after every
                # sink, it got the second a cancelled close gives it, past the deadline.
                async with anyio.create_task_group() as tg:
                    for sub in self.subscriptions:
                        if sub not in feeding:
                            tg.start_soon(sub.aclose)
                    if self.meter_provider is not None:
                        tg.start_soon(self._shut_provider_down, self.meter_provider, feeding, deadline)
                closed_in_time = True
        finally:
            if not closed_in_time:
                await self._end_exports_now()
            if (
                self.meter_provider is not None
                and not self._provider_down
                and not _was_shut_down(self.meter_provider)
            ):
                # Cancelled before it got there: the SDK's periodic reader thread went on
                # exporting for the life of the process. Shut down shielded, in at most a second
                # (its last export abandoned past it).
                provider = self.meter_provider
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_CLOSE_S):
                    await anyio.to_thread.run_sync(
                        lambda: provider.shutdown(timeout_millis=int(_CANCELLED_CLOSE_S * 1000)),
                        abandon_on_cancel=True,
                    )
            try:
                if self.prometheus is not None:
                    # Shielded: a cancelled close (a Ctrl-C, a failing sibling task) never got
                    # here, and a second aclose() returns at once: the scrape thread and its port
                    # stayed.
                    with anyio.CancelScope(shield=True):
                        await self.prometheus.aclose()
            finally:
                release(self.bus, self)  # its places are free for another configure() of the bus
                self.bus._drop_close_hook(self)
                self._closed.set()

    async def _end_exports_now(self) -> None:
        """Past the close deadline (or cancelled): end our OTLP/HTTP sinks' sends at once (the
        request in flight, a backoff, the last export), so what they held is counted as dropped
        and their threads end; then wait, shielded, at most a second for their subscriptions to
        finish. The sinks' close ran in the bus's task, bounded by their own request timeout
        (10 s): against a collector that never answered, it went on after ``aclose()`` returned,
        the spans neither exported nor dropped, and the bus's close waited out its own deadline."""
        # Here, not at the top: the OTLP modules load only when an OTLP sink is made (16 ms of
        # `configure`'s import, with nothing to export); by now they are loaded if one was.
        from ckpt_events.sinks.otlp._http import OtlpHttpSender

        ours = [
            sub for sub in self.subscriptions if isinstance(getattr(sub.sink, "sender", None), OtlpHttpSender)
        ]
        if self.export_process is not None:
            # Its close never began (the flush took the deadline: a full pipe to a child that
            # stopped reading): it lived on, stopped, until the bus closed. Killed; its
            # subscription then ends below, what it held counted as dropped.
            self.export_process.abandon()
        now = time.monotonic()
        for sub in ours:
            sender: OtlpHttpSender = getattr(sub.sink, "sender")  # noqa: B009 (checked above)
            sender.close_by(now)  # a send after the cancel (the metric sink's last) gives up too
            sender.cancel()
        ending = ours + [sub for sub in self.subscriptions if sub.sink is self.export_process]
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_CLOSE_S):
            for sub in ending:
                await sub.aclose()

    def _feeding_provider(self) -> list[Subscription]:
        """The subscriptions of the sinks recording through the meter provider built here."""
        if self.meter_provider is None:
            return []
        from ckpt_events.sinks.otel._metric_sink import MetricSink

        return [sub for sub in self.subscriptions if isinstance(sub.sink, MetricSink)]

    async def _shut_provider_down(
        self, provider: MeterProvider, feeding: Sequence[Subscription], deadline: float
    ) -> None:
        """Close the sinks recording through ``provider`` (their last records reach it), then shut
        it down in what is left of ``deadline``."""
        for sub in feeding:
            await sub.aclose()
        self._provider_down = True
        if _was_shut_down(provider):
            return
        timeout_ms = max(0, int((deadline - anyio.current_time()) * 1000))
        await anyio.to_thread.run_sync(lambda: provider.shutdown(timeout_millis=timeout_ms))

    def close(self) -> None:
        """``aclose()`` from synchronous code (a ``BusThread``'s bus, a script): run on the bus's
        event loop when it runs on another thread, else in an event loop of its own (the bus
        closed, or never started: its sinks deliver what they hold and close, as ``aclose()``
        does). ``InvalidValueError`` on a thread running an event loop (it would block that
        loop: ``await configured.aclose()`` there). Idempotent."""
        if self._closed is not None and self._closed.is_set():
            return
        bus = self.bus
        if bus._tg is not None and bus._off_its_loop():
            assert bus._token is not None  # set while it runs
            anyio.from_thread.run(self.aclose, token=bus._token)
        elif bus._tg is None and not _in_an_event_loop():
            # Closed (its loop gone: the meter provider and endpoint are left), or never started:
            # refused then, and a script's events were never written (the export child left running).
            anyio.run(self.aclose)
        else:
            raise InvalidValueError(
                "Configured.close() on a thread running an event loop would block that loop: "
                "await configured.aclose() (or use `async with`) there"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _in_an_event_loop() -> bool:
    """Whether this thread runs an event loop (anyio's, asyncio's or trio's)."""
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:  # anyio's NoEventLoopError: no loop runs on this thread
        return False
    return True


def _was_shut_down(provider: MeterProvider) -> bool:
    """Whether our own ``provider`` was shut down already (your code shut it down: its
    ``MetricSink`` counted and said what it lost), so shutting it down again would add the
    SDK's "shutdown can only be called once" warning. The SDK says so only in a private flag."""
    return getattr(provider, "_shutdown", None) is True


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", Configured)
