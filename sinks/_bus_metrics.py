"""The bus's own counters on the Prometheus page: what became of the events each sink was offered.

A sink whose buffer overflowed (a stalled collector, a starved loop), a batch its ``handle``
raised on, events given up at the close deadline: each was counted in ``Bus.stats()``, which
only code that asked read. The page an operator scrapes said nothing, so metrics that had
lost events looked like a quiet fleet. ``PrometheusEndpoint(bus=...)`` (``configure()``
passes its bus) adds, read from ``bus.stats()`` at each scrape:

* ``ckpt_events_sink_events_total{sink, outcome}``: the events offered to each subscription,
  by what became of them: ``delivered``, ``dropped`` (its buffer was full), ``failed`` (in a
  batch its ``handle`` raised on) and ``abandoned`` (left at the bus's close deadline);
* ``ckpt_events_sink_pending_events{sink}``: the events waiting in its buffer now;
* ``ckpt_events_bus_dropped_after_close_total``: events emitted after the bus closed.

A name given again once its first subscription finished (``Bus.stats()`` keeps both rows) is
one series, the two rows summed: a page holds each label set once, and the sum only grows (past
``RETIRED_ROWS`` finished rows the bus sums the oldest into the next one of its name). The row of
rows summed away with no later one of their name (``EARLIER_SUBSCRIPTIONS``) is not on the page:
its sum rose by losses their own series had shown long before, which ``CheckpointTelemetryLost``
(an ``increase()`` over 10 minutes) paged as new; the series of a name with no row left ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ckpt_events import Bus
from ckpt_events._bus import EARLIER_SUBSCRIPTIONS

__all__ = ["OUTCOMES", "BusStatsCollector"]

#: The ``outcome`` label's values, each a ``SinkStats`` field.
OUTCOMES: Final = ("delivered", "dropped", "failed", "abandoned")


class BusStatsCollector:
    """A ``prometheus_client`` collector of ``bus``'s per-sink counters (see the module's note)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    def describe(self) -> list[Any]:
        return []  # the registry is built with auto_describe=False: nothing is collected to describe

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.bus.stats()  # safe from the scrape's thread
        totals: dict[str, list[int]] = {}
        for row in stats.sinks:
            if row.name == EARLIER_SUBSCRIPTIONS:
                continue
            counts = totals.setdefault(row.name, [0] * (len(OUTCOMES) + 1))
            for i, outcome in enumerate(OUTCOMES):
                counts[i] += getattr(row, outcome)
            counts[-1] += row.pending
        events = CounterMetricFamily(
            "ckpt_events_sink_events",
            "Events offered to each sink, by what became of them (dropped: its buffer was full; "
            "failed: its handle raised; abandoned: left at the bus's close deadline).",
            labels=("sink", "outcome"),
        )
        pending = GaugeMetricFamily(
            "ckpt_events_sink_pending_events",
            "Events waiting in each sink's buffer.",
            labels=("sink",),
        )
        for name, counts in totals.items():
            for i, outcome in enumerate(OUTCOMES):
                events.add_metric((name, outcome), counts[i])
            pending.add_metric((name,), counts[-1])
        yield events
        yield pending
        yield CounterMetricFamily(
            "ckpt_events_bus_dropped_after_close",
            "Events emitted after the bus had closed.",
            value=stats.dropped_after_close,
        )
