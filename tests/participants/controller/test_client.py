"""The controller's client of the control routes (``participants.controller.client``), against a real
participant served by uvicorn in this process: the status, a refusal by its code, an unreachable URL."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events import InvalidValueError
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.fleet import serving
from ckpt_events.participants.controller.client import ControlClient
from ckpt_events.participants.controller.fan_out import described
from ckpt_events.participants.errors import ParticipantCallError, ParticipantUnreachable
from ckpt_events.vocab import ErrorCode
from tests.participants.cut_reply import cut_reply_and_closed_port

TOKEN = "client-test-token"


async def test_nobody_there_then_status_then_a_wrong_token(tmp_path: Path) -> None:
    """Nothing listening: ParticipantUnreachable naming the URL. With the token: the participant's
    kind and instance. With another: a ParticipantCallError carrying the code and status."""
    app = create_app("agent", instance="agent-7", token=TOKEN, checkpoint_root=tmp_path)
    # One HTTP client under both (each new one loads TLS certificates: ~0.1 s); it stays ours.
    async with httpx.AsyncClient() as http:
        client, stranger = ControlClient(TOKEN, client=http), ControlClient("wrong", client=http)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            gone = f"http://127.0.0.1:{closed.getsockname()[1]}"
            with pytest.raises(ParticipantUnreachable) as unreachable:
                await client.status(gone, timeout=5)
        assert unreachable.value.url.startswith(gone) and unreachable.value.status is None
        async with serving(app) as url:
            status = await client.status(url, timeout=5)
            assert (str(status.kind), status.instance) == ("agent", "agent-7")
            with pytest.raises(ParticipantCallError) as refused:
                await stranger.status(url, timeout=5)
            assert (refused.value.code, refused.value.status) == (ErrorCode.UNAUTHORIZED, 401)
            await client.aclose()  # the caller's HTTP client is left open
            assert not http.is_closed
            await http.aclose()  # its kept-alive connection would hold the server's shutdown
    assert client.auth_headers == {"authorization": f"Bearer {TOKEN}"}


async def test_a_participant_that_never_answers_is_said_to_be_silent_for_the_timeout() -> None:
    """A server that takes the connection and never answers: ``ParticipantUnreachable`` says
    how long it waited (httpx's ``ReadTimeout`` has no message of its own)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel takes the connection; nobody ever reads or answers
        async with ControlClient(TOKEN) as client:
            with pytest.raises(ParticipantUnreachable) as info:
                await client.status(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.2)
    assert info.value.detail == "ReadTimeout: no answer within 0.2 s"
    # It took the connection: reached, and said so (not "unreachable", which a refused connect is).
    assert info.value.reached
    assert described(info.value).startswith("no whole reply from http://127.0.0.1:")


async def test_a_reply_cut_mid_body_is_no_whole_reply_and_a_refused_connect_is_unreachable() -> None:
    """A participant that answers a head promising 100 bytes and closes after 5 was reached; a
    port nobody listens on was not. The coordinator's line says which."""
    async with cut_reply_and_closed_port() as (url, nobody), ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantUnreachable) as cut:
            await client.status(url, timeout=5)
        with pytest.raises(ParticipantUnreachable) as gone:
            await client.status(nobody, timeout=5)
    assert cut.value.reached and "RemoteProtocolError" in cut.value.detail
    assert described(cut.value).startswith(f"no whole reply from {url}")
    assert not gone.value.reached and described(gone.value).startswith("unreachable at ")


def test_a_token_is_required() -> None:
    """An empty token is refused when the client is made."""
    with pytest.raises(InvalidValueError, match="token"):
        ControlClient("")


async def test_a_participant_that_trickles_its_reply_is_cut_at_the_calls_timeout() -> None:
    """A participant that answers its head at once, then one byte every 0.1 s: httpx's timeout
    bounds each read, not the call, so a prepare with a 3 s deadline waited 20 s for such a
    reply (and a commit was published 17 s past its deadline). The call ends at its timeout."""
    with socket.socket() as trickler:
        trickler.bind(("127.0.0.1", 0))
        trickler.listen()
        trickler.settimeout(10)  # bounded: the thread ends even if no call comes

        def trickle() -> None:
            with contextlib.suppress(OSError):
                conn, _ = trickler.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 200\r\n\r\n")
                    for _ in range(100):  # 10 s at most, a byte at a time
                        conn.sendall(b" ")
                        time.sleep(0.1)

        async with anyio.create_task_group() as tg, ControlClient(TOKEN) as client:
            tg.start_soon(anyio.to_thread.run_sync, trickle)
            started = time.monotonic()
            with pytest.raises(ParticipantUnreachable) as info:
                await client.status(f"http://127.0.0.1:{trickler.getsockname()[1]}", timeout=0.5)
            took = time.monotonic() - started
    # It ends at 0.75 s (the timeout and the whole call's slack): 3 s holds on a host 3x slower
    # and is still 7 s short of the 10 s trickle the per-read bound waited out.
    assert took < 3.0, f"waited {took:.1f} s for a 0.5 s timeout"
    assert info.value.reached and info.value.detail == "TimeoutError: no whole answer within 0.5 s"
    assert described(info.value).startswith("no whole reply from http://127.0.0.1:")


async def test_a_reply_that_is_not_json_says_what_came_instead(tmp_path: Path) -> None:
    """A participant behind a proxy that answers its own HTML page with 200: the failure said
    only "unexpected reply: JSON is malformed: invalid character (byte 0)", not what came. It
    names the content type and shows the body's start."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    proxy = FastAPI()

    @proxy.get("/ng-control/v1/checkpoint/status")
    async def login() -> HTMLResponse:
        return HTMLResponse("<html><title>Sign in</title></html>")

    async with serving(proxy) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=5)
    assert info.value.status == 200
    assert info.value.detail == (
        "unexpected reply: JSON is malformed: invalid character (byte 0); "
        "it was text/html: '<html><title>Sign in</title></html>'"
    )


async def test_a_reply_that_echoes_the_token_does_not_carry_it_into_the_error() -> None:
    """A proxy whose refusal echoes the request's Authorization header (as a page, or as the
    protocol's error body): the error (logged by the controller, printed by the command line,
    recorded on its span) shows it redacted, as it shows a URL's password."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, Response

    proxy = FastAPI()
    replies = iter(["page", "json"])

    @proxy.get("/ng-control/v1/checkpoint/status")
    async def refuse() -> Response:
        echoed = f"Bearer {TOKEN}"  # what it was sent
        if next(replies) == "page":
            return PlainTextResponse(f"denied: Authorization: {echoed}", status_code=403)
        body = {"error": {"code": "unauthorized", "detail": f"bad header {echoed}"}}
        return JSONResponse(body, status_code=401)

    async with serving(proxy) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=5)
        assert TOKEN not in str(info.value)
        assert info.value.detail == "denied: Authorization: Bearer [REDACTED]"
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=5)
        assert TOKEN not in str(info.value)
        assert info.value.code is ErrorCode.UNAUTHORIZED
        assert info.value.detail == "bad header Bearer [REDACTED]"
