"""The server of the server-under-load benchmark: one FastAPI endpoint, one telemetry variant.

``python -m ckpt_events.benchmarks.server_app VARIANT PORT [COLLECTOR_URL [BATCH_INTERVAL]]`` serves
``POST /work`` on 127.0.0.1: hash a 2 KiB body a few times (a small unit of work), inside ``tel.operation``
with two steps (or the same three spans made with the OpenTelemetry SDK directly).
Variants: ``uninstrumented``, ``no_sink``, ``null`` (a sink that takes every event and does
nothing: what building and delivering the events cost), ``jsonl``, ``otlp``
(``ckpt_events.sinks.configure`` with the collector's endpoint: ``OtlpSpanSink`` plus
``OtlpMetricSink`` over OTLP/HTTP), ``all`` (every sink on, as a deployment turns them on:
``otlp``'s two, JSON lines and the Prometheus ``/metrics`` endpoint, not scraped),
``all_export_process`` (``all`` with ``configure(export_process=True)``) and ``sdk`` (tracer
with a ``BatchSpanProcessor`` and the OTLP/HTTP exporter to the collector).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response

from ckpt_events import Bus, Telemetry

__all__ = ["VARIANTS", "make_app"]

VARIANTS = ("uninstrumented", "no_sink", "null", "jsonl", "otlp", "all", "all_export_process", "sdk")
_P = "nemo.gym.checkpoint."


def _unit_of_work(body: bytes) -> int:
    digest = body
    for _ in range(8):
        digest = hashlib.sha256(digest + body).digest()
    return len(digest)


def _ours(tel: Telemetry) -> Callable[[bytes], int]:
    def handle(body: bytes) -> int:
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("export") as step:
                size = _unit_of_work(body)
                step.set(records=1)
            with op.step("write") as step:
                step.set(records=1, bytes=size)
            op.set(records=1, bytes=size)
        return size

    return handle


def _sdk(tracer: Any) -> Callable[[bytes], int]:
    start = tracer.start_as_current_span
    attributes = {_P + "id": "c1", _P + "participant_kind": "resources", _P + "instance": "resources-0"}

    def handle(body: bytes) -> int:
        with start("gym.checkpoint.commit", attributes=attributes) as op:
            with start("gym.checkpoint.export") as step:
                size = _unit_of_work(body)
                step.set_attribute(_P + "records", 1)
            with start("gym.checkpoint.write") as step:
                step.set_attribute(_P + "records", 1)
                step.set_attribute(_P + "bytes", size)
            op.set_attribute(_P + "records", 1)
            op.set_attribute(_P + "outcome", "ok")
        return size

    return handle


class _Null:
    """Takes every event and does nothing with it."""

    def handle(self, batch: list[Any]) -> None:
        pass


#: What a variant's server calls per request: ``_ours`` for a ``Telemetry``, the bare
#: ``_unit_of_work`` uninstrumented. ``server_profile`` passes timed twins of both.
Instrument = Callable[[Telemetry], Callable[[bytes], int]]


@contextlib.asynccontextmanager
async def _telemetry(
    variant: str,
    collector: str | None,
    batch_interval: float | None = None,
    *,
    bus_class: type[Bus] = Bus,
    instrument: Instrument = _ours,
    bare: Callable[[bytes], int] = _unit_of_work,
) -> AsyncIterator[Callable[[bytes], int]]:
    if variant == "uninstrumented":
        yield bare
        return
    if variant == "sdk":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource({"service.name": "bench-server"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
        yield _sdk(provider.get_tracer("bench"))
        provider.shutdown()
        return
    bus = bus_class() if batch_interval is None else bus_class(batch_interval=batch_interval)
    async with bus, contextlib.AsyncExitStack() as stack:
        if variant == "null":
            # What every sink pays before its own work: the events built and delivered.
            bus.subscribe(_Null())
        elif variant == "jsonl":
            from ckpt_events.sinks.jsonl import JsonLinesSink

            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            bus.subscribe(JsonLinesSink(Path(tmp) / "events.jsonl"))
        elif variant in ("otlp", "all", "all_export_process"):
            from ckpt_events import sinks

            # What `serve` does: configure() -> OtlpSpanSink + OtlpMetricSink over OTLP/HTTP;
            # `all` adds JSON lines and the /metrics endpoint (on a free port, not scraped);
            # `all_export_process` is `all` with the sinks in configure()'s export process.
            everything = variant != "otlp"
            environ = (
                {
                    "OTEL_METRICS_EXPORTER": "otlp,prometheus",
                    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
                }
                if everything
                else {}
            )
            jsonl = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "events.jsonl"
            configured = sinks.configure(
                bus,
                otlp_endpoint=collector,
                jsonl_path=jsonl if everything else None,
                service_name="bench-server",
                environ=environ,
                export_process=variant == "all_export_process",
            )
            stack.push_async_callback(configured.aclose)
        yield instrument(Telemetry(bus, kind="resources", instance="resources-0"))


def make_app(
    variant: str,
    collector: str | None,
    batch_interval: float | None = None,
    *,
    bus_class: type[Bus] = Bus,
    instrument: Instrument = _ours,
    bare: Callable[[bytes], int] = _unit_of_work,
) -> FastAPI:
    """The benchmark's app for ``variant`` (``batch_interval``: its bus's; default ``Bus``'s).

    ``bus_class``, ``instrument`` and ``bare`` (the uninstrumented request) are for
    ``server_profile``, which times the parts of the same request inside the server."""
    handlers: dict[str, Callable[[bytes], int]] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        telemetry = _telemetry(
            variant, collector, batch_interval, bus_class=bus_class, instrument=instrument, bare=bare
        )
        async with telemetry as handle:
            handlers["work"] = handle
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/work")
    async def work(request: Request) -> Response:
        size = handlers["work"](await request.body())
        return Response(content=str(size), media_type="text/plain")

    return app


def main(argv: list[str]) -> int:
    variant, port = argv[0], int(argv[1])
    collector = argv[2] if len(argv) > 2 and argv[2] else None
    interval = float(argv[3]) if len(argv) > 3 else None
    app = make_app(variant, collector, interval)
    # asyncio's own loop, as every earlier table ran: uvicorn picks uvloop when it is installed
    # (the dev extra installs it), which moves the uninstrumented baseline the ratios divide by.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="asyncio")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
