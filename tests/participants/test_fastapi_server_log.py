"""An exception leaving an instrumented app: what the client gets, and what the server logs."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ckpt_events.participants.fastapi import instrument
from ckpt_events.testing import MemorySink
from tests.participants.asgi_servers import asgi_server
from tests.participants.helpers import AUTH, TOKEN, body

pytestmark = pytest.mark.anyio

SECRET = "upload to https://alice:hunter2@store.example/b failed; Authorization: Bearer eyJsecret123"
REDACTED = "upload to https://[REDACTED]@store.example/b failed; Authorization: Bearer [REDACTED]"

# A participant served by one uvicorn process, whose workload's export fails with SECRET.
PARTICIPANT = f"""
from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.server.app import make_workload


FAILURE = {SECRET!r}  # a name: the traceback quotes the raise's line, not this one


async def export(self, scope):
    raise RuntimeError(FAILURE)


kind = type(make_workload("environment", Telemetry(Bus(), kind="environment", instance="env-0")))
kind.export = export
app = create_app("environment", instance="env-0", token={TOKEN!r}, checkpoint_root=".")
"""


@pytest.mark.e2e
async def test_one_uvicorn_process_answers_a_failed_handler_409_and_logs_it_redacted(tmp_path: Path) -> None:
    """A commit whose export raises with a ``user:password@`` URL and a ``Bearer`` token, in one
    real uvicorn process: it answered a plain-text 500 (``--workers`` answers 409
    ``checkpoint_error``), and uvicorn's "Exception in ASGI application" traceback on its stderr
    carried both credentials verbatim."""
    (tmp_path / "participant.py").write_text(PARTICIPANT)
    async with asgi_server(
        "uvicorn", "participant:app", tmp_path, {"PYTHONPATH": os.pathsep.join(sys.path)}
    ) as served:
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=10) as client:
            started = await client.post("/work/start", json={"rollout_id": "r0", "steps": 2})
            assert started.status_code == 200, started.text
            control = "/ng-control/v1/checkpoint"
            prepared = await client.post(f"{control}/prepare", json=body("c1"))
            assert prepared.status_code == 200, prepared.text
            failed = await client.post(f"{control}/commit", json=body("c1", checkpoint_dir="c1"))
    output = served.output
    assert failed.headers["content-type"] == "application/json", failed.text
    assert failed.status_code == 409, failed.text
    assert failed.json() == {"error": {"code": "checkpoint_error", "detail": REDACTED}}
    # uvicorn still logs the traceback (the server's operator wants it), redacted.
    assert "Exception in ASGI application" in output, output[-3000:]
    assert f"RuntimeError: {REDACTED}" in output, output[-3000:]
    assert "hunter2" not in output and "eyJsecret123" not in output, output[-3000:]


async def test_the_app_s_own_handler_gets_its_exception_as_raised(caplog: pytest.LogCaptureFixture) -> None:
    """The redaction is of the server's record only: the app's own ``Exception`` handler gets the
    very object raised, its message intact, and a record of it on ``uvicorn.error`` (as uvicorn
    makes it) is redacted, with the same class name and traceback."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))
    raised: list[BaseException] = []
    handled: list[BaseException] = []

    class UploadFailed(Exception):
        pass

    @app.post("/grade")
    async def grade() -> None:
        raised.append(UploadFailed(SECRET))
        raise raised[0]

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        handled.append(exc)
        return JSONResponse({"said": str(exc)}, status_code=500)

    app.add_exception_handler(Exception, on_error)
    server_log = logging.getLogger("uvicorn.error")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            with pytest.raises(UploadFailed) as caught:
                await client.post("/grade")
            # Logged as uvicorn's run_asgi does, from the task that called the app.
            with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
                server_log.error("Exception in ASGI application\n", exc_info=caught.value)
            # Another exception, which never left the app, is logged as it is.
            with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
                server_log.error("theirs", exc_info=RuntimeError(SECRET))
    assert caught.value is raised[0] and handled == raised
    assert str(raised[0]) == SECRET
    ours, theirs = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert ours.exc_info is not None and ours.exc_info[1] is not raised[0]
    assert type(ours.exc_info[1]).__name__ == "UploadFailed" and str(ours.exc_info[1]) == REDACTED
    assert ours.exc_info[2] is raised[0].__traceback__
    assert theirs.exc_info is not None and str(theirs.exc_info[1]) == SECRET
