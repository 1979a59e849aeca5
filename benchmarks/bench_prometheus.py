"""Cost per event of our metric aggregation with the Prometheus scrape endpoint off and on.

The same checkpoint mix as the sinks benchmark (``bench_sinks._metric_mix``) is folded into a
``PrometheusSink`` in batches of 4096, in paired rounds: off (no endpoint) and on (an endpoint
on 127.0.0.1 scraped in OpenMetrics, with exemplars, ten times a second by a thread of this
process: ten times Prometheus's usual rate, and in-process so the GIL is shared). The scrape
renders from a snapshot; the request path only folds, so the two should be close: SPEC 9,
"Prometheus", wants no measurable difference (a spread over the rounds that covers 1.0), or less.
Both sinks are warmed alike before their timing: the "on" one alone was, and its fold of label
sets already made read 0.468 of the "off" one's first fold (a quick run), a gain no endpoint makes.
Each fold is timed in this thread's CPU (the scrapes' own CPU is per scrape, not per event): in
wall time, other processes on a shared machine made rounds of 3.4 ms read 7.3 ms at random.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ckpt_events.benchmarks import report
from ckpt_events.benchmarks.bench_sinks import RESOURCE, _direct_metrics, _metric_mix
from ckpt_events.benchmarks.spread import Ratio
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink

DEFAULT_JSON = Path(__file__).parent / "results" / "prometheus.json"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _feed(sink: PrometheusSink, chunks: list[list[Any]]) -> float:
    started = time.thread_time()
    for chunk in chunks:
        sink.handle(chunk)
    return time.thread_time() - started


def _round(chunks: list[list[Any]], scraped: bool, scrapes: list[int]) -> tuple[float, PrometheusSink]:
    """One round's seconds to fold ``chunks`` into a new sink, with the endpoint ``scraped`` or
    not, and the sink. Each sink folds the first chunk untimed: every label set is made before
    the timing, on or off, and the first scrape has something to render."""
    sink = PrometheusSink()
    _feed(sink, chunks[:1])
    gc.collect()  # the previous round's garbage (an SDK's provider) collected in neither timing
    if not scraped:
        return _feed(sink, chunks), sink
    endpoint = PrometheusEndpoint(sink, "127.0.0.1", 0)
    stop = threading.Event()
    scraper = threading.Thread(target=_scraper, args=(endpoint.url, stop, scrapes))
    scraper.start()
    time.sleep(0.15)  # at least one scrape in flight or done before timing
    try:
        return _feed(sink, chunks), sink
    finally:
        stop.set()
        scraper.join(10)
        endpoint.close()


def on_within_off(ratio: Ratio) -> bool:
    """The verdict of "on / off": nothing added per event, i.e. no measurable difference (the
    spread covers 1.0), or on no slower than off."""
    return ratio.covers_one or ratio <= 1.0


def _scraper(url: str, stop: threading.Event, counts: list[int]) -> None:
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    while not stop.wait(0.1):  # ends when the benchmark sets stop
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
        counts[0] += 1


def _sdk(events: list[Any]) -> float:
    """The same events as one OpenTelemetry SDK call per measurement (InMemoryMetricReader)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], resource=RESOURCE)
    meter = provider.get_meter("bench")
    started = time.thread_time()
    _direct_metrics(meter, events)
    elapsed = time.thread_time() - started
    provider.shutdown()
    return elapsed


def run(quick: bool = False) -> dict[str, Any]:
    """Paired rounds off/on; returns the figures and the table's rows."""
    events = _metric_mix(400 if quick else 2_000)
    chunks = [events[i : i + 4096] for i in range(0, len(events), 4096)]
    rounds = 5 if quick else 15
    off: list[float] = []
    on: list[float] = []
    scrapes = [0]
    sdk: list[float] = []
    # One untimed round of each first: the process's first fold (its code and caches cold) read
    # 3.5x the others and stretched every spread to cover 1.0, a verdict nothing could fail.
    _sdk(events)
    _round(chunks, False, [0])
    _round(chunks, True, [0])
    for _ in range(rounds):
        sdk.append(_sdk(events))
        off.append(_round(chunks, False, scrapes)[0])
        on.append(_round(chunks, True, scrapes)[0])
    per_off = min(off) / len(events) * 1e6
    per_on = min(on) / len(events) * 1e6
    ratio = report.paired_ratio(on, off)
    vs_sdk = report.paired_ratio(on, sdk)
    rows = [
        ("metrics aggregation: us per event, scrape endpoint off", per_off, "", None),
        ("metrics aggregation: us per event, scrape endpoint on (10 scrapes/s)", per_on, "", None),
        (
            "metrics aggregation: on / off, paired rounds",
            ratio,
            "no measurable difference, or < 1",
            on_within_off(ratio),
        ),
        (
            "scrapes answered 200 while the 'on' rounds ran",
            scrapes[0],
            f">= {rounds} (one a round)",
            scrapes[0] >= rounds,
        ),
        (
            "metrics aggregation, endpoint on / OpenTelemetry SDK direct calls",
            vs_sdk,
            "<= 0.25",
            vs_sdk <= 0.25,
        ),
        ("metrics: us per event, OpenTelemetry SDK direct calls", min(sdk) / len(events) * 1e6, "peer", None),
    ]
    return {
        "quick": quick,
        "events": len(events),
        "rounds": rounds,
        "us_per_event_off": per_off,
        "us_per_event_on": per_on,
        "ratio_on_off": ratio,
        "ratio_on_vs_sdk": vs_sdk,
        "scrapes": scrapes[0],
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the results"
    )
    args = parser.parse_args(argv)
    with report.failure_in_one_line("prometheus"):
        result = run(quick=args.quick)
        rows = result.pop("rows")
        report.publish(
            "ckpt-events: the Prometheus scrape endpoint's cost on the event path", rows, args.json, result
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
