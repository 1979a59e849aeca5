"""Watch benchmark: one ``ckpt-events watch`` refresh (a poll round of ``GET /status`` over every
participant, and rendering the view) against 4, 16 and 64 real participants.

The participants are real apps (environment participants) served by uvicorn on 127.0.0.1 in
one child process, as a fleet runs apart from the watching terminal; the client is watch's own
``poll_all`` through its ``status_client`` (a connection pool per participant) with its default
per-poll timeout, in this process. A refresh must fit in watch's one-second interval. (With the
servers in the watcher's own event loop, 64 took ~0.74 s a round here, most of it the servers'
work; with one pool shared by every participant, the watcher's CPU per round grew with the
square of the fleet.)

Run ``python -m ckpt_events.benchmarks.bench_watch [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from ckpt_events.participants.cli.fleet import local_fleet
from ckpt_events.participants.cli.watch.sources import poll_all, status_client
from ckpt_events.participants.cli.watch.view import FleetView

from . import report
from .load import spawn

DEFAULT_JSON = Path(__file__).parent / "results" / "watch.json"
TOKEN = "bench-" + secrets.token_hex(8)
SIZES = (4, 16, 64)
#: watch's refresh interval: a round must end within it.
TARGET_S = 1.0
TIMEOUT = 0.8


async def _serve(n: int) -> None:
    """The child: serve ``n`` participants, print their URLs as one JSON line, stop when stdin closes."""
    members = [("environment", f"environment-{i}") for i in range(n)]
    async with local_fleet(token=os.environ["CKPT_EVENTS_TOKEN"], members=members) as urls:
        print(json.dumps([urls[name] for _, name in members]), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


async def _measure_size(n: int, rounds: int) -> dict[str, Any]:
    child = spawn(
        [sys.executable, "-m", "ckpt_events.benchmarks.bench_watch", "--serve", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # PYTHONSAFEPATH: the child's path is ours, never its working directory's modules.
        env={**os.environ, "CKPT_EVENTS_TOKEN": TOKEN, "PYTHONSAFEPATH": "1"},
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = await anyio.to_thread.run_sync(child.stdout.readline)
        if not line:
            raise RuntimeError(f"the fleet of {n} participants did not start (exit {child.wait()})")
        return await _rounds(json.loads(line), rounds)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)


async def _rounds(targets: list[str], rounds: int) -> dict[str, Any]:
    n = len(targets)
    view = FleetView(targets)
    polls: list[float] = []
    cpu: list[float] = []
    renders: list[float] = []
    errors = 0
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with status_client(targets, headers=headers, timeout=TIMEOUT) as client:
        await poll_all(client, targets, TIMEOUT)  # warm: connections opened once, as watch keeps them
        for _ in range(rounds):
            started, cpu_started = time.perf_counter(), time.process_time()
            results = await poll_all(client, targets, TIMEOUT)
            polled = time.perf_counter()
            cpu.append(time.process_time() - cpu_started)
            view.add_polls(results, time.time())
            Console(width=160, file=io.StringIO()).print(view.render())
            polls.append(polled - started)
            renders.append(time.perf_counter() - polled)
            errors += sum(r.error is not None for r in results)
    return {
        "participants": n,
        "rounds": rounds,
        "poll_median_s": statistics.median(polls),
        "poll_max_s": max(polls),
        "poll_cpu_median_s": statistics.median(cpu),
        "render_median_s": statistics.median(renders),
        "errors": errors,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Measure each size; returns the figures and the rows of the ratio table."""
    rounds = 5 if quick else 20
    sizes = {n: anyio.run(_measure_size, n, rounds) for n in SIZES}
    rows: list[Any] = []
    for n, figures in sizes.items():
        refresh = figures["poll_median_s"] + figures["render_median_s"]
        rows.append(
            (
                f"watch {n} participants: poll round ms, median / max of {rounds} (watcher's CPU ms)",
                f"{figures['poll_median_s'] * 1e3:.1f} / {figures['poll_max_s'] * 1e3:.1f} "
                f"({figures['poll_cpu_median_s'] * 1e3:.1f})",
                "",
                None,
            )
        )
        rows.append(
            (
                f"watch {n} participants: refresh (poll + render) s, median",
                refresh,
                f"<= {TARGET_S}",
                refresh <= TARGET_S and figures["errors"] == 0,
            )
        )
    return {"sizes": sizes, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="5 rounds per size")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child serving the fleet
    args = parser.parse_args(argv)
    with report.failure_in_one_line("watch"):
        if args.serve is not None:
            anyio.run(_serve, args.serve)
            return 0
        result = run(args.quick)
        rows = result.pop("rows")
        report.publish("ckpt-events watch: one refresh against N participants", rows, args.json, result)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
