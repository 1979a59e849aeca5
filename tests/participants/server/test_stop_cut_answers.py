"""``StopCutAnswered`` under a real uvicorn whose graceful-shutdown deadline cuts requests: which
of them it answers 503, and which it leaves as they are. Raw sockets, so each byte the client
receives is seen."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_events.participants.cli.fleet import free_port
from ckpt_events.participants.server.limits import STOP_CUT_CODE
from tests.participants.cli.sessions import accepts, session, wait_for

pytestmark = pytest.mark.e2e

_APP = """
import asyncio, sys
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ckpt_events.participants.server.limits import BodyLimit, StopCutAnswered, server_limits

app = FastAPI()
app.add_middleware(BodyLimit, max_body_bytes=1_000_000)
app.add_middleware(StopCutAnswered)

@app.get("/catch")
async def catch():
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        return JSONResponse({"caught": True})

@app.get("/stream")
async def stream():
    async def chunks():
        for i in range(300):
            yield b"chunk\\n"
            await asyncio.sleep(0.1)
    return StreamingResponse(chunks())

@app.post("/upload")
async def upload(request: Request):
    return {"bytes": len(await request.body())}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), timeout_graceful_shutdown=0.5,
            log_level="error", **server_limits())
"""


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_only_a_request_cut_before_its_response_started_is_answered_503(tmp_path: Path) -> None:
    """At the shutdown deadline: a body still arriving (length given, and chunked through
    ``BodyLimit``'s count) is answered 503 ``server_stopping``, ``Connection: close``; a
    handler that catches the cancellation keeps its own 200; a stream cut mid-body is left as
    it is: one response start, its chunked body unterminated (here Starlette's stream ends
    without raising, so the middleware's own check of a started response is not reached)."""
    port = free_port()
    program = [sys.executable, "-c", _APP]
    with session(
        [str(port)], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, command=program
    ) as proc:
        wait_for(lambda: proc.poll() is not None or accepts(port), 20, "the server to listen")
        assert proc.poll() is None, "the server ended before it served"
        host = b"Host: x\r\n"
        requests = {
            "length": b"POST /upload HTTP/1.1\r\n" + host + b"Content-Length: 1000\r\n\r\n" + b"x" * 10,
            "chunked": b"POST /upload HTTP/1.1\r\n"
            + host
            + b"Transfer-Encoding: chunked\r\n\r\na\r\n"
            + b"x" * 10,
            "catch": b"GET /catch HTTP/1.1\r\n" + host + b"\r\n",
            "stream": b"GET /stream HTTP/1.1\r\n" + host + b"\r\n",
        }
        socks = {name: socket.create_connection(("127.0.0.1", port), 5) for name in requests}
        for name, raw in requests.items():
            socks[name].sendall(raw)
        time.sleep(0.3)  # each is in its route
        os.kill(proc.pid, signal.SIGTERM)
        got = {name: _read_all(sock) for name, sock in socks.items()}
        for sock in socks.values():
            sock.close()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.wait(10)
    for name in ("length", "chunked"):
        head, _, answer = got[name].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head, got[name]
        assert STOP_CUT_CODE.encode() in answer, got[name]
    assert got["catch"].startswith(b"HTTP/1.1 200 ") and got["catch"].endswith(b'{"caught":true}'), got[
        "catch"
    ]
    assert got["stream"].count(b"HTTP/1.1 ") == 1 and got["stream"].startswith(b"HTTP/1.1 200 "), got[
        "stream"
    ]
    assert b"chunk\n" in got["stream"] and not got["stream"].endswith(b"0\r\n\r\n"), got["stream"]
    assert "ASGI message" not in err, err  # uvicorn refusing a second start


def test_every_reference_server_answers_a_stop_cut_503() -> None:
    """The participants' apps answered a request their stop cut 503; the inference worker's
    answered uvicorn's 500 (its app was built without the middleware)."""
    from ckpt_events.participants.server.app import create_app
    from ckpt_events.participants.server.inference import create_inference_app
    from ckpt_events.participants.server.limits import StopCutAnswered

    apps = {
        "inference": create_inference_app(token="t"),
        "environment": create_app("environment", instance="environment-0", token="t"),
    }
    for name, app in apps.items():
        assert StopCutAnswered in [m.cls for m in app.user_middleware], name
