"""The server benchmark's nemo-lens variant: the same endpoint, its three spans made with ``managed_span``.

``PYTHON server_app_nemo_lens.py PORT [COLLECTOR_URL]`` serves ``POST /work`` on 127.0.0.1 under an
interpreter with ``nemo-lens[sdk]``, fastapi and uvicorn; without a collector, uninstrumented (the
baseline on the same interpreter). nemo-lens requires Python >= 3.13, so
this module runs apart from the bench's interpreter and imports nothing of ours (its unit of work
is ``server_app``'s, kept identical by a test). Telemetry is set up as nemo-lens's quick start
says: ``NEMO_LENS_ENABLED=1`` and the OTLP endpoint in the environment, ``NemoLensConfig.from_env()``,
``setup_telemetry()``, ``managed_span(group, name, **attrs)`` yielding the span (or ``None``), and
``handle.shutdown()``. The exporter is OTLP/HTTP protobuf to the collector, like the other variants.
nemo-lens sets the global tracer and meter providers, which FastAPI's own telemetry (0.16x: a server
span, two operation spans and request metrics per request) would then use: it is turned off, so
the variant makes the same three spans as the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from nemo.lens import (  # type: ignore[import-not-found]
    NemoLensConfig,
    SpanGroup,
    is_span_group_enabled,
    managed_span,
    setup_telemetry,
)

_P = "nemo.gym.checkpoint."
_OPERATION = {_P + "id": "c1", _P + "participant_kind": "resources", _P + "instance": "resources-0"}
_GROUP = SpanGroup.CHECKPOINT  # in nemo-lens's default span groups


def _unit_of_work(body: bytes) -> int:
    digest = body
    for _ in range(8):
        digest = hashlib.sha256(digest + body).digest()
    return len(digest)


def _handle(body: bytes) -> int:
    # The sdk variant's spans and attributes; `if span:` is the quick start's guard for a disabled group.
    op: Any
    step: Any
    with managed_span(_GROUP, "gym.checkpoint.commit", **_OPERATION) as op:
        with managed_span(_GROUP, "gym.checkpoint.export") as step:
            size = _unit_of_work(body)
            if step:
                step.set_attribute(_P + "records", 1)
        with managed_span(_GROUP, "gym.checkpoint.write") as step:
            if step:
                step.set_attribute(_P + "records", 1)
                step.set_attribute(_P + "bytes", size)
        if op:
            op.set_attribute(_P + "records", 1)
            op.set_attribute(_P + "outcome", "ok")
    return size


def make_app(instrumented: bool) -> FastAPI:
    """The app: telemetry set up in the lifespan, shut down (flushed) after it, if ``instrumented``."""
    handle_work: Callable[[bytes], int] = _handle if instrumented else _unit_of_work

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not instrumented:
            yield
            return
        handle = setup_telemetry(NemoLensConfig.from_env(), rank=0, world_size=1)
        if not (handle.is_exporting and is_span_group_enabled(_GROUP)):
            raise RuntimeError(f"nemo-lens is not exporting the {_GROUP!r} span group")
        try:
            yield
        finally:
            handle.shutdown()

    # Only the three spans of the other variants: no FastAPI spans or metrics on the global providers.
    native = "telemetry" in inspect.signature(FastAPI).parameters
    off: dict[str, Any] = {"telemetry": {"tracing": False, "metrics": False, "logs": False}} if native else {}
    app = FastAPI(lifespan=lifespan, **off)

    @app.post("/work")
    async def work(request: Request) -> Response:
        size = handle_work(await request.body())
        return Response(content=str(size), media_type="text/plain")

    return app


def main(argv: list[str]) -> int:
    port, collector = int(argv[0]), (argv[1] if len(argv) > 1 else None)
    if collector:
        # nemo-lens and the OTLP exporters it builds read their configuration from the environment.
        os.environ.update(
            NEMO_LENS_ENABLED="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME="bench-server",
        )
    app = make_app(instrumented=collector is not None)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="asyncio")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
