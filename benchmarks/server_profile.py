"""Where a loaded server's CPU per request goes, timed inside the server.

``python -m ckpt_events.benchmarks.server_profile [--requests N] [--slices S]`` starts the
``server`` suite's server (``server_app``: uvicorn, FastAPI, ``POST /work``) once per variant,
pinned and loaded as that suite does (every server up at once, 32 keep-alive connections, the
variants' slices alternating), with clocks inside it: each step of the ASGI app's coroutine
(FastAPI, the route and the handler, each step run until it awaits), the handler's parts (the
unit of work, and each call the telemetry makes, timed between them) and each step of every
sink's delivery task. What is left of the server's CPU (``/proc``) is uvicorn's protocol and the
event loop. Each figure is microseconds per request over the whole run.

A tight loop says what our code costs with warm caches (``server_parts``, ``bench core``); this
says what the same calls cost between the requests of a real server, whose own work has evicted
our code and data by the next request, and how much the rest of the server's work grows beside
them. The clocks add ~0.1 us a read (nine per request in the handler): the ``no_sink`` column,
whose telemetry calls return no-op handles, shows that floor. ``all`` has OTLP export threads in
the server: their time slices fall inside whatever step they interrupt. ``all`` and
``all_export_process`` need the ``rotel`` collector and say so without it.

``python -m ckpt_events.benchmarks.server_profile --serve VARIANT PORT [COLLECTOR]`` is one
such server (``GET /_profile`` answers its figures, ``POST /_profile/reset`` zeroes them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import urllib.request
from collections.abc import Callable, Coroutine, Generator
from time import perf_counter_ns
from typing import Any, Final, TypeVar

from ckpt_events import Bus, Subscription, Telemetry

from . import bench_server, report, rotel
from .load import cores_apart, cpu_seconds
from .server_app import _unit_of_work, make_app

__all__ = ["PARTS", "SECTIONS", "VARIANTS", "run"]

VARIANTS: Final = ("uninstrumented", "no_sink", "null", "all", "all_export_process")
#: The handler's telemetry calls, timed between one another (the unit of work is timed apart).
SECTIONS: Final = (
    "tel.operation()",
    "operation: enter (with)",
    "op.step()",
    "step: enter",
    "step: set(), exit",
    "a second step (step(), enter, set(), exit) and op.set()",
    "operation: exit",
)
#: The rows of the table, top-down: each part of the server's CPU per request.
PARTS: Final = (
    "server CPU (/proc)",
    "app: FastAPI, the route, the handler",
    "handler: the unit of work",
    "handler: telemetry calls, in all",
    *(f"call: {name}" for name in SECTIONS),
    "sinks' delivery tasks",
    "uvicorn and the event loop (the rest)",
)
_CONNECTIONS: Final = 32
T = TypeVar("T")


class _Times:
    """What one profiled server adds up, in nanoseconds."""

    def __init__(self) -> None:
        self.sections = [0] * len(SECTIONS)
        self.reset()

    def reset(self) -> None:
        """Zero every figure (the sections' list in place: the handler holds it)."""
        self.requests = 0
        self.app = 0
        self.work = 0
        self.delivery = 0
        self.sections[:] = [0] * len(SECTIONS)

    def add_app(self, ns: int) -> None:
        self.app += ns

    def add_delivery(self, ns: int) -> None:
        self.delivery += ns

    def figures(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "app_ns": self.app,
            "work_ns": self.work,
            "delivery_ns": self.delivery,
            "sections_ns": list(self.sections),
        }


_TIMES = _Times()


class _Steps(Generator[Any, Any, T]):
    """Awaits ``coro``, adding the time of each of its steps (a run until it awaits) to ``add``."""

    def __init__(self, coro: Coroutine[Any, Any, T], add: Callable[[int], None]) -> None:
        self._coro = coro
        self._add = add

    def __await__(self) -> Generator[Any, Any, T]:
        return self

    def send(self, value: Any) -> Any:
        started = perf_counter_ns()
        try:
            return self._coro.send(value)
        finally:
            self._add(perf_counter_ns() - started)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        started = perf_counter_ns()
        try:
            return self._coro.throw(typ, val, tb) if val is not None else self._coro.throw(typ)
        finally:
            self._add(perf_counter_ns() - started)

    def close(self) -> None:
        self._coro.close()


class _TimedBus(Bus):
    """A ``Bus`` whose sinks' delivery tasks are timed step by step."""

    def _start(self, sub: Subscription) -> None:
        assert self._tg is not None
        sub._started = True
        self._tg.start_soon(_timed_delivery, sub, name=f"ckpt_events sink {sub.name}")


async def _timed_delivery(sub: Subscription) -> None:
    await _Steps(sub._run(), _TIMES.add_delivery)


def _bare(body: bytes) -> int:
    started = perf_counter_ns()
    size = _unit_of_work(body)
    _TIMES.work += perf_counter_ns() - started
    _TIMES.requests += 1
    return size


def _sectioned(tel: Telemetry) -> Callable[[bytes], int]:
    """``server_app._ours``, the same calls in the same order, with a clock read between them."""
    sections = _TIMES.sections

    def handle(body: bytes) -> int:
        t0 = perf_counter_ns()
        op = tel.operation("commit", checkpoint_id="c1")
        t1 = perf_counter_ns()
        op.__enter__()
        t2 = perf_counter_ns()
        step = op.step("export")
        t3 = perf_counter_ns()
        step.__enter__()
        t4 = perf_counter_ns()
        size = _unit_of_work(body)
        t5 = perf_counter_ns()
        step.set(records=1)
        step.__exit__(None, None, None)
        t6 = perf_counter_ns()
        with op.step("write") as second:
            second.set(records=1, bytes=size)
        op.set(records=1, bytes=size)
        t7 = perf_counter_ns()
        op.__exit__(None, None, None)
        t8 = perf_counter_ns()
        sections[0] += t1 - t0
        sections[1] += t2 - t1
        sections[2] += t3 - t2
        sections[3] += t4 - t3
        sections[4] += t6 - t5
        sections[5] += t7 - t6
        sections[6] += t8 - t7
        _TIMES.work += t5 - t4
        _TIMES.requests += 1
        return size

    return handle


def _serve(argv: list[str]) -> int:
    import uvicorn
    from fastapi import Response

    variant, port = argv[0], int(argv[1])
    collector = argv[2] if len(argv) > 2 and argv[2] else None
    app = make_app(variant, collector, bus_class=_TimedBus, instrument=_sectioned, bare=_bare)

    @app.get("/_profile")
    async def profile() -> Response:
        return Response(json.dumps(_TIMES.figures()), media_type="application/json")

    @app.post("/_profile/reset")
    async def reset() -> Response:
        _TIMES.reset()
        return Response("ok")

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/work":
            await _Steps(app(scope, receive, send), _TIMES.add_app)
        else:
            await app(scope, receive, send)

    quiet: dict[str, Any] = {"log_level": "warning", "access_log": False}
    uvicorn.run(timed, host="127.0.0.1", port=port, lifespan="on", loop="asyncio", **quiet)
    return 0


def _call(port: int, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read()) if method == "GET" else None


def _parts(cpu_us: float, figures: dict[str, Any]) -> list[float]:
    n = max(figures["requests"], 1)
    app, work, delivery = (
        figures["app_ns"] / n / 1e3,
        figures["work_ns"] / n / 1e3,
        figures["delivery_ns"] / n / 1e3,
    )
    sections = [ns / n / 1e3 for ns in figures["sections_ns"]]
    return [cpu_us, app, work, sum(sections), *sections, delivery, cpu_us - app - delivery]


def run(requests: int = 6_000, slices: int = 10, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """Every variant's server up at once, ``requests`` each in ``slices`` alternating slices;
    returns the figures per variant (``parts``: microseconds per request, in ``PARTS`` order)
    and why a variant could not run (``skipped``)."""
    with cores_apart() as cores, rotel.collector() as collector, contextlib.ExitStack() as stack:
        skipped = {v: why for v, why in bench_server._skipped(collector).items() if v in variants}
        chosen = [v for v in variants if v not in skipped]
        servers: dict[str, tuple[Any, int]] = {}
        for variant in chosen:
            port = rotel.free_port()
            core = cores[0] if cores else None
            proc = bench_server._start(variant, port, collector, core, module=("server_profile", "--serve"))
            stack.callback(bench_server._stop, proc)
            servers[variant] = (proc, port)
        for proc, port in servers.values():
            asyncio.run(bench_server._load(port, max(requests // 5, _CONNECTIONS), _CONNECTIONS, 60))
            if cores is not None:
                bench_server._pin_children(proc.pid, cores[1])
            _call(port, "/_profile/reset", "POST")
        before = {v: cpu_seconds(proc.pid) for v, (proc, _) in servers.items()}
        done = dict.fromkeys(chosen, 0)
        for _ in range(slices):
            for variant in chosen:
                port = servers[variant][1]
                done[variant] += asyncio.run(bench_server._load(port, requests // slices, _CONNECTIONS, 120))
        after = {v: cpu_seconds(proc.pid) for v, (proc, _) in servers.items()}
        figures = {v: _call(port, "/_profile") for v, (_, port) in servers.items()}
    parts = {v: _parts((after[v] - before[v]) / max(done[v], 1) * 1e6, figures[v]) for v in chosen}
    return {
        "requests": requests,
        "slices": slices,
        "pinned": cores is not None,
        "answered": done,
        "parts": parts,
        "skipped": skipped,
        "figures": figures,
    }


def _table(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    parts: dict[str, list[float]] = result["parts"]
    header = ["us per request", *parts]
    rows = []
    for i, name in enumerate(PARTS):
        cells = []
        for variant, values in parts.items():
            instrumented_only = 4 <= i < 4 + len(SECTIONS) or i == 3
            blank = variant == "uninstrumented" and instrumented_only
            cells.append("" if blank else f"{values[i]:.1f}")
        rows.append([name, *cells])
    return header, rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return _serve(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--requests", type=int, default=6_000, help="requests per variant")
    parser.add_argument("--slices", type=int, default=10, help="slices the requests go in, alternating")
    parser.add_argument("--json", type=report.output_path, default=None, help="where to write the figures")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.requests, args.slices)
    header, rows = _table(result)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="where a loaded server's CPU per request goes", title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*map(Text, row))
    Console().print(table)
    for variant, why in result["skipped"].items():
        print(f"{variant}: {why}")
    print(report.matrix_markdown(header, rows))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json is not None:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
