"""Server under load: server CPU per request with each telemetry variant, vs uninstrumented.

In each round every variant's server (``ckpt_events.benchmarks.server_app``, uvicorn, one
process each) is started on 127.0.0.1 and warmed up, then each is sent the same number of
requests by our own bounded load generator (``connections`` keep-alive HTTP/1.1 connections,
asyncio, in this process) in ``SLICES`` slices, the variants' slices alternating, so a burst of
other work on this shared machine falls on every variant alike. Server CPU is read from the
server process's own counters over the whole round and divided by the requests it answered:
its CPU clock (every thread's time on a CPU as the scheduler counts it, to the nanosecond,
``load.CpuReading``), or where that cannot be read its user + system ticks
(``/proc/<pid>/stat``, 10 ms each: 1 us a request over a round of 10,000, the kernel's sampling
noise on top); the ticks' figure is kept beside in the JSON (``rounds_ticks_us``), and a row
says how many readings were exact. With two or more
cores the servers are pinned to one and this process (and an export process) to another.
Rounds rotate the variants' order; each ratio is taken within a round and the figure is its
median over rounds; the absolute rows are medians. ``otlp``, ``all`` (every sink on:
``otlp``'s two, JSON lines, the Prometheus endpoint), ``all_export_process`` (``all`` in
``configure()``'s export process: its CPU, read from the server's children once they settle,
has rows of its own, alone and added to the server's) and ``sdk`` need the ``rotel`` collector
(skipped without), and so
does ``nemo_lens``, which also needs an interpreter with nemo-lens (``ckpt_events.benchmarks.nemo_lens_row``);
``nemo_lens_uninstrumented`` is its server without telemetry, on that interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final, NamedTuple

from . import nemo_lens_row, report, rotel
from .load import (
    children_pids,
    cores_apart,
    cpu_reading,
    settled_children_cpu_seconds,
    spawn,
    stop_process,
)
from .server_app import VARIANTS
from .spread import Ratio

DEFAULT_JSON = Path(__file__).parent / "results" / "server.json"
#: Server CPU per request / the uninstrumented server's, and the CPU added / the SDK's (issue #30).
_RATIO_TARGETS: Final = {"otlp": 1.15, "all": 1.08, "all_export_process": 1.08}
_ADDED_TARGETS: Final = {"otlp": 0.15, "all": 0.08, "all_export_process": 0.08}
#: Each variant's requests of a round go in this many slices, the variants' slices alternating:
#: a burst of other work on a shared machine falls on every variant, not on one's whole run.
SLICES: Final = 10
_BODY = b"x" * 2048
_REQUEST = (
    b"POST /work HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
    b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


async def _connection(port: int, requests: int, deadline: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        for _ in range(requests):
            if time.monotonic() > deadline:
                break
            writer.write(_REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"server answered {head[:40]!r}")
            done += 1
    finally:
        writer.close()
    return done


async def _load(port: int, requests: int, connections: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    # Spread exactly: 100 requests on 32 connections are 4 connections of 4 and 28 of 3 (each
    # connection's share rounded down made 0 for every one: nothing sent, a ZeroDivisionError).
    per, extra = divmod(requests, connections)
    counts = await asyncio.gather(
        *(_connection(port, per + (i < extra), deadline) for i in range(connections))
    )
    return sum(counts)


def _start(
    variant: str,
    port: int,
    collector: str | None,
    core: int | None,
    lens_python: str | None = None,
    batch_interval: float | None = None,
    module: tuple[str, ...] = ("server_app",),
) -> subprocess.Popen[bytes]:
    """Start ``variant``'s server: ``python -m <package>.<module[0]> *module[1:] VARIANT PORT ...``."""
    command = [sys.executable, "-m", f"{__package__}.{module[0]}", *module[1:], variant, str(port)]
    if collector or batch_interval is not None:
        command.append(collector or "")
    if batch_interval is not None:
        command.append(str(batch_interval))
    # PYTHONSAFEPATH: the child's path is ours, never its working directory's modules.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONSAFEPATH": "1"}
    if variant in nemo_lens_row.VARIANTS and lens_python and collector:
        lens_collector = collector if variant == nemo_lens_row.VARIANT else None
        command, env = nemo_lens_row.command(lens_python, port, lens_collector), nemo_lens_row.environment()
    proc = spawn(command, env=env, stdin=subprocess.DEVNULL)
    with contextlib.ExitStack() as starting:
        # Stopped unless it answers: a Ctrl-C while it started left it running, and so did a
        # server that never answered.
        starting.callback(_stop, proc)
        if core is not None:
            os.sched_setaffinity(proc.pid, {core})
        deadline = time.monotonic() + 30
        for _ in range(3000):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {variant} server did not start")
            try:
                asyncio.run(_load(port, 1, 1, 5))
                starting.pop_all()
                return proc
            except OSError:
                time.sleep(0.05)
    raise RuntimeError(f"the {variant} server did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, timeout=15)


def _round(
    order: list[str],
    collector: str | None,
    requests: int,
    connections: int,
    cores: tuple[int, int] | None,
    lens_python: str | None = None,
    batch_interval: float | None = None,
) -> dict[str, _Measured]:
    """One round: every variant's server up at once, the load alternating between them in
    ``SLICES`` slices each; per variant its server's and its children's (the export process's)
    CPU microseconds per request, each read over the whole round."""
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        for variant in order:
            port = rotel.free_port()
            proc = _start(variant, port, collector, cores[0] if cores else None, lens_python, batch_interval)
            stack.callback(_stop, proc)
            servers[variant] = (proc, port)
        for proc, port in servers.values():
            asyncio.run(_load(port, requests // 5, connections, 60))  # warm-up
            if (
                cores is not None
            ):  # an export process runs beside the server, as on a machine with cores to spare
                _pin_children(proc.pid, cores[1])
        children_before = {v: settled_children_cpu_seconds(proc.pid) for v, (proc, _) in servers.items()}
        before = {v: cpu_reading(proc.pid) for v, (proc, _) in servers.items()}
        done = dict.fromkeys(order, 0)
        for _ in range(SLICES):
            for variant in order:
                done[variant] += asyncio.run(_load(servers[variant][1], requests // SLICES, connections, 120))
        after = {v: cpu_reading(proc.pid) for v, (proc, _) in servers.items()}
        children_after = {v: settled_children_cpu_seconds(proc.pid) for v, (proc, _) in servers.items()}
    measured = {}
    for v in order:
        seconds, exact = after[v].since(before[v])
        measured[v] = _Measured(
            seconds / done[v] * 1e6,
            (children_after[v] - children_before[v]) / done[v] * 1e6,
            (after[v].ticks - before[v].ticks) / done[v] * 1e6,
            exact,
        )
    return measured


class _Measured(NamedTuple):
    """A variant's round: server and children CPU us per request, the server's in ticks too
    (``CpuReading``), and whether its figure is the exact one."""

    server: float
    children: float
    ticks: float
    exact: bool


def _pin_children(pid: int, core: int) -> None:
    for child in children_pids(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            os.sched_setaffinity(child, {core})


def _skipped(collector: str | None) -> dict[str, str]:
    """The variants that cannot run here, each with why and how to get what it needs."""
    skipped: dict[str, str] = {}
    if collector is None:
        for variant in ("otlp", "all", "all_export_process", "sdk"):
            skipped[variant] = rotel.why_missing()
    elif importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        skipped["sdk"] = "skipped: needs OpenTelemetry's OTLP exporter (pip install 'ckpt-events[otel]')"
    return skipped


def run(
    quick: bool = False,
    nemo_lens_python: str | None = None,
    connections: int = 32,
    batch_interval: float | None = None,
    requests: int | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """All variants, rounds rotated; returns the figures and the ratio table's rows.

    ``nemo_lens_python`` (default: ``$CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON``) runs the nemo-lens row.
    ``connections``: the load's keep-alive connections (1: one request a loop turn, a server
    not saturated); ``batch_interval``: our servers' bus's (default: ``Bus``'s own);
    ``requests`` (per variant and round) and ``rounds`` override ``quick``'s or the full run's.
    """
    default_requests, default_rounds = (2_000, 3) if quick else (10_000, 7)
    requests = default_requests if requests is None else requests
    rounds = default_rounds if rounds is None else rounds
    if requests < SLICES or rounds < 1:
        raise ValueError(
            f"requests ({requests}) must be at least {SLICES} (one a slice) and rounds ({rounds}) at least 1"
        )
    lens = nemo_lens_row.probe(nemo_lens_python or os.environ.get(nemo_lens_row.ENV))
    with cores_apart() as cores, rotel.collector() as collector:
        # A variant that cannot run keeps its rows, saying why and how (never dropped silently).
        skipped = _skipped(collector)
        variants = [v for v in VARIANTS if v not in skipped]
        if lens.python and not collector:
            lens = nemo_lens_row.LensInterpreter(None, skipped="needs the rotel collector")
        if lens.python:
            variants.extend(nemo_lens_row.VARIANTS)
        per: dict[str, list[float]] = {v: [] for v in variants}
        children: dict[str, list[float]] = {v: [] for v in variants}
        ticks: dict[str, list[float]] = {v: [] for v in variants}
        exact = 0
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            measured = _round(order, collector, requests, connections, cores, lens.python, batch_interval)
            for variant, one in measured.items():
                per[variant].append(one.server)
                children[variant].append(one.children)
                ticks[variant].append(one.ticks)
                exact += one.exact
    us = {v: statistics.median(values) for v, values in per.items()}
    base_rounds = per["uninstrumented"]
    paired = {v: report.paired_ratio(values, base_rounds) for v, values in per.items()}
    rows: list[tuple[str, Any, str, bool | None]] = []
    names = {
        "uninstrumented": "uninstrumented",
        "no_sink": "ckpt-events, no sink",
        "null": "ckpt-events, a sink that does nothing (the events built and delivered)",
        "jsonl": "ckpt-events, JSON lines",
        "otlp": "ckpt-events, configure(): OtlpSpanSink + OtlpMetricSink, OTLP/HTTP to rotel",
        "all": "ckpt-events, every sink: OTLP spans + metrics to rotel, JSON lines, /metrics endpoint",
        "all_export_process": "ckpt-events, every sink in configure()'s export process",
        "sdk": "OpenTelemetry SDK directly (BatchSpanProcessor), OTLP/HTTP to rotel",
        **{v: nemo_lens_row.name(v, lens.runtime) for v in nemo_lens_row.VARIANTS},
    }
    for variant in variants[1:]:  # the first is the uninstrumented baseline itself
        ratio = paired[variant]
        limit = _RATIO_TARGETS.get(variant)
        rows.append(
            (
                f"server CPU/request: {names[variant]} / uninstrumented",
                ratio,
                f"<= {limit}" if limit else "",
                ratio <= limit if limit else None,
            )
        )
    if lens.skipped:
        rows.append(nemo_lens_row.skipped_row(lens.skipped))
    else:
        rows.append(nemo_lens_row.same_interpreter_row(per, lens.runtime))
    for variant, why in skipped.items():
        rows.append((f"server CPU/request: {names[variant]} / uninstrumented ({why})", None, "", None))
    if "all_export_process" in per:
        # What the export process spends on top: never left out of the page that quotes the
        # server's share.
        pair = [s + c for s, c in zip(per["all_export_process"], children["all_export_process"], strict=True)]
        both = report.paired_ratio(pair, base_rounds)
        rows.append(
            (
                f"server + export process CPU/request: {names['all_export_process']} / uninstrumented",
                both,
                "",
                None,
            )
        )
    for variant, label in (
        ("otlp", "ours (OTLP)"),
        ("all", "ours (every sink)"),
        ("all_export_process", "ours (every sink, export process)"),
    ):
        limit = _ADDED_TARGETS[variant]
        if variant in us and "sdk" in us:
            added = Ratio(
                [(o - b) / (s - b) for o, s, b in zip(per[variant], per["sdk"], base_rounds, strict=True)]
            )
            rows.append(
                (f"server: added CPU/request, {label} / the SDK's", added, f"<= {limit}", added <= limit)
            )
        else:
            why = skipped.get(variant) or skipped["sdk"]
            rows.append(
                (f"server: added CPU/request, {label} / the SDK's ({why})", None, f"<= {limit}", None)
            )
    readings = rounds * len(variants)
    rows.append(
        (
            "server CPU read from: the process's CPU clock (ns), in this many of the readings "
            "(the rest: /proc's 10 ms ticks)",
            f"{exact} of {readings}",
            "",
            None,
        )
    )
    for variant in variants:
        rows.append((f"server: us CPU/request, {names[variant]}", us[variant], "", None))
        if variant == "all_export_process":
            rows.append(
                (
                    f"export process: us CPU/request, {names[variant]}",
                    statistics.median(children[variant]),
                    "",
                    None,
                )
            )
    return {
        "quick": quick,
        "requests": requests,
        "connections": connections,
        "batch_interval": batch_interval,
        "rounds": rounds,
        "pinned": cores is not None,
        "nemo_lens": {"python": lens.python, "runtime": lens.runtime, "skipped": lens.skipped},
        "skipped": skipped,
        "ratio_spread": {v: ratio.figures() for v, ratio in paired.items()},
        "us_per_request": us,
        "paired_ratio_to_uninstrumented": paired,
        "rounds_us": per,
        "rounds_children_us": children,
        "rounds_ticks_us": ticks,
        "exact_readings": exact,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    parser.add_argument(
        "--nemo-lens-python",
        metavar="PATH",
        default=os.environ.get(nemo_lens_row.ENV),
        help=f"an interpreter (3.13+) with nemo-lens[sdk], fastapi and uvicorn, for the nemo-lens row "
        f"(default: ${nemo_lens_row.ENV}; skipped without)",
    )
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections of the load")
    parser.add_argument(
        "--batch-interval", type=float, default=None, help="our servers' bus batch_interval (default: Bus's)"
    )
    args = parser.parse_args(argv)
    with report.failure_in_one_line("server"):
        result = run(args.quick, args.nemo_lens_python, args.connections, args.batch_interval)
        rows = result.pop("rows")
        report.print_table("ckpt-events server under load: server CPU per request", rows)
        print(report.markdown_table(rows))
        report.write_json(args.json, result)
        return 0


if __name__ == "__main__":
    sys.exit(main())
