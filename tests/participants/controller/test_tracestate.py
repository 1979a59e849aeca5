"""tracestate travels with traceparent: the controller's client sends it, the routes read it."""

from __future__ import annotations

import time
from typing import Any

import httpx
from fastapi import FastAPI

from ckpt_events import Telemetry, format_traceparent, parse_traceparent
from ckpt_events.participants.cli.fleet import local_fleet
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.fastapi import Incoming
from ckpt_events.participants.server.routes import Trace
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Operation

TOKEN = "tracestate-test-token"
_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_control_calls_carry_the_tracestate_of_their_trace() -> None:
    """Every prepare/resume call made under a collection continued with tracestate sends it."""
    sent: list[httpx.Headers] = []

    async def record(request: httpx.Request) -> None:
        if request.method == "POST":
            sent.append(request.headers)

    async with capture_events() as (bus, _):
        async with local_fleet(token=TOKEN, bus=bus, members=(("model", "model-0"),)) as urls:
            async with httpx.AsyncClient(event_hooks={"request": [record]}) as http:
                tel = Telemetry(bus, kind="controller", instance="coordination")
                coordinator = await Coordinator.discover(urls, token=TOKEN, telemetry=tel, client=http)
                async with coordinator:
                    with tel.collection("checkpoint", traceparent=_PARENT).with_tracestate("rojo=1") as root:
                        await coordinator.prepare("c-ts", deadline_ts=time.time() + 10, parent=root)
                        await coordinator.resume("c-ts", deadline_ts=time.time() + 10, parent=root)
    assert len(sent) >= 2
    for headers in sent:
        parent = parse_traceparent(headers["traceparent"])
        assert parent is not None and parent.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
        assert headers["tracestate"] == "rojo=1"


async def test_routes_read_tracestate_fields_joined() -> None:
    """Two tracestate header fields reach the route as one value joined with ','."""
    app = FastAPI()

    @app.get("/t")
    async def echo(trace: Trace) -> dict[str, Any]:
        parent = None if trace.parent is None else format_traceparent(*trace.parent)
        return {"traceparent": parent, "tracestate": trace.tracestate}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        headers = [("traceparent", _PARENT), ("tracestate", "rojo=1"), ("tracestate", "congo=2")]
        reply = await client.get("/t", headers=headers)
        bare = await client.get("/t")
    assert reply.json() == {"traceparent": _PARENT, "tracestate": "rojo=1,congo=2"}
    assert bare.json() == {"traceparent": None, "tracestate": None}


async def test_incoming_opens_an_operation_that_keeps_tracestate() -> None:
    """Incoming.operation continues the caller's trace and keeps its tracestate."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="agent", instance="a0")
        trace = Incoming.from_headers(_PARENT, "rojo=1,congo=2")
        with trace.operation(tel, Operation.PREPARE, checkpoint_id="c1") as op:
            assert op.tracestate() == "rojo=1,congo=2"
            assert op.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
