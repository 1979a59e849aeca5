"""A metric exporter that exports only in the process that built it.

OpenTelemetry's periodic metric reader restarts its export thread in a forked child (its own
``os.register_at_fork``), and the child's copy of the meter provider holds the parent's
cumulative totals: a child that emitted nothing (a ``fork`` multiprocessing worker, a data
loader) exported them every interval for as long as it lived, under a new
``service.instance.id``, so a backend summing over instances counted the parent's work twice
(a child living 3 s at a 300 ms interval: 9 exports of the parent's 10 commits). Events emitted
in the child reach no sink of the parent's bus (counted there, said once), so every point the
child's copy holds is the parent's, exported by the parent: nothing is lost by skipping them.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

__all__ = ["ThisProcessOnly"]


class ThisProcessOnly(MetricExporter):
    """``inner``, in the process that built it; in a process forked from that one, ``export`` sends
    nothing (returns success) and ``force_flush`` and ``shutdown`` leave ``inner`` alone (its
    channel, its stream are the parent's)."""

    def __init__(self, inner: MetricExporter) -> None:
        # The reader asks its exporter what temporality and aggregation it prefers: the inner one's.
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self._owner = os.getpid()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._owner:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if os.getpid() != self._owner:
            return True
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._owner:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
