"""A Prometheus scrape endpoint over our own in-process metric aggregation.

``PrometheusSink`` folds events into the same ``MetricTotals`` that ``OtlpMetricSink`` keeps
(a few dict operations per event under a lock, nothing else on the event loop);
``PrometheusEndpoint`` serves any source with a ``snapshot()`` of those totals on
``http://host:port/metrics``, rendered by ``prometheus-client`` from ``TotalsCollector`` at
scrape time only, in the Prometheus text format or, when the scraper asks for
``application/openmetrics-text``, in OpenMetrics with one exemplar (trace and span id) per
histogram bucket; gzipped when the scraper accepts gzip (Prometheus always does), never else.
Names and labels are the Collector's Prometheus exporter's (``ckpt_events.sinks._prom_names``).
``configure`` builds both for ``OTEL_METRICS_EXPORTER=prometheus``.
The families are written by ``TotalsCollector`` (``_totals_collector``); what a request gets
(its method and path answered, the format and gzip chosen, a render shared) by ``_scrape_handler``.

The server (``_scrape_server``) reads request heads on one thread and gives a connection a
thread only once its head is complete, at most ``max_concurrent`` at once (more are answered
``503``), and scrapes arriving while a page of their format is rendered share that render: a
head must arrive within ``header_timeout`` and the whole request end within
``timeout``, and a reply the socket does not take at once is written by that one thread as its
peer reads it (cut off at the timeout, counted in ``slow_readers``), so slow or idle peers
cannot hold the scrape's slots. It never touches the event
loop, and reads the totals under the sink's lock only for the copy (microseconds for the few
hundred series a fleet has).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Self, cast

import anyio.to_thread

from ckpt_events import Bus, ConfigurationError, InvalidTypeError, InvalidValueError
from ckpt_events._errors import check_int, check_number, shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._bus_metrics import BusStatsCollector
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks._metric_totals import MetricTotals
from ckpt_events.sinks._scrape_handler import METRICS_PATH, scrape_handler
from ckpt_events.sinks._scrape_server import ScrapeServer, host_problem, listen_host
from ckpt_events.sinks._totals_collector import TotalsCollector, TotalsSource, prometheus_names
from ckpt_events.sinks.otlp._http import BUS_LINGER, MAX_TIMEOUT_S

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "METRICS_PATH",
    "PrometheusEndpoint",
    "PrometheusSink",
    "TotalsCollector",
    "TotalsSource",
    "prometheus_names",
]


logger: Final = library_logger("ckpt_events.sinks.prometheus")
DEFAULT_HOST: Final = "localhost"  # OTEL_EXPORTER_PROMETHEUS_HOST's default
DEFAULT_PORT: Final = 9464  # OTEL_EXPORTER_PROMETHEUS_PORT's default


class PrometheusSink:
    """A bus sink keeping the checkpoint metrics' cumulative totals for a scrape endpoint.

    Records what ``OtlpMetricSink`` records for the same events (it is the same aggregation),
    and exports nothing by itself: hand it to ``PrometheusEndpoint``. Each instrument keeps at
    most ``cardinality_limit`` label sets (OpenTelemetry's 2,000 by default); samples of sets
    first seen after that go to its one ``otel_metric_overflow="true"`` series, counted in
    ``overflowed`` and logged once.
    """

    interests: Final = keys.INTERESTS
    blocking: Final = False  # handle() only folds counts
    linger: Final = BUS_LINGER

    def __init__(self, *, cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT) -> None:
        self.start_ns = time.time_ns()
        self._totals = MetricTotals(cardinality_limit, owner="PrometheusSink")
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._said_forked = False

    def handle(self, batch: list[Any]) -> None:
        """Fold ``batch`` into the totals; in a process forked from the one that made the sink,
        say once that the endpoint serving them (made with it, in that process) does not."""
        if not self._said_forked and os.getpid() != self._owner:
            self._say_forked()
        with self._lock:
            self._totals.add(batch)

    def _say_forked(self) -> None:
        # configure() at import under gunicorn --preload: the master binds the port and serves
        # its own (empty) totals; 4 workers' 400 commits scraped as none, and nothing said so.
        self._said_forked = True
        logger.warning(
            "PrometheusSink: this process (pid %d) was forked from the one that made it (pid %d), "
            "whose scrape endpoint does not serve what this process counts: call configure() in "
            "each process after the fork (instrument() does it in each worker's lifespan; not at "
            "import under gunicorn --preload)",
            os.getpid(),
            self._owner,
        )

    def snapshot(self) -> MetricTotals:
        """A copy of the totals so far."""
        with self._lock:
            return self._totals.snapshot()

    @property
    def overflowed(self) -> int:
        """Measurements recorded in an instrument's overflow series, its label sets being full."""
        with self._lock:
            return self._totals.overflow.measurements

    @property
    def invalid(self) -> int:
        """Measurements refused as OpenTelemetry's SDK refuses them (a negative amount or
        duration, a non-finite or negative loop lag: an event built by hand), logged once."""
        with self._lock:
            return self._totals.invalid.measurements

    @property
    def untracked(self) -> int:
        """Operations started while ``MAX_OPEN`` (10,000) were open already: not in
        ``gym_checkpoint_open_operations`` nor ``..._oldest_open_s_seconds``, which undercount."""
        with self._lock:
            return self._totals.open_work.untracked


class PrometheusEndpoint:
    """``http://host:port/metrics`` serving ``source``'s totals until ``close``.

    A context manager, plain or async (``with``/``async with``: closed at the end), as the other
    servers are. ``port=0`` picks a free port (read ``port``); ``ports=N`` takes the first free one
    of ``port`` to ``port + N - 1`` (a port per worker process of one app). ``host`` is a name
    or an address, an IPv6 one bare or in brackets (``::1``, ``[::1]``; ``host`` holds it bare);
    ``""`` is every interface, as to the OS (``host`` holds ``0.0.0.0``), and a wildcard's ``url``
    names this machine's loopback (``127.0.0.1``, ``[::1]``). Binding fails with
    ``ConfigurationError`` naming the address; brackets around anything else, a ``:`` in a host
    that is not an IPv6 address (``localhost:9464``), a port outside 0-65535, ``max_concurrent``
    below 1 or a timeout that is not a number of seconds in (0, 3600] raise ``InvalidValueError``
    (``InvalidTypeError``: not a str or a number) before anything is bound. ``max_concurrent``
    scrapes run at once; a connection must send its request head within ``header_timeout`` and
    read its whole reply within ``timeout`` (both from its accept), else it is closed; a slot is
    held while a page is rendered, never while a peer reads it. Given a ``bus``, the page also
    says what became of the events each of its sinks was offered
    (``ckpt_events_sink_events_total{sink, outcome}``: delivered, dropped, failed, abandoned;
    ``configure()`` passes its bus).
    """

    def __init__(
        self,
        source: TotalsSource,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        max_concurrent: int = 8,
        timeout: float = 5.0,
        header_timeout: float = 2.0,
        bus: Bus | None = None,
        ports: int = 1,
    ) -> None:
        # Unchecked, max_concurrent=0 answered every scrape 503 and timeout=0 closed every
        # connection unanswered, for the life of the endpoint; port=70000 was an OverflowError.
        port_message = f"port must be a TCP port number from 0 to 65535, not {shown(port)}"
        if check_int(port, port_message) > 65535:
            raise InvalidValueError(port_message)
        ports_message = f"ports must be an int from 1 to {65536 - port} for port {port}, not {shown(ports)}"
        if check_int(ports, ports_message, minimum=1) > 65536 - port or (ports > 1 and port == 0):
            raise InvalidValueError(ports_message)
        check_int(
            max_concurrent, f"max_concurrent must be an int >= 1, not {shown(max_concurrent)}", minimum=1
        )
        if not isinstance(host, str):
            raise InvalidTypeError(f"host must be a str, not {shown(host)}")
        problem = host_problem(host)
        if problem is not None:
            raise InvalidValueError(f"host {shown(host)} {problem}; put the port in port")
        # "" is 0.0.0.0 to bind(): named so, it shows in ``host`` and the errors below (":9464").
        host = listen_host(host) or "0.0.0.0"
        for name, seconds in (("timeout", timeout), ("header_timeout", header_timeout)):
            check_number(
                seconds,
                f"{name} must be seconds in (0, {MAX_TIMEOUT_S:g}], not {shown(seconds)}",
                high=MAX_TIMEOUT_S,
                low_open=True,
            )
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigurationError(
                "OTEL_METRICS_EXPORTER=prometheus needs prometheus-client: "
                "pip install 'ckpt-events[prometheus]'"
            ) from None
        self.source = source
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = TotalsCollector(source)
        # Cast: prometheus-client before 0.24 typed register() with its Collector ABC, which ours
        # satisfy at runtime (collect, describe) without deriving from it; from 0.24 a Protocol.
        self.registry.register(cast("Collector", self.collector))
        if bus is not None:  # what each of its sinks lost, beside what they counted
            self.registry.register(cast("Collector", BusStatsCollector(bus)))
        self._server = self._bind(host, port, ports, max_concurrent, header_timeout, timeout)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,  # woken by work, no poll: an idle server sleeps
            name=f"ckpt-events-prometheus-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _bind(
        self, host: str, port: int, ports: int, max_concurrent: int, header_timeout: float, timeout: float
    ) -> ScrapeServer:
        """The server on the first of ``ports`` ports from ``port`` that is free: each worker
        process of one app (uvicorn ``--workers``, gunicorn) configures its own endpoint, and
        one port stopped the whole server at the second worker's startup."""
        for candidate in range(port, port + ports):
            try:
                return ScrapeServer(
                    (host, candidate),
                    scrape_handler(self.registry),
                    max_concurrent,
                    header_timeout=header_timeout,
                    timeout=timeout,
                )
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and candidate < port + ports - 1:
                    continue  # another worker's (or another server's): the next one
                failure = exc
                break
        where = f"{host}:{port}" if ports == 1 else f"{host}:{port}-{port + ports - 1}"
        if failure.errno != errno.EADDRINUSE:
            fix = "set OTEL_EXPORTER_PROMETHEUS_HOST/OTEL_EXPORTER_PROMETHEUS_PORT to a free address"
        elif ports == 1:
            fix = (
                "set OTEL_EXPORTER_PROMETHEUS_PORT to a free port; under uvicorn --workers N or "
                "gunicorn -w N, set CKPT_EVENTS_PROMETHEUS_PORTS=N too, a port per worker process "
                "('Several worker processes' in docs/fastapi.md)"
            )
        else:
            # Which processes hold them is unknown here: too few ports for the workers, or a
            # graceful reload (gunicorn's HUP) whose old workers still hold all N of theirs.
            fix = (
                "every one is in use (by other worker processes, by ones a reload such as gunicorn's "
                "HUP is replacing, which exit after the new ones start, or by another program): set "
                "CKPT_EVENTS_PROMETHEUS_PORTS to at least the number of worker processes, twice the "
                "number of worker processes to survive a reload, with the ports from "
                "OTEL_EXPORTER_PROMETHEUS_PORT free ('Several worker processes' in docs/fastapi.md)"
            )
        raise ConfigurationError(
            f"cannot serve Prometheus metrics on {where} ({failure.strerror or failure}); {fix}"
        ) from None

    @property
    def url(self) -> str:
        """The metrics URL; for a wildcard host (``0.0.0.0``, ``::``), at this machine's loopback
        of its family: no client can reach "every interface" (``http://:9464`` was no URL at all)."""
        host = self.host
        bound = ipaddress.ip_address(self._server.server_address[0].partition("%")[0])
        if bound.is_unspecified:
            host = "::1" if bound.version == 6 else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}{METRICS_PATH}"

    @property
    def refused(self) -> int:
        """Connections answered 503 (with ``Retry-After: 1``): ``max_concurrent`` scrapes were
        running, no thread could be started for one, every place for a connection waiting for
        its request head was taken by one that had just arrived, or the render a scrape joined
        had not ended by that scrape's ``timeout``."""
        return self._server.refused

    @property
    def timed_out(self) -> int:
        """Connections closed for not sending a request head within ``header_timeout``."""
        return self._server.timed_out

    @property
    def displaced(self) -> int:
        """Connections without a complete request head closed to make room for a new one, once
        as many waited as the endpoint holds (128 from one address, 256 in all): the peer sees the
        connection reset, having sent nothing in time, as an idle peer or a CPU-starved client."""
        return self._server.displaced

    @property
    def serving(self) -> int:
        """Scrapes holding one of the endpoint's slots now (rendering, or sending the start of
        their reply): 0 once every scrape's reply is written or handed on. A peer sees its reply
        begin a moment before its slot is free again."""
        return self._server.serving

    @property
    def slow_readers(self) -> int:
        """Replies cut off because their peer did not read them to the end within ``timeout``
        of its connecting, or was the longest still reading when 32 others were: a peer that
        reads slowly or not at all, never holding a scrape's slot meanwhile."""
        return self._server.slow_readers

    @property
    def failed(self) -> int:
        """Scrapes answered 500: rendering the page raised (the first one is logged, with its
        traceback, on ``ckpt_events.sinks.prometheus``)."""
        return self._server.failed

    @property
    def accept_failures(self) -> int:
        """Connections the endpoint could not accept (out of descriptors, say): each retried
        after a pause, never in a loop (the first is logged)."""
        return self._server.accept_failures

    @property
    def replaced_values(self) -> int:
        """Label values written with U+FFFD for a lone surrogate (``TotalsCollector``'s count)."""
        return self.collector.replaced_values

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    async def aclose(self) -> None:
        """``close`` off the event loop (it waits for the serving thread)."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
