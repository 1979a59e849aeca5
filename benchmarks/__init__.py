"""Ratio benchmarks: each suite prints a table measured side by side in one run and writes JSON.

Run them all with ``ckpt-events bench`` (installed, the package is ``ckpt_events.benchmarks``), or
one from a checkout with ``python -m ckpt_events.benchmarks.bench_core`` (``bench_sinks``, ``bench_scale``).
"""

#: Every suite ``ckpt-events bench --only`` runs (``bench_<name>.py`` here, each with ``run(quick)``).
SUITES = (
    "core",
    "sinks",
    "otlp",
    "scale",
    "server",
    "workers",
    "report",
    "watch",
    "prometheus",
    "connections",
    "fleet_trace",
    "curves",
)
