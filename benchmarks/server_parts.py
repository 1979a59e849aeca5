"""Where the server's added CPU goes: the bench server's request, each sink set on its own.

``python -m ckpt_events.benchmarks.server_parts [--rounds R] [--requests N]`` runs the
``server`` suite's request (``server_app._ours``: an operation with two steps around a small
unit of work) in one process as a loaded server runs it: 32 requests a loop turn, then a
3 ms wait, as uvicorn serving 32 busy connections does. Each variant subscribes one set of
sinks: none; a sink that takes every event and does nothing (what emitting, turning handles
into events and delivering cost); JSON lines; ``OtlpSpanSink``; ``OtlpMetricSink``; and every
sink as the ``server`` suite's ``all`` (``configure()`` with OTLP to rotel, JSON lines and the
Prometheus endpoint); and ``all`` with ``export_process=True`` (the same sinks in a child
process). Per variant it prints the process CPU per request added over no sink (the best of
the rounds, which are interleaved), and how much of it ran on threads other than the loop's
(the OTLP export workers); for the export process, its own CPU per request too. The OTLP
variants need rotel and say so without it.

This isolates the library's share: the ``server`` suite measures the same request through
uvicorn and FastAPI, whose own ~200-260 us per request are the denominator of its ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import anyio

from ckpt_events import Bus, Telemetry

from . import report, rotel
from .load import settled, stat_cpu_seconds
from .server_app import _Null, _ours

__all__ = ["VARIANTS", "run"]

VARIANTS: Final = ("no_sink", "null", "jsonl", "otlp_spans", "otlp_metrics", "all", "all_export_process")
_NEEDS_COLLECTOR: Final = frozenset({"otlp_spans", "otlp_metrics", "all", "all_export_process"})
_PER_TURN: Final = 32
_TURN_WAIT: Final = 0.003


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[task.name] = stat_cpu_seconds(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
    return out


@contextlib.contextmanager
def _files() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


async def _subscribe(
    variant: str, bus: Bus, collector: str | None, stack: contextlib.AsyncExitStack
) -> int | None:
    """Subscribe ``variant``'s sinks; the export process's pid for ``all_export_process``."""
    from ckpt_events import sinks

    folder = stack.enter_context(_files())
    if variant == "null":
        bus.subscribe(_Null())
    elif variant == "jsonl":
        bus.subscribe(sinks.JsonLinesSink(folder / "events.jsonl"))
    elif variant in ("otlp_spans", "otlp_metrics", "all", "all_export_process"):
        environ = {"OTEL_METRICS_EXPORTER": "none"}
        if variant == "otlp_metrics":
            environ = {"OTEL_TRACES_EXPORTER": "none"}
        elif variant in ("all", "all_export_process"):
            environ = {
                "OTEL_METRICS_EXPORTER": "otlp,prometheus",
                "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
            }
        configured = sinks.configure(
            bus,
            otlp_endpoint=collector,
            jsonl_path=folder / "events.jsonl" if variant.startswith("all") else None,
            service_name="bench-server-parts",
            environ=environ,
            export_process=variant == "all_export_process",
        )
        stack.push_async_callback(configured.aclose)
        if configured.export_process is not None:
            return configured.export_process.pid
    return None


async def _serve(handle: Callable[[bytes], int], requests: int) -> None:
    body = b"x" * 2048
    for i in range(requests):
        handle(body)
        if i % _PER_TURN == _PER_TURN - 1:
            await asyncio.sleep(_TURN_WAIT)


async def _one(
    variant: str, collector: str | None, requests: int, batch_interval: float | None = None
) -> tuple[float, float, float]:
    """(process CPU us per request, of it on other threads than the loop's, the export
    process's CPU us per request) for ``variant``."""
    bus = Bus() if batch_interval is None else Bus(batch_interval=batch_interval)
    async with bus, contextlib.AsyncExitStack() as stack:
        child = await _subscribe(variant, bus, collector, stack)
        child_stat = Path(f"/proc/{child}/stat") if child is not None else None
        handle = _ours(Telemetry(bus, kind="resources", instance="resources-0"))
        await _serve(handle, requests // 5)  # warm-up
        await bus.flush()
        loop_thread = str(threading.get_native_id())
        child_before = stat_cpu_seconds(child_stat) if child_stat is not None else 0.0
        before = _thread_cpu()
        await _serve(handle, requests)
        await bus.flush()
        # The export workers' share: let them send what the flush handed them.
        await anyio.sleep(0.05)
        after = _thread_cpu()
        # The export process's share: it has read and handled everything when its CPU stops
        # growing (bounded: 5 s).
        child_cpu = 0.0
        if child_stat is not None:
            stat = child_stat
            child_cpu = await anyio.to_thread.run_sync(settled, lambda: stat_cpu_seconds(stat)) - child_before
    total = sum(after.values()) - sum(before.get(k, 0.0) for k in after)
    others = sum(v - before.get(k, 0.0) for k, v in after.items() if k != loop_thread)
    return total / requests * 1e6, others / requests * 1e6, child_cpu / requests * 1e6


def run(rounds: int = 5, requests: int = 20_000, batch_interval: float | None = None) -> dict[str, Any]:
    """Every variant, ``rounds`` interleaved rounds; returns the figures and the table's rows.

    ``batch_interval`` is the bus's (default: ``Bus``'s own)."""
    with rotel.collector() as collector:
        variants = [v for v in VARIANTS if collector or v not in _NEEDS_COLLECTOR]
        per: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
                per[variant].append(anyio.run(_one, variant, collector, requests, batch_interval))
    best = {v: min(values) for v, values in per.items()}
    base = best["no_sink"][0]
    rows: list[tuple[str, Any, str, bool | None]] = [
        ("us CPU per request, no sink (the request alone)", base, "", None)
    ]
    for variant in variants[1:]:
        total, others, child = best[variant]
        what = f"us CPU per request added: {variant} (of it on other threads: {others:.1f})"
        rows.append((what, total - base, "", None))
        if variant == "all_export_process":
            rows.append(("us CPU per request in the export process (all_export_process)", child, "", None))
    for variant in VARIANTS:
        if variant not in per:
            rows.append((f"us CPU per request added: {variant} ({rotel.why_missing()})", None, "", None))
    return {
        "rounds": rounds,
        "requests": requests,
        "batch_interval": batch_interval,
        "per_round_us": per,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the best is kept)")
    parser.add_argument("--requests", type=int, default=20_000, help="requests per variant and round")
    parser.add_argument(
        "--batch-interval", type=float, default=None, help="the bus's batch_interval (default: Bus's own)"
    )
    parser.add_argument("--json", type=report.output_path, default=None, help="where to write the figures")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.rounds, args.requests, args.batch_interval)
    rows = result.pop("rows")
    report.print_table("the bench server's request: CPU added per sink set", rows)
    print(report.markdown_table(rows))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json is not None:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
