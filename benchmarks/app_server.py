"""The server process of ``ckpt-events bench --app``: the user's app, in uvicorn, reporting its sinks.

``python -m ckpt_events.benchmarks.app_server MODULE:ATTR PORT STATE_FILE`` imports the app
(``MODULE`` from the import path the bench gives it), checks that ``instrument()`` was called on
it, and serves it on 127.0.0.1:PORT with uvicorn (one process, no access log); PORT 0 is a free
port of its choosing, bound before the app's startup and named in STATE_FILE (``port``). Which sinks are
on is the environment's doing (``CKPT_EVENTS_DISABLED``, ``CKPT_EVENTS_JSONL``, ``OTEL_*``),
exactly as for the user's own deployment. Once the app's startup has run (``started``), and
again once its shutdown has drained the telemetry (``stopped``), it writes ``STATE_FILE`` (JSON):
for each phase, whether the telemetry is on (``Telemetry.enabled``), the bus's counters per sink
(``Bus.stats()``) and whether a Prometheus endpoint is served.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import msgspec
import uvicorn
from starlette.applications import Starlette

from ckpt_events import ConfigurationError, Telemetry
from ckpt_events.participants.fastapi import STATE_ATTRIBUTE, telemetry

from .bench_app import REFUSED

__all__ = ["GRACEFUL_SECONDS", "AppRefused", "load_app", "main"]

#: Seconds uvicorn waits, once told to stop, for the requests still running, then cancels them.
GRACEFUL_SECONDS: Final = 5


class AppRefused(ValueError):
    """``--app`` names no app that can be served: the message says why, in one line."""


def load_app(spec: str) -> Starlette:
    """The app named ``MODULE:ATTR`` (``ATTR`` may be dotted); ``AppRefused`` saying what is wrong.

    Whatever the module raises while imported (one of its own imports missing, a ``ValueError``
    of its own, a second ``instrument()``) propagates as it is: the bench says its exception and
    the line of the user's code it came from."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppRefused(f"--app takes MODULE:ATTR (as uvicorn does), not {spec!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise
        raise AppRefused(
            f"--app {spec}: no module named {exc.name!r} on the import path (run ckpt-events bench "
            "from the directory that holds it)"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AppRefused(f"--app {spec}: {module_name} has no attribute {attribute!r}") from None
    if not isinstance(found, Starlette):
        # What to name instead: a factory's app (uvicorn --factory has no counterpart here), or
        # the app inside an ASGI middleware wrapping it.
        fix = (
            f"call it at import (app = {attribute}() in a module) and give --app MODULE:app"
            if inspect.isfunction(found)
            else "name the app instrument() was called on"
        )
        raise AppRefused(f"--app {spec} is a {type(found).__name__}, not a FastAPI (or Starlette) app: {fix}")
    return found


def _phase(tel: Telemetry, configured: Any) -> dict[str, Any]:
    export = getattr(configured, "export_process", None)
    return {
        "enabled": tel.enabled,
        "sinks": msgspec.to_builtins(tel.bus.stats().sinks),
        # Served beside the metric sink's aggregation, not a subscription of its own.
        "prometheus_endpoint": getattr(configured, "prometheus", None) is not None,
        # configure(export_process=True): the sinks subscribed in the child, and its endpoint.
        "export_process": None
        if export is None
        else {"sinks": list(export.sinks), "prometheus_endpoint": export.prometheus_url is not None},
    }


def _reporting(app: Starlette, state_file: Path, state: dict[str, Any]) -> None:
    tel = telemetry(app)  # ConfigurationError unless instrument() was called on it
    instrumented = getattr(app.state, STATE_ATTRIBUTE)
    theirs = app.router.lifespan_context

    def write(phase: str, configured: Any) -> None:
        state[phase] = _phase(tel, configured)
        partial = state_file.with_suffix(".partial")
        partial.write_text(json.dumps(state))
        partial.replace(state_file)  # whole or absent, never half-written, for the bench polling it

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        # Outside instrument()'s lifespan: its sinks are up here, and drained once it exits.
        async with theirs(app) as app_state:
            configured = instrumented.configured
            write("started", configured)
            yield app_state
        write("stopped", configured)

    app.router.lifespan_context = lifespan


def _refused(why: str) -> int:
    """Say ``why`` as the log's last line (the bench reads it), and exit ``REFUSED``."""
    # What the app printed while imported, held in stdout's buffer (a file's, unless
    # PYTHONUNBUFFERED), was written at exit after this line: "ckpt-events bench: connecting
    # to db..." was said for why.
    sys.stdout.flush()
    print(why, file=sys.stderr)
    return REFUSED


def main(argv: list[str]) -> int:
    spec, port, state_file = argv[0], int(argv[1]), Path(argv[2])
    state: dict[str, Any] = {"pid": os.getpid()}
    # Only the refusals are caught: a ValueError or ConfigurationError the module raised while
    # imported (a second instrument()) was taken for one, printed bare or as "not instrumented".
    try:
        app = load_app(spec)
    except AppRefused as exc:
        return _refused(str(exc))
    try:
        _reporting(app, state_file, state)
    except ConfigurationError:
        return _refused(
            f"--app {spec} is not instrumented: call ckpt_events.participants.fastapi.instrument(app, ...) "
            "where the app is made (docs/fastapi.md)"
        )
    # Bound here, before the startup writes the state file that names the port: the bench then
    # never reaches another process (it chose a free port, which another could take before
    # uvicorn bound it, after the startup; the first request and the warm-up went there).
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on a socket that says it is TCP,
    # and without it each answer waited out a delayed ACK (40 ms: 100 requests/s, not 6,000).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        return _refused(f"the bench's server cannot listen on 127.0.0.1:{port}: {exc.strerror}")
    state["port"] = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # A request that hangs (a route refused for it) held the stop until the bench's SIGKILL,
        # 30 s, and the telemetry's drain with it: cancelled after this many seconds.
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
