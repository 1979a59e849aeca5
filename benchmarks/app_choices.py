"""The choices ``ckpt-events bench --app`` offers (``--sinks``, ``--connections``, ``--driver``).

Apart from ``bench_app`` and ``load``, which use them: the command line builds every command's
parser on each start (``serve`` and ``--help`` too), and importing those two for three constants
brought http.client, email, ssl and the suites' reporting into every server process.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DRIVERS", "MAX_CONNECTIONS", "SINKS"]

#: The sinks ``--sinks`` may name, each with what it is (for the table).
SINKS: Final = {
    "jsonl": "JSON lines to a file",
    "otlp": "OTLP/HTTP spans and metrics to a rotel collector",
    "prometheus": "Prometheus /metrics endpoint (not scraped)",
}
#: ``--connections`` at most: 99,999,999 had wrk ask for 834 GB, 100,000 ran past its time-out,
#: and the httpx driver would start a task for each (10,000 open within a slice here).
MAX_CONNECTIONS: Final = 10_000
#: The load generators: ``auto`` picks wrk when it is installed, else httpx.
DRIVERS: Final = ("auto", "wrk", "httpx")
