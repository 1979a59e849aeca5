"""What ``operation(request)`` and ``incoming(request).operation(...)`` return before ``with``:
the handle's own calls, as ``tel.operation(...)`` gives them, whether a sink listens or not."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI, Request

from ckpt_events import _span_handles
from ckpt_events.participants.fastapi import incoming, instrument, operation, telemetry
from ckpt_events.testing import MemorySink

_CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _instrumented(sink: MemorySink | None) -> FastAPI:
    """An instrumented app of kind ``judge`` with ``sink`` subscribed (None: telemetry off)."""
    app = FastAPI()
    if sink is None:
        instrument(app, kind="judge", instance="judge-0")
    else:
        instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))
    return app


def _app(sink: MemorySink | None) -> FastAPI:
    """An app whose routes forget ``with``; ``sink`` None: telemetry off."""
    app = _instrumented(sink)

    @app.post("/operation")
    async def by_operation(request: Request) -> dict[str, str | None]:
        op = operation(request, "commit", checkpoint_id="c1")  # `with` forgotten
        op.set(records=1)
        with op.step("upload"):
            pass
        return {"traceparent": op.traceparent()}

    @app.post("/incoming")
    async def by_incoming(request: Request) -> dict[str, str | None]:
        op = incoming(request).operation(telemetry(request), "commit", checkpoint_id="c1")
        op.set(records=1)
        return {"traceparent": op.traceparent()}

    return app


@pytest.mark.parametrize("listening", [False, True], ids=["off", "on"])
async def test_a_forgotten_with_behaves_as_tel_operations_on_or_off(
    listening: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that forgot ``with`` answers alike with telemetry off and on (it was a 500,
    ``AttributeError: 'HeldOperation' object has no attribute 'set'``, only once a sink listened):
    its operation records nothing, its step says how to open it, and its ``traceparent()`` is
    in the caller's trace."""
    # The step's warning is said once a process: a test run before this one in the same worker
    # (another file's) may have said it already.
    monkeypatch.setattr(_span_handles, "_SAID_UNENTERED", [])
    sink = MemorySink() if listening else None
    app = _app(sink)
    caplog.set_level(logging.WARNING, logger="ckpt_events")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
            for path in ("/operation", "/incoming"):
                reply = await client.post(path, headers={"traceparent": _CALLER})
                assert reply.status_code == 200, reply.text
                assert reply.json()["traceparent"].split("-")[1] == _CALLER.split("-")[1]
    if sink is not None:
        assert [type(event).__name__ for event in sink.events] == ["StepStarted", "StepFinished"]
        assert "made of a commit operation not entered" in caplog.text


@pytest.mark.parametrize("listening", [False, True], ids=["off", "on"])
async def test_async_with_says_to_use_with_on_or_off(listening: bool) -> None:
    """``async with operation(request, ...)`` (and ``incoming(request).operation(...)``) is one
    ``InvalidTypeError`` saying to use ``with``, telemetry on or off (it was Python's "'HeldOperation'
    object does not support the asynchronous context manager protocol", or '_NoopOperation'
    with telemetry off), and records nothing."""
    sink = MemorySink() if listening else None
    app = _instrumented(sink)

    @app.post("/{how}")
    async def commit(request: Request, how: str) -> str:
        tel = telemetry(request)
        made = (
            operation(request, "commit", checkpoint_id="c1")
            if how == "operation"
            else incoming(request).operation(tel, "commit", checkpoint_id="c1")
        )
        try:
            async with made:  # type: ignore[attr-defined]
                pass
        except TypeError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "entered"

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
            for path in ("/operation", "/incoming"):
                said = (await client.post(path)).json()
                assert said.startswith("InvalidTypeError: tel.operation(...) (or operation(request, ...))")
                assert "is entered with `with`, not `async with`" in said
    if sink is not None:
        assert sink.events == []
