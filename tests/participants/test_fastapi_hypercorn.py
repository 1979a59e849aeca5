"""``ckpt_events.participants.fastapi`` served by hypercorn, not uvicorn: its lifespan, its
graceful shutdown with requests in flight, and a stream whose client left."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events import OperationFinished, OperationStarted
from ckpt_events.sinks import read_events
from tests.participants.asgi_servers import asgi_server

pytest.importorskip("hypercorn", reason="hypercorn is not installed (pip install -e '.[dev]')")

APP = """\
    import time

    import anyio
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    from ckpt_events.participants.fastapi import instrument, operation

    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path="events.jsonl", environ={})


    @app.get("/stream")
    def stream(request: Request) -> StreamingResponse:
        def chunks():
            with operation(request, "restore", checkpoint_id="left"):
                for _ in range(500):
                    yield b"x" * 65536
                    time.sleep(0.01)

        return StreamingResponse(chunks())


    @app.post("/slow/{checkpoint_id}")
    async def slow(request: Request, checkpoint_id: str) -> dict[str, str]:
        with operation(request, "commit", checkpoint_id=checkpoint_id):
            await anyio.sleep(0.5)
        return {"checkpoint_id": checkpoint_id}
"""


@pytest.mark.e2e
async def test_hypercorn_drains_requests_in_flight_at_shutdown_and_ends_a_left_stream(tmp_path: Path) -> None:
    """Under hypercorn the lifespan starts the bus, a stream whose client left after 4 chunks
    ends its operation then (was: 3.6 s later, when the garbage collector closed the generator),
    and the three requests in flight at SIGTERM are answered and their operations logged."""
    (tmp_path / "user_app.py").write_text(textwrap.dedent(APP))
    replies: list[int] = []
    async with asgi_server("hypercorn", "user_app:app", tmp_path) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            async with client.stream("GET", "/stream") as reply:
                got = 0
                async for data in reply.aiter_bytes():
                    got += len(data)
                    if got >= 4 * 65536:
                        break  # the client leaves

            async def slow(checkpoint_id: str) -> None:
                replies.append((await client.post(f"/slow/{checkpoint_id}")).status_code)

            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(slow, f"s{n}")
                await anyio.sleep(0.2)  # the three are in the handler
                served.process.send_signal(signal.SIGTERM)
    assert served.process.returncode == 0
    assert replies == [200, 200, 200]
    events = [event for _, event in read_events(tmp_path / "events.jsonl")]
    started = {e.span_id: e.checkpoint_id for e in events if isinstance(e, OperationStarted)}
    finished = {e.checkpoint_id: e for e in events if isinstance(e, OperationFinished)}
    assert sorted(started.values()) == sorted(finished) == ["left", "s0", "s1", "s2"]
    assert [finished[f"s{n}"].outcome for n in range(3)] == ["ok"] * 3
    left = finished["left"]
    assert (left.outcome, left.error_type) == ("error", "ckpt_events.participants.fastapi.RequestEnded")
    # 500 chunks would take 5 s; it ended when the client left (4 chunks; 2 s of margin here).
    assert (left.end_ns - left.start_ns) / 1e9 < 2.0


RAISING_APP = """\
    from fastapi import FastAPI

    from ckpt_events.participants.fastapi import instrument

    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", environ={})

    FAILURE = "upload to https://alice:hunter2@store.example/b: Bearer eyJsecret123 \\x1b[2J"


    @app.post("/grade")
    async def grade() -> None:
        raise RuntimeError(FAILURE)
"""


@pytest.mark.e2e
async def test_hypercorn_logs_an_escaped_exception_redacted_and_escaped(tmp_path: Path) -> None:
    """Under hypercorn, "Error in ASGI Framework" logs the app's exception with its traceback,
    its ``user:password@``, its ``Bearer`` token redacted and its ESC escaped, as under uvicorn
    (was: all three raw on hypercorn's stderr)."""
    (tmp_path / "user_app.py").write_text(textwrap.dedent(RAISING_APP))
    async with asgi_server("hypercorn", "user_app:app", tmp_path) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            failed = await client.post("/grade")
    output = served.output
    assert failed.status_code == 500
    assert "Error in ASGI Framework" in output, output[-3000:]
    redacted = "RuntimeError: upload to https://[REDACTED]@store.example/b: Bearer [REDACTED]"
    assert redacted in output, output[-3000:]
    assert "hunter2" not in output and "eyJsecret123" not in output, output[-3000:]
    assert "\x1b" not in output, output[-3000:]
