"""Issue 29's metric flood: 200,000 distinct refusal codes through ``bus.emit`` into the
Prometheus sink. The scrape page stays under 2 MB and RSS grows under 100 MiB (before: a 20.7 MB
page and +211 MiB). The events are built as they are emitted, so no list of them is part of the
baseline or freed before the measurement."""

from __future__ import annotations

import gc
import os
import urllib.request

from ckpt_events import Bus, Refused
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink

CODES = 200_000
#: Done-when of issue 29.
PAGE_BYTES = 2_000_000
GROWTH = 100 * 2**20
#: Emitted between flushes, so the bus's buffer never drops an event.
_BATCH = 10_000


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


async def test_200k_refusal_codes_keep_the_page_under_2_mb_and_rss_growth_under_100_mib() -> None:
    """Each code a new label value, built as it is emitted (``bus.emit`` does not check an
    event's fields); the page is scraped over HTTP after the flood, RSS measured before anything
    is freed."""
    sink = PrometheusSink()
    endpoint = PrometheusEndpoint(sink, "127.0.0.1", 0)
    try:
        _scrape(endpoint.url)  # the server and the page's code warmed up before the baseline
        gc.collect()
        before = _rss()
        async with Bus() as bus:
            subscription = bus.subscribe(sink)
            for start in range(0, CODES, _BATCH):
                for i in range(start, start + _BATCH):
                    code = f"code-{i:06d}"
                    bus.emit(Refused(kind="model", instance="model-0", time_ns=i, code=code))  # type: ignore[arg-type]
                await bus.flush()
            assert subscription.stats().dropped == 0
            assert subscription.stats().delivered == CODES
        page = _scrape(endpoint.url)
        grown = _rss() - before
    finally:
        endpoint.close()
    print(f"{CODES:,} codes: page {len(page) / 1e6:.2f} MB, RSS grew {grown / 2**20:.1f} MiB")
    assert len(page) < PAGE_BYTES
    assert grown < GROWTH, f"RSS grew {grown / 2**20:.0f} MiB"
    # Every refusal is still counted: past the limit, under the overflow series.
    totals = [line for line in page.decode().splitlines() if line.startswith("gym_checkpoint_events_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in totals) == CODES
    assert any('otel_metric_overflow="true"' in line for line in totals)
