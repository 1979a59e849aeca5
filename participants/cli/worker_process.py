"""A worker process of ``ckpt-events serve <kind> --workers N`` (started by the server itself).

``python -m ckpt_events.participants.cli.worker_process <kind> <instance> <index> <options-json>``: it
reads the coordinator's socket from ``CKPT_EVENTS_COORDINATOR_SOCKET`` and its fault from
``CKPT_EVENTS_FAULT`` (once, at start-up: ``FaultPlan.from_environ``), runs its own bus with
the sinks configured from the environment (JSON lines go to ``<path>.w<index>``: one file per
worker process) and serves its share of the episodes until the coordinator's socket ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ckpt_events.participants.cli.losses import SinkLosses
from ckpt_events.participants.cli.text import say

if TYPE_CHECKING:
    from ckpt_events import Bus
    from ckpt_events.participants.faults import FaultPlan
    from ckpt_events.participants.server.limits import log_sink_os_errors_in_one_line

    log_sink_os_errors_in_one_line()  # a full disk under its log: one line, as in serve

__all__ = ["WorkerCommand", "main", "port_taken", "worker_command", "worker_metrics_port"]


class WorkerCommand:
    """The ``command(index)`` a ``WorkerSupervisor`` runs; ``env`` carries the inference token
    (never on a command line)."""

    def __init__(self, kind: str, instance: str, options: Mapping[str, Any]) -> None:
        self.argv = [sys.executable, "-m", "ckpt_events.participants.cli.worker_process", kind, instance]
        self.options = json.dumps({k: v for k, v in options.items() if k != "inference_token"})
        token = options.get("inference_token")
        self.env = {"CKPT_EVENTS_INFERENCE_TOKEN": str(token)} if token else {}

    def __call__(self, index: int) -> list[str]:
        return [*self.argv, str(index), self.options]


def worker_command(kind: str, instance: str, options: Mapping[str, Any]) -> WorkerCommand:
    """The worker command of participant ``instance`` of ``kind`` with its workload ``options``."""
    return WorkerCommand(kind, instance, options)


async def _run(kind: str, instance: str, index: int, options: dict[str, Any]) -> None:
    from ckpt_events import Bus
    from ckpt_events.participants.faults import FaultPlan
    from ckpt_events.participants.server.limits import (
        log_shutdown_cuts_in_one_line,
        log_sink_os_errors_in_one_line,
    )

    log_sink_os_errors_in_one_line()  # a full disk under its log: one line, as in serve
    log_shutdown_cuts_in_one_line()  # its port's forced exit: said in its one line, as in serve

    # Read once, at start-up: the server passes its fault to its worker processes this way.
    faults = FaultPlan.from_environ()
    jsonl = os.environ.get("CKPT_EVENTS_JSONL")
    if jsonl:
        os.environ["CKPT_EVENTS_JSONL"] = f"{jsonl}.w{index}"
    moved = _prometheus_port_of_worker(index)
    losses = SinkLosses(f"worker {index}: ")
    try:
        async with Bus() as bus:
            losses.buses.append(bus)
            await _serve_work(bus, kind, instance, index, options, faults, moved)
    finally:
        losses.say()  # once its bus has closed: what its sinks lost, as serve says its own


async def _serve_work(
    bus: Bus,
    kind: str,
    instance: str,
    index: int,
    options: dict[str, Any],
    faults: FaultPlan,
    moved: str | None,
) -> None:
    """Configure the sinks on ``bus``, then serve the worker's work until it is stopped."""
    from ckpt_events import Telemetry, sinks
    from ckpt_events.participants.faults import hold_one_step
    from ckpt_events.participants.server.app import make_workload
    from ckpt_events.participants.server.workers import ENV_SOCKET, run_worker
    from ckpt_events.participants.server.workers.coordinator import ENV_SECRET
    from ckpt_events.participants.server.workers.worker_http import (
        ENV_WORKER_HEADER_TIMEOUT,
        ENV_WORKER_HOST,
        ENV_WORKER_TOKEN,
    )
    from ckpt_events.participants.workloads.registry import KINDS
    from ckpt_events.sinks.jsonl import emit_truncated_spans

    handle = sinks.configure(bus)
    try:
        if moved is not None and handle.prometheus is not None:
            say(
                f"ckpt-events serve: worker {index}: {moved}: its metrics are at "
                f"{handle.prometheus.url} instead",
            )
        elif handle.prometheus is not None and handle.settings.prometheus_port == 0:
            # Port 0 asked for (any free port): the port chosen is said nowhere else.
            say(
                f"ckpt-events serve: worker {index}: metrics at {handle.prometheus.url}",
            )
        if handle.jsonl_sink is not None and handle.jsonl_sink.path is not None:
            # A worker started again on its predecessor's log ends what that one left open.
            with contextlib.suppress(OSError):  # the log unreadable: nothing to close
                emit_truncated_spans(bus, handle.jsonl_sink.path)
        token = os.environ.get("CKPT_EVENTS_INFERENCE_TOKEN")
        header_timeout = os.environ.get(ENV_WORKER_HEADER_TIMEOUT)  # set by serve, a valid number
        if KINDS[kind].uses_inference and token:
            options = {**options, "inference_token": token}
        tel = Telemetry(bus, kind=kind, instance=instance, worker=index)
        workload = make_workload(kind, tel, **options)
        # The work runs here, not in the server's process: a stall held there held nothing.
        hold_one_step(workload, instance, faults)
        await run_worker(
            os.environ[ENV_SOCKET],
            index,
            workload,
            secret=os.environ.pop(ENV_SECRET, ""),
            token=os.environ.get(ENV_WORKER_TOKEN) or None,
            host=os.environ.get(ENV_WORKER_HOST) or None,
            header_timeout=float(header_timeout) if header_timeout else None,
            faults=faults,
        )
    finally:
        if handle is not None and hasattr(handle, "aclose"):
            await handle.aclose()


def _prometheus_port_of_worker(index: int) -> str | None:
    """Worker ``index`` serves its own scrape endpoint on the base port + 1 + ``index`` (the
    supervisor keeps the base port): one target per process, no merge across processes.

    If that port is taken (``serve`` checked it was free at start-up, but a worker started
    again later may find it taken), any free port instead: returns why, for the line that
    announces where the metrics went. A worker that died on its port was started again, died
    again, and spent the server's restart budget: 6 exits in 32 s, the main port never served.
    """
    exporters = os.environ.get("OTEL_METRICS_EXPORTER", "")
    if "prometheus" not in exporters.lower():
        return None
    raw = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "").strip() or "9464"
    if not raw.isdigit() or int(raw) == 0:  # 0 (any free port) stays 0; a bad value: configure says so
        return None
    port = worker_metrics_port(int(raw), index)
    from ckpt_events import ConfigurationError, sinks

    try:
        # As configure() binds it: [::1] was probed as a name, "taken", and the port given up.
        host = sinks.read_otel_env(os.environ).prometheus_host
    except ConfigurationError:
        return None  # a bad value: configure says so
    why = port_taken(host, port)
    os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] = "0" if why else str(port)
    return None if why is None else f"Prometheus port {port} on {host} is taken ({why})"


def worker_metrics_port(base: int, index: int) -> int:
    """Worker ``index``'s Prometheus port when the server's is ``base``."""
    return base + 1 + index


def port_taken(host: str, port: int) -> str | None:
    """Why a scrape endpoint could not listen on ``host:port`` now (bound as it binds: with
    ``SO_REUSEADDR``, so a port left in TIME_WAIT counts as free), or None if it could."""
    if not 0 < port <= 65535:
        return "past 65535" if port > 65535 else "not a port"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            probe.listen(1)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the worker; a worker that cannot start or serve (its log cannot be opened, the
    coordinator's socket is gone or refuses its ``hello``) says why in one line, exit 1: it was
    a traceback of 30 to 50 lines, repeated at each of the supervisor's restarts. An interrupted
    one (SIGINT) says so in one line, exit 130."""
    from ckpt_events import CkptEventsError

    kind, instance, index, options = (argv if argv is not None else sys.argv[1:])[:4]
    _wake_when_the_server_dies()
    # SIGTERM (the supervisor's stop, sent once the coordinator's socket has ended, which ends
    # the worker anyway) is recorded, not the signal's default: uvicorn, stopped by it, raises
    # it again on the way out of its port's server, and the worker died there, before its bus
    # closed and ``losses.say()`` ran (a worker's line of what its sinks lost was missing in 1 to
    # 4 runs of 6). Recorded, the worker ends as it does at the socket's end, the line said,
    # and exits 143, as a shell reports SIGTERM (the supervisor's SIGKILL bounds it as before).
    signal.signal(signal.SIGTERM, _record_sigterm)
    try:
        anyio.run(_run, kind, instance, int(index), json.loads(options))
    except KeyboardInterrupt as exc:
        # A SIGINT sent to the worker itself (pkill -INT, a signal to its group): uvicorn stops
        # its port gracefully, then raises the signal again; it was a traceback and exit -2.
        # Forced by a second one, its port's server raises ``Interrupted``, saying what was cut.
        from ckpt_events.participants.cli.text import escape
        from ckpt_events.participants.errors import Interrupted

        cut = exc.cut if isinstance(exc, Interrupted) else None
        said = "" if cut is None else f"; a second signal forced the exit: {escape(cut)}"
        say(f"ckpt-events serve: worker {index}: interrupted{said}")
        return 128 + exc.signum if isinstance(exc, Interrupted) else 130  # as a shell reports it
    except (CkptEventsError, OSError, BaseExceptionGroup) as exc:
        causes = _leaves(exc)
        if not all(isinstance(c, CkptEventsError | OSError) for c in causes):
            raise
        why = "; ".join(dict.fromkeys(_said(c) for c in causes))
        say(f"ckpt-events serve: worker {index}: {why}")
        return 1
    return 128 + _TERMINATED[0] if _TERMINATED else 0


#: The SIGTERM this worker was sent, if any (``_record_sigterm``).
_TERMINATED: list[int] = []


def _record_sigterm(signum: int, frame: object) -> None:
    _TERMINATED.append(signum)


def _wake_when_the_server_dies() -> None:
    """On Linux, have the kernel send this worker SIGCONT when the server that started it dies.

    A worker ends when the server's socket does; a stopped one (SIGSTOP, a debugger's) never
    reads that, and outlived a SIGKILLed server, stopped, for ever. Woken, it reads the end and
    exits as any worker does, its log flushed (SIGKILL would lose what the others had not
    written yet; to a running worker SIGCONT is nothing)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    with contextlib.suppress(OSError, AttributeError):  # no libc to ask: as on other systems
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGCONT))


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``'s groups (``exc`` itself if it is no group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _said(exc: BaseException) -> str:
    """``exc`` as one line: an ``OSError``'s own words and the file it names."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
