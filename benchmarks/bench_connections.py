"""Issue 29's connection attacks, before and after the connection guard, and what it costs.

A participant (``environment``) runs under uvicorn in a child process twice: with the settings
it had before (``h11``, ``limit_concurrency=512``, no header timeout) and with
``server_limits()`` (the ``connection_guard``). Each gets 520 idle TCP connections from
127.0.0.1 while ``/status`` is called every 0.25 s; we count the 200s and time how long the
idle connections stay open. The scrape endpoint gets 8 slowloris peers (a byte every second)
while it is scraped. Last, both participants answer ``/status`` from this process (on one
keep-alive connection, and on a new connection per call), in paired rounds: the guard's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ckpt_events.benchmarks import report
from ckpt_events.benchmarks.load import spawn
from ckpt_events.participants.ports import free_ports

DEFAULT_JSON = Path(__file__).parent / "results" / "connections.json"
TOKEN: Final = "bench-connections"
STATUS_PATH: Final = "/ng-control/v1/checkpoint/status"
IDLE: Final = 520
#: The uvicorn settings of every participant before the guard (``limits.SERVER_LIMITS``).
BEFORE: Final[dict[str, Any]] = {
    "http": "h11",
    "limit_concurrency": 512,
    "timeout_keep_alive": 5,
    "h11_max_incomplete_event_size": 64 * 1024,
}


def _settings(mode: str) -> dict[str, Any]:
    from ckpt_events.participants.server.limits import server_limits

    return dict(BEFORE) if mode == "before" else server_limits()


def _serve(mode: str, port: int, root: str) -> None:
    """The child: a participant under uvicorn with ``mode``'s settings, until killed."""
    import uvicorn

    from ckpt_events.participants import create_app

    app = create_app("environment", instance="environment-0", token=TOKEN, checkpoint_root=root)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="critical", access_log=False, **_settings(mode)
    )
    uvicorn.Server(config).run()


@contextlib.contextmanager
def _participant(mode: str) -> Iterator[int]:
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory() as root:
        argv = [sys.executable, "-m", "ckpt_events.benchmarks.bench_connections", "--serve", mode]
        child = spawn([*argv, "--port", str(port), "--root", root], stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while _get(f"http://127.0.0.1:{port}{STATUS_PATH}") != 200:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"the {mode} participant did not start")
                time.sleep(0.1)
            yield port
        finally:
            child.kill()
            child.wait(10)


def _get(url: str) -> int:
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return 0


def idle_flood(port: int, url: str, watch: float, hold: float) -> dict[str, Any]:
    """520 idle connections to ``port``: the codes of ``url`` every 0.25 s for ``watch`` seconds,
    and when the server closed the idle ones (watched for ``hold`` seconds)."""
    started = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE)]
    closed: list[float] = []

    def watch_closes() -> None:
        alive = list(idle)
        while alive and time.monotonic() - started < hold:
            readable, _, _ = select.select(alive, [], [], 0.1)
            for sock in readable:
                with contextlib.suppress(OSError):
                    if sock.recv(4096):
                        continue
                closed.append(time.monotonic() - started)
                alive.remove(sock)

    watcher = threading.Thread(target=watch_closes)
    watcher.start()
    codes = []
    while time.monotonic() - started < watch:
        codes.append(_get(url))
        time.sleep(0.25)
    watcher.join()
    for sock in idle:
        sock.close()
    return {
        "calls": len(codes),
        "ok": codes.count(200),
        "codes": sorted(set(codes)),
        "closed": len(closed),
        "all_closed_after_s": max(closed) if len(closed) == IDLE else None,
        "hold_s": hold,
    }


def slowloris(every: float, scrapes: int, span: float) -> dict[str, Any]:
    """8 connections trickling a head a byte every ``every`` s; ``scrapes`` scrapes over ``span`` s."""
    from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink

    endpoint = PrometheusEndpoint(PrometheusSink(), "127.0.0.1", 0)
    slow = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(8)]
    stop = threading.Event()

    def drip() -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 100
        for i in range(len(head)):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(head[i : i + 1])
            if stop.wait(every):
                return

    dripper = threading.Thread(target=drip)
    dripper.start()
    codes = []
    started = time.monotonic()
    try:
        for n in range(scrapes):
            codes.append(_get(endpoint.url))
            time.sleep(max(0.0, started + (n + 1) * span / scrapes - time.monotonic()))
    finally:
        stop.set()
        dripper.join()
        for sock in slow:
            sock.close()
        endpoint.close()
    return {"scrapes": len(codes), "ok": codes.count(200), "timed_out": endpoint.timed_out}


def _cost(port: int, requests: int) -> tuple[float, float]:
    """µs per ``/status`` on one keep-alive connection, and with a new connection per request."""
    head = f"GET {STATUS_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        for _ in range(requests):
            sock.sendall(f"{head}\r\n".encode())
            reply = b""
            while not reply.endswith(b"}"):
                reply += sock.recv(65536)
        kept = (time.perf_counter() - started) / requests
    fresh_requests = max(1, requests // 4)
    started = time.perf_counter()
    for _ in range(fresh_requests):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(f"{head}Connection: close\r\n\r\n".encode())
            while sock.recv(65536):
                pass
    fresh = (time.perf_counter() - started) / fresh_requests
    return kept * 1e6, fresh * 1e6


def run(quick: bool = False) -> dict[str, Any]:
    """Both attacks on both settings, and the paired cost rounds; the figures and table rows."""
    watch, hold = (6.0, 8.0) if quick else (20.0, 30.0)
    floods = {}
    for mode in ("before", "guarded"):
        with _participant(mode) as port:
            floods[mode] = idle_flood(port, f"http://127.0.0.1:{port}{STATUS_PATH}", watch, hold)
    loris = slowloris(*((1.0, 12, 6.0) if quick else (3.0, 30, 30.0)))
    rounds, requests = (3, 1_000) if quick else (9, 4_000)
    cost: dict[str, list[tuple[float, float]]] = {"before": [], "guarded": []}
    with _participant("before") as before_port, _participant("guarded") as guarded_port:
        ports = {"before": before_port, "guarded": guarded_port}
        for _ in range(rounds):
            for mode in ("before", "guarded"):
                cost[mode].append(_cost(ports[mode], requests))
    kept = report.paired_ratio([c[0] for c in cost["guarded"]], [c[0] for c in cost["before"]])
    fresh = report.paired_ratio([c[1] for c in cost["guarded"]], [c[1] for c in cost["before"]])
    before, after = floods["before"], floods["guarded"]
    rows = [
        (
            f"/status 200s under {IDLE} idle connections, before",
            f"{before['ok']}/{before['calls']}",
            "",
            None,
        ),
        (
            f"/status 200s under {IDLE} idle connections, guarded",
            f"{after['ok']}/{after['calls']}",
            ">= all but the first",
            after["ok"] >= after["calls"] - 1,
        ),
        (f"idle connections still open after {hold:.0f} s, before", IDLE - before["closed"], "", None),
        (
            f"seconds until all {IDLE} idle connections are closed, guarded",
            after["all_closed_after_s"],
            "<= 6 (5 s header timeout)",
            after["all_closed_after_s"] is not None and after["all_closed_after_s"] <= 6,
        ),
        (
            "scrapes answered 200 under 8 slowloris peers (before: 0 of 30)",
            f"{loris['ok']}/{loris['scrapes']}",
            "all",
            loris["ok"] == loris["scrapes"],
        ),
        ("guard cost: /status on a keep-alive connection, guarded / before", kept, "<= 1.10", kept <= 1.10),
        (
            "guard cost: /status on a new connection each, guarded / before",
            fresh,
            "<= 1.10",
            fresh <= 1.10,
        ),
        (
            "us per /status on a keep-alive connection, guarded (best round)",
            min(c[0] for c in cost["guarded"]),
            "",
            None,
        ),
    ]
    return {
        "quick": quick,
        "idle_flood": floods,
        "slowloris": loris,
        "cost_us": cost,
        "ratio_keep_alive": kept,
        "ratio_new_connection": fresh,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="shorter attacks, fewer rounds")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the results"
    )
    parser.add_argument("--serve", choices=("before", "guarded"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    with report.failure_in_one_line("connections"):
        if args.serve is not None:
            _serve(args.serve, args.port, args.root)
            return 0
        result = run(quick=args.quick)
        rows = result.pop("rows")
        report.publish(
            "ckpt-events: connections that cannot starve a participant or a scrape", rows, args.json, result
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
