"""Your own app under load: server CPU per request with telemetry off and with the sinks you name.

``ckpt-events bench --app MODULE:ATTR --request 'METHOD /path'`` runs this. The app (built with
``instrument()``) is served by uvicorn, one process on 127.0.0.1 per run
(``ckpt_events.benchmarks.app_server``), in two variants:

* **off**: ``CKPT_EVENTS_DISABLED=true``: ``instrument()``'s ``configure()`` subscribes nothing,
  whatever the app's own arguments (a ``jsonl_path=`` too), so every site is on the no-op path;
* **on**: the named sinks from the environment, as a deployment turns them on: ``jsonl``
  (``CKPT_EVENTS_JSONL``, a file in the run's temporary directory), ``otlp`` (spans and metrics
  over OTLP/HTTP to a ``rotel`` collector started here) and ``prometheus`` (the ``/metrics``
  endpoint on a free port, not scraped). What the app's code turns on itself stays on, and the
  table names every sink the server really had. With ``export_process`` (``--export-process``)
  the "on" server runs them in ``configure()``'s export process, whose CPU (the server's
  children's) gets rows of its own, alone and added to the server's.

Servers run in a temporary directory (files the app writes by relative path go there) with the
current directory first on the import path. The route is driven by ``wrk`` when installed (else
httpx). In each round both variants' servers are up side by side and, after a warm-up, the load
alternates between them in one-second slices, so a burst of other work on a shared machine falls
on both; each server's CPU is read from its ``/proc`` counters over the whole round (what it
did between its slices, exporting, included: its threads' run time to the nanosecond where the
kernel counts it, else its ticks, ``load.CpuReading``) and divided by the requests it answered. With two
or more cores the servers are pinned to one core and the driver (and the collector) to another.
Rounds rotate the variants' order; each on/off ratio is taken within a
round, printed as the median over rounds with its spread (``spread.Ratio``). A sink that cannot
run (no rotel) keeps a row saying why and how to get it; when none of them can, nothing is
measured (``BenchAppError``, before any server starts).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from . import report, rotel
from .app_choices import MAX_CONNECTIONS, SINKS
from .load import (
    Driver,
    DriverError,
    Load,
    Request,
    children_cpu_seconds,
    cores_apart,
    cpu_reading,
    drive,
    listening,
    settled_children_cpu_seconds,
    spawn,
    stop_process,
)
from .spread import Ratio

__all__ = ["MAX_CONNECTIONS", "SINKS", "AppBench", "BenchAppError", "parse_header", "parse_request", "run"]

#: Seconds a server has to start (import, startup, listening).
START_TIMEOUT: Final = 60.0
#: Seconds a started server has to stop after SIGTERM (its telemetry drains), then SIGKILL.
STOP_TIMEOUT: Final = 30.0
#: Seconds the first request has to be answered, its body read to the end.
PREFLIGHT_SECONDS: Final = 30.0
#: The load alternates between the variants' servers in slices this long (seconds): a burst of
#: other work on a shared machine then falls on both, not on one variant's whole run.
SLICE_SECONDS: Final = 1
#: Idle time before a round's CPU is read, so work left behind by its last slice is counted.
DRAIN_SECONDS: Final = 1.0
#: Fewer clock ticks of CPU than this in a server's round (``/proc`` counts in ticks, 10 ms
#: here) cannot be told from the clock's grain: a sleeping route's 1 or 2 ticks printed
#: "20,000.0 us per request" and ratios of 0.5 or 2; none at all would divide by zero.
MIN_CPU_TICKS: Final = 10
#: More failed requests than this share of a run make its figures those of errors: refused.
MAX_FAILED_SHARE: Final = 0.01
_OFF: Final = "off"
_ON: Final = "on"


#: The exit status of a server (``app_server``) whose ``--app`` cannot be served as asked (no such
#: module or attribute, not an app, not instrumented): its last stderr line says why.
#: Not 1 or 3, which uvicorn exits with (3: the app's startup failed; its exception is said, ``_raised``).
REFUSED: Final = 64


class BenchAppError(Exception):
    """The app cannot be measured as asked (it does not start, the route fails): the message says why."""


@dataclass(frozen=True)
class AppBench:
    """One ``bench --app`` run: the app, the request, the sinks, and how long and how hard."""

    app: str
    request: Request
    sinks: tuple[str, ...] = tuple(SINKS)
    rounds: int = 5
    seconds: int = 10
    warmup_seconds: int = 1
    connections: int = 32
    driver: Driver = "wrk"
    project: Path = field(default_factory=Path.cwd)
    export_process: bool = False


@dataclass
class _Run:
    """One server's measured run (``children_us_per_request``: its export process's CPU)."""

    us_per_request: float
    per_second: float
    load: Load
    state: dict[str, Any]
    children_us_per_request: float = 0.0


#: What a request line and headers may hold as given: a header name is an HTTP token; a path
#: and a header value printable ASCII (a path %-encoded). Anything else (a CR LF, a tab, an
#: "é") passed the checks and broke the first request in a traceback, the servers started.
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_PATH: Final = re.compile(r"/[!-~]*")
_VALUE: Final = re.compile(r"[ -~]*")
#: Headers that say where a request's body ends, which the drivers write from --body: a
#: "Transfer-Encoding: chunked" of one's own had the first request wait 30 s for chunks never
#: sent, then blamed the route ("hangs"); a "Content-Length: 3" cut the body short (a 500).
_FRAMING: Final = frozenset({"content-length", "transfer-encoding"})


def parse_request(text: str) -> tuple[str, str]:
    """``'METHOD /path'`` as (method, path); ``ValueError`` otherwise."""
    method, _, path = text.strip().partition(" ")
    path = path.strip()
    if not (method.isascii() and method.isalpha()) or _PATH.fullmatch(path) is None:
        raise ValueError(
            "--request takes 'METHOD /path' (e.g. 'POST /checkpoint/commit'; the path %-encoded), "
            f"not {text!r}"
        )
    return method.upper(), path


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` as (name, value); ``ValueError`` otherwise."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
        raise ValueError(f"--header takes 'Name: value' (printable ASCII), not {text!r}")
    if name.lower() in _FRAMING:
        raise ValueError(
            f"--header {name}: the bench frames each request itself (Content-Length of --body), "
            f"leave out --header {shlex.quote(text)}"
        )
    return name, value


def _child_env(extra: Mapping[str, str], project: Path) -> dict[str, str]:
    # The user's own OTEL_*/CKPT_EVENTS_* settings would blur what each variant turns on.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    # The project first (MODULE is the user's), then our own path; never the server's cwd.
    env["PYTHONPATH"] = os.pathsep.join([str(project), *sys.path])
    env["PYTHONSAFEPATH"] = "1"
    env.update(extra)
    return env


def _variant_env(
    variant: str, sinks: Sequence[str], collector: str | None, workdir: Path, export_process: bool = False
) -> dict[str, str]:
    if variant == _OFF:
        return {"CKPT_EVENTS_DISABLED": "true"}
    env: dict[str, str] = {"CKPT_EVENTS_EXPORT_PROCESS": "true"} if export_process else {}
    if "jsonl" in sinks:
        env["CKPT_EVENTS_JSONL"] = str(workdir / "events.jsonl")
    metrics = []
    if "otlp" in sinks and collector is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector
        env["OTEL_TRACES_EXPORTER"] = "otlp"
        metrics.append("otlp")
    if "prometheus" in sinks:
        env["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
        env["OTEL_EXPORTER_PROMETHEUS_PORT"] = "0"
        metrics.append("prometheus")
    if metrics:
        env["OTEL_METRICS_EXPORTER"] = ",".join(metrics)
    return env


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return state


def _preflight(port: int, request: Request) -> None:
    """One request before measuring: a route that fails, or redirects, would be measured as
    that; one that does not answer whole within ``PREFLIGHT_SECONDS`` cannot be measured."""
    deadline = time.monotonic() + PREFLIGHT_SECONDS
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PREFLIGHT_SECONDS)
    head = b""
    try:
        connection.request(
            request.method, request.path, body=request.body or None, headers=dict(request.headers)
        )
        answer = connection.getresponse()
        # Read to the end, bounded: a socket time-out bounds each read, not an endless stream.
        while chunk := answer.read1(65_536):
            head = head if len(head) >= 300 else head + chunk
            if time.monotonic() > deadline:
                raise BenchAppError(
                    f"{request} did not finish its answer within {PREFLIGHT_SECONDS:g} s (a response "
                    "streamed without end, or too slowly to measure): bench a route that answers whole"
                )
    except TimeoutError:
        raise BenchAppError(
            f"{request} did not answer within {PREFLIGHT_SECONDS:g} s (the route hangs, or is too slow "
            "to measure): bench a route that answers in well under a second"
        ) from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise BenchAppError(
            f"{request} got no valid answer ({exc!r}): check --request, --body and --header"
        ) from None
    finally:
        connection.close()
    said = " ".join(head[:300].decode(errors="replace").split())  # one line, whatever the body holds
    if 300 <= answer.status < 400:
        # wrk counts a 3xx as answered: the redirect, not the route, would be measured.
        # FastAPI's trailing-slash redirect names the whole URL: its path is what to bench.
        where = urllib.parse.urlsplit(answer.getheader("Location", ""))
        path = where.path + (f"?{where.query}" if where.query else "")
        raise BenchAppError(
            f"{request} answered {answer.status}, a redirect to {path or '(no Location)'}: bench the "
            f"route itself (--request '{request.method} {path or '/path'}')"
        )
    if answer.status >= 400:
        raise BenchAppError(
            f"{request} answered {answer.status}: {said} (check --request, --body and --header)"
        )


@dataclass
class _Server:
    """A started server: its process and port (its own choice, 0 until it has started);
    ``state`` is its last state file, read once stopped."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    state: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _server(bench: AppBench, variant: str, collector: str | None, core: int | None) -> Iterator[_Server]:
    """A started server of ``variant``; stopped on exit (gracefully: its telemetry drains)."""
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-app-") as tmp:
        workdir = Path(tmp)
        state_file, log = workdir / "state.json", workdir / "server.log"
        env = _child_env(
            _variant_env(variant, bench.sinks, collector, workdir, bench.export_process), bench.project
        )
        # Port 0: the server binds one of its own before its startup, and names it in its state.
        command = [sys.executable, "-m", f"{__package__}.app_server", bench.app, "0", str(state_file)]
        with log.open("wb") as err:
            # stdout too: an app that prints (a print() in a handler) filled the bench's own
            # stdout, the table's, with a line per request; in the log it shows if it fails.
            proc = spawn(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        server = _Server(proc, 0, log)
        started = False
        try:
            if core is not None:
                os.sched_setaffinity(proc.pid, {core})
            deadline = time.monotonic() + START_TIMEOUT
            # The state file is written by the app's startup, which uvicorn runs before it
            # listens: the port is waited for too (a request in between was refused).
            while (state := _read_state(state_file)) is None or not listening(
                proc, state["port"], deadline - time.monotonic()
            ):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise _not_started(bench, variant, server, _read_state(state_file) is not None)
                time.sleep(0.05)
            server.port = state["port"]
            started = True
            _preflight(server.port, bench.request)
            yield server
        finally:
            # One whose startup never ended ignores SIGTERM (uvicorn waits for the startup): it
            # was given 30 s before its SIGKILL.
            stop_process(proc, timeout=STOP_TIMEOUT if started else 2)
            server.state = _read_state(state_file) or {}
            if started and proc.returncode == -signal.SIGKILL:
                # Its shutdown hung (code after the lifespan's yield): each server waited out
                # the deadline in turn, minutes in all, and nothing said why.
                print(
                    f"bench: the {variant} server did not stop within {STOP_TIMEOUT:g} s of SIGTERM "
                    "and was killed: the app's shutdown (its lifespan after yield) hangs, and its "
                    "telemetry did not drain",
                    file=sys.stderr,
                )


def _not_started(bench: AppBench, variant: str, server: _Server, startup_ran: bool) -> BenchAppError:
    """Why ``server`` did not start, from how it ended and its log's last lines."""
    tail = server.log.read_text(errors="replace").strip().splitlines()[-12:]
    code = server.proc.poll()
    if code == REFUSED and tail:
        return BenchAppError(tail[-1])  # why, in one line (no such module, not an app, ...)
    if code is not None and (raised := _raised(server.log, bench.project)):
        # A traceback's last 12 lines, cut mid-frame, ended in uvicorn's "Application startup
        # failed. Exiting.": the cause, and where in the user's code, is one line.
        when = "its startup (lifespan) raised" if code == 3 else f"it exited ({code}), raising"
        return BenchAppError(
            f"the {variant} server of {bench.app} did not start: {when} {raised}: fix that, or run "
            f"uvicorn {bench.app} from here to see its whole traceback"
        )
    if code is not None:
        how = f"did not start: it exited ({code}) before it listened"
    elif startup_ran:
        how = f"did not start within {START_TIMEOUT:g} s: it did not listen on 127.0.0.1:{server.port}"
    else:
        how = f"did not start within {START_TIMEOUT:g} s: its startup (lifespan) did not finish"
    said = ":\n" + "\n".join(tail) if tail else ", printing nothing"
    return BenchAppError(f"the {variant} server of {bench.app} {how}{said}")


#: A traceback's frame line, as Python prints it.
_FRAME: Final = re.compile(r'  File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _raised(log: Path, project: Path) -> str:
    """The last traceback in ``log`` as ``"Type: message (file, line N)"``, the frame the deepest
    one in ``project`` (else the deepest of all); ``""`` when the log holds none."""
    lines = log.read_text(errors="replace").splitlines()
    # uvicorn logs a startup's as "ERROR:    Traceback (most recent call last):".
    starts = [i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):")]
    if not starts:
        return ""
    frames: list[tuple[str, str]] = []
    for line in lines[starts[-1] + 1 :]:
        if frame := _FRAME.match(line):
            frames.append((frame["file"], frame["line"]))
        elif line and not line[0].isspace():
            ours = [f for f in frames if Path(f[0]).resolve().is_relative_to(project.resolve())]
            where = (ours or frames or [("", "")])[-1]
            at = f" ({Path(where[0]).name}, line {where[1]})" if where[0] else ""
            return " ".join(line.split())[:300] + at
    return ""


def _drive(bench: AppBench, variant: str, server: _Server, seconds: int) -> Load:
    """``seconds`` of load on ``server``; a server that exits under it, or a driver that fails,
    is a ``BenchAppError`` (a traceback from wrk, or "failed 1760 of 0 times", before)."""
    url = f"http://127.0.0.1:{server.port}"
    try:
        load = drive(bench.driver, url, bench.request, seconds, bench.connections)
    except DriverError as exc:
        failed: DriverError | None = exc
    else:
        failed = None
    if (code := server.proc.poll()) is not None:
        tail = server.log.read_text(errors="replace").strip().splitlines()[-12:]
        said = ":\n" + "\n".join(tail) if tail else ", printing nothing"
        raise BenchAppError(
            f"the {variant} server of {bench.app} exited ({code}) under load of {bench.request}{said}"
        )
    if failed is not None:
        raise BenchAppError(f"{bench.request} could not be driven ({variant}): {failed}")
    return load


def _round(bench: AppBench, order: Sequence[str], collector: str | None, core: int | None) -> dict[str, _Run]:
    """One round: every variant's server up at once, the load alternating between them in
    one-second slices, each server's CPU over the whole round divided by the requests it answered."""
    with contextlib.ExitStack() as stack:
        servers = {v: stack.enter_context(_server(bench, v, collector, core)) for v in order}
        for variant in order:
            _drive(bench, variant, servers[variant], bench.warmup_seconds)
        before = {v: cpu_reading(server.proc.pid) for v, server in servers.items()}
        children_before = {v: children_cpu_seconds(server.proc.pid) for v, server in servers.items()}
        loads: dict[str, list[Load]] = {v: [] for v in order}
        for _ in range(bench.seconds // SLICE_SECONDS):
            for variant in order:
                load = _drive(bench, variant, servers[variant], SLICE_SECONDS)
                loads[variant].append(load)
        time.sleep(DRAIN_SECONDS)  # what a slice left to do (a batch being exported) is counted too
        after = {v: cpu_reading(server.proc.pid) for v, server in servers.items()}
        children_after = {v: settled_children_cpu_seconds(server.proc.pid) for v, server in servers.items()}
    runs = {}
    for variant in order:
        slices = loads[variant]
        load = Load(
            sum(x.requests for x in slices), sum(x.failed for x in slices), sum(x.seconds for x in slices)
        )
        if load.requests == 0 and load.failed == 0:
            # No answer within a slice, and no error either: not a failing route (it said "failed 0
            # of 0 times", blaming errors), but a slow one, or more connections than the server
            # answers within a slice (wrk -c1000 on the quickstart's 0.5 ms route), which it blamed
            # on the route alone.
            n = bench.connections
            raise BenchAppError(
                f"{bench.request} answered no request within a {SLICE_SECONDS} s load slice over "
                f"{n} connection{'s' if n > 1 else ''} ({variant}): each request takes longer than that, "
                f"or {n} connections queue past it; bench a route under {SLICE_SECONDS / 10:g} s a request, "
                "or use fewer --connections"
            )
        if load.requests == 0 or load.failed > MAX_FAILED_SHARE * load.requests:
            raise BenchAppError(
                f"{bench.request} failed {load.failed} of {load.requests} times under load ({variant}): "
                "the figures would be those of errors"
            )
        _enough_cpu(variant, after[variant].ticks - before[variant].ticks, load)
        seconds, _ = after[variant].since(before[variant])  # exact where the kernel counts it
        us = seconds / load.requests * 1e6
        children = (children_after[variant] - children_before[variant]) / load.requests * 1e6
        runs[variant] = _Run(us, load.per_second, load, servers[variant].state, children)
    return runs


def _enough_cpu(variant: str, seconds: float, load: Load) -> None:
    """Refuse a round whose CPU ``/proc`` could not resolve: it counts in clock ticks (10 ms)."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    ticks = round(seconds / tick)
    if ticks < MIN_CPU_TICKS:
        raise BenchAppError(
            f"too little CPU to measure per request: the {variant} server used {seconds:.2f} s over a "
            f"round ({ticks} clock tick{'' if ticks == 1 else 's'} of {tick * 1e3:g} ms, "
            f"{load.requests:,} requests; at least "
            f"{MIN_CPU_TICKS} ticks are needed): use a longer --duration, or more --connections"
        )


def _skipped(bench: AppBench, collector: str | None) -> dict[str, str]:
    if "otlp" in bench.sinks and collector is None:
        return {"otlp": rotel.why_missing()}
    return {}


def _spread(values: Sequence[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{statistics.median(values):,.1f} {unit} ({low:,.1f}-{high:,.1f})"


def run(bench: AppBench) -> dict[str, Any]:
    """Every round, order rotated; the figures, and the table's ``rows``."""
    # The driver and the collector on one core (children inherit it), the servers on the other.
    with cores_apart() as cores, contextlib.ExitStack() as stack:
        collector = stack.enter_context(rotel.collector()) if "otlp" in bench.sinks else None
        skipped = _skipped(bench, collector)
        sinks_on = [s for s in bench.sinks if s not in skipped]
        if not sinks_on:
            # Measuring "off" alone, every round, answered nothing that was asked.
            why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
            raise BenchAppError(
                f"none of --sinks {','.join(bench.sinks)} can run, so there is no 'on' to measure: {why}"
            )
        variants = [_OFF, _ON]
        runs: dict[str, list[_Run]] = {v: [] for v in variants}
        for r in range(bench.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            print(f"  round {r + 1}/{bench.rounds}: {', '.join(order)}", file=sys.stderr)
            for variant, one in _round(bench, order, collector, cores[0] if cores else None).items():
                runs[variant].append(one)
    return _figures(bench, runs, skipped, sinks_on, cores is not None)


def _had(runs: Sequence[_Run]) -> list[str]:
    """What the server really had once started (its bus's subscriptions), over every round."""
    names: list[str] = []
    for one in runs:
        started = one.state.get("started", {})
        had = [sink["name"] for sink in started.get("sinks", ())]
        if started.get("prometheus_endpoint"):
            had.append("/metrics endpoint")
        if export := started.get("export_process"):
            inside = [*export["sinks"], *(["/metrics endpoint"] if export["prometheus_endpoint"] else [])]
            had = [
                f"export process ({', '.join(inside)})" if name == "export-process" else name for name in had
            ]
        names += [name for name in had if name not in names]
    return names


def _final(runs: Sequence[_Run], counter: str) -> int:
    """A bus counter summed over the sinks and rounds, once the servers had drained."""
    return sum(s.get(counter, 0) for one in runs for s in one.state.get("stopped", {}).get("sinks", ()))


def _idle(bench: AppBench, on: Sequence[_Run]) -> str:
    """Why the "on" servers had nothing to export (no event emitted in any round, each round's
    counters reported), or ``""``: unknown counters are not taken for none."""
    if not on or any("stopped" not in one.state for one in on) or _final(on, "emitted"):
        return ""
    requests = sum(one.load.requests for one in on)
    return (
        f"{bench.request} emitted no events in {requests:,} requests, so the sinks had nothing to do: "
        "bench a route whose handler runs operation(request, ...) (docs/fastapi.md)"
    )


def _figures(
    bench: AppBench, runs: dict[str, list[_Run]], skipped: dict[str, str], sinks_on: list[str], pinned: bool
) -> dict[str, Any]:
    rows: list[tuple[str, Any, str, bool | None]] = []
    off = runs[_OFF]
    if any(one.state.get("started", {}).get("enabled") for one in off):
        rows.append(
            (
                f"off is not off: the app subscribes {', '.join(_had(off))} itself (bus= or "
                "configure_sinks=); CKPT_EVENTS_DISABLED turns off what instrument() configures",
                None,
                "",
                None,
            )
        )
    labels = {_OFF: "off (CKPT_EVENTS_DISABLED=true)"}
    ratios: dict[str, Any] = {}
    if _ON in runs:
        on = runs[_ON]
        had = _had(on)
        labels[_ON] = f"on: {', '.join(had) or 'nothing subscribed'}"
        cpu = Ratio.paired([one.us_per_request for one in on], [one.us_per_request for one in off])
        rps = Ratio.paired([one.per_second for one in on], [one.per_second for one in off])
        if idle := _idle(bench, on):
            # A route that runs no operation() (instrument() alone emits nothing): the sinks sat
            # idle, and "on / off 1.032" was printed as the telemetry's cost, a ratio of nothing.
            rows.append((f"on / off (--sinks {','.join(sinks_on)}): not measured, {idle}", None, "", None))
            ratios = {"not_measured": idle}
        else:
            rows.append((f"server CPU per request, on / off (--sinks {','.join(sinks_on)})", cpu, "", None))
            rows.append((f"requests per second, on / off (--sinks {','.join(sinks_on)})", rps, "", None))
            ratios = {"cpu_per_request": cpu.figures(), "requests_per_second": rps.figures()}
        if bench.export_process and not idle:
            both = Ratio.paired(
                [one.us_per_request + one.children_us_per_request for one in on],
                [one.us_per_request for one in off],
            )
            rows.append(
                (
                    f"server + export process CPU per request, on / off (--sinks {','.join(sinks_on)})",
                    both,
                    "",
                    None,
                )
            )
            rows.append(
                (
                    "export process CPU per request, on",
                    _spread([one.children_us_per_request for one in on], "us"),
                    "",
                    None,
                )
            )
            ratios["cpu_per_request_with_export_process"] = both.figures()
        if not all(one.state.get("started", {}).get("enabled") for one in on):
            rows.append(
                ("on did not turn on in every round: nothing was subscribed at its startup", None, "", None)
            )
        if dropped := _final(on, "dropped") + _final(on, "abandoned"):
            rows.append(("on: events the sinks dropped (their buffers were full)", dropped, "0", False))
        if unreported := sum("stopped" not in one.state for one in on):
            # No counters is not none dropped (the app's shutdown raised, or the server was killed).
            rows.append(
                (
                    "on: events the sinks dropped: unknown, the server's shutdown did not report in "
                    f"{unreported} of {len(on)} rounds",
                    None,
                    "",
                    None,
                )
            )
    for variant, measured in runs.items():
        # Under MAX_FAILED_SHARE they are measured, and said: the table read as a clean run.
        if failed := sum(one.load.failed for one in measured):
            answered = sum(one.load.requests for one in measured)
            share = f"up to {MAX_FAILED_SHARE:.0%} are measured"
            rows.append(
                (
                    f"requests that failed under load, {variant} ({share})",
                    f"{failed:,} of {answered:,}",
                    "0",
                    False,
                )
            )
    for name, why in skipped.items():
        rows.append((f"{name}: {SINKS[name]} ({why})", None, "", None))
    for variant, label in labels.items():
        rows.append(
            (
                f"server CPU per request, {label}",
                _spread([one.us_per_request for one in runs[variant]], "us"),
                "",
                None,
            )
        )
    for variant, label in labels.items():
        rows.append(
            (
                f"requests per second, {label}",
                _spread([one.per_second for one in runs[variant]], "/s"),
                "",
                None,
            )
        )
    return {
        "app": bench.app,
        "request": str(bench.request),
        "sinks_asked": list(bench.sinks),
        "sinks_on": sinks_on,
        "export_process": bench.export_process,
        "skipped": skipped,
        "driver": bench.driver,
        "connections": bench.connections,
        "seconds": bench.seconds,
        "rounds": bench.rounds,
        "pinned": pinned,
        "ratio_on_off": ratios,
        "variants": {
            variant: {
                "label": labels[variant],
                "sinks": _had(runs[variant]),
                "us_per_request": [one.us_per_request for one in runs[variant]],
                "children_us_per_request": [one.children_us_per_request for one in runs[variant]],
                "requests_per_second": [one.per_second for one in runs[variant]],
                "requests": [one.load.requests for one in runs[variant]],
                "failed": [one.load.failed for one in runs[variant]],
                "sink_stats": [one.state.get("stopped", {}).get("sinks", []) for one in runs[variant]],
            }
            for variant in runs
        },
        "rows": rows,
    }


def title(bench: AppBench, figures: Mapping[str, Any]) -> str:
    """The table's title: what was measured, and how."""
    pinned = "server and driver pinned apart" if figures["pinned"] else "not pinned (one core)"
    return (
        f"ckpt-events bench --app {bench.app}: {bench.request}, {bench.driver} x{bench.connections} "
        f"connections, {bench.seconds} s x {bench.rounds} rounds (order rotated), {pinned}"
    )


def print_report(bench: AppBench, figures: dict[str, Any], json_path: Path) -> None:
    """Print the table and write the figures, and the table's cells, as JSON to ``json_path``."""
    rows = figures.pop("rows")
    report.print_table(title(bench, figures), rows)
    # The table as printed, beside the figures it came from.
    figures["table"] = [[what, report.cell(value), target, met] for what, value, target, met in rows]
    report.write_json(json_path, {"app": figures})
