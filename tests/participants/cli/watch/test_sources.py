"""watch's sources: a poll round survives silent, slow and hostile participants (followed logs:
``test_follow.py``)."""

from __future__ import annotations

import gzip
import http.server
import io
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from rich.console import Console

from ckpt_events.participants.cli.fleet import free_port, serving
from ckpt_events.participants.cli.watch.command import once_status
from ckpt_events.participants.cli.watch.pools import MemberPools
from ckpt_events.participants.cli.watch.sources import MAX_BODY, MAX_STRETCH, poll_all, status_client
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.replies import KEEPALIVE_SECONDS
from ckpt_events.participants.server.limits import server_limits

GOOD = b'{"kind":"agent","instance":"agent-\\u001b[2Jx","phase":"idle"}'


def _hostile_app(release: anyio.Event) -> FastAPI:
    app = FastAPI()

    @app.get("/slow" + CONTROL_PREFIX + "/status")
    async def slow() -> Response:
        with anyio.move_on_after(10):  # answers after 10 s, or when the test is done
            await release.wait()
        return Response(GOOD, media_type="application/json")

    @app.get("/invalid" + CONTROL_PREFIX + "/status")
    async def invalid() -> Response:
        return Response(b"{not json", media_type="application/json")

    @app.get("/huge" + CONTROL_PREFIX + "/status")
    async def huge() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(100):  # 100 MB
                yield b" " * (1 << 20)

        return StreamingResponse(chunks(), media_type="application/json")

    @app.get("/wrong" + CONTROL_PREFIX + "/status")
    async def wrong() -> Response:
        return Response(
            b'{"kind":"controller","instance":"db","phase":"idle"}', media_type="application/json"
        )

    @app.get("/locked" + CONTROL_PREFIX + "/status")
    async def locked() -> Response:
        return Response(b'{"error":{"code":"unauthorized","detail":"bad token"}}', status_code=401)

    @app.get("/escape" + CONTROL_PREFIX + "/status")
    async def escape() -> Response:
        return Response(GOOD, media_type="application/json")

    return app


async def test_a_round_with_hostile_participants_ends_within_its_timeout() -> None:
    """Silent, slow, invalid, 100 MB, wrong-kind and refusing participants are one line each (the
    refusal told apart); the good one is shown, its control characters escaped, its clock read from
    its Date header; the round takes about twice the per-poll timeout (the slow one polled again)."""
    release = anyio.Event()
    silent = f"http://127.0.0.1:{free_port()}"
    async with serving(_hostile_app(release)) as base:
        urls = [
            silent,
            *(f"{base}/{name}" for name in ("slow", "invalid", "huge", "wrong", "locked", "escape")),
        ]
        # watch's own client: five of them share one origin, so one pool of five connections
        async with status_client(urls, headers={}, timeout=0.8) as client:
            started = time.monotonic()
            results = await poll_all(client, urls, 0.8)
            took = time.monotonic() - started
        release.set()
    # Two polls of the slow one, 0.8 s each (1.6 s): 4.8 s holds on a host 3x slower and is
    # still 3.2 s short of the MAX_STRETCH bound (8 s) a poll not cut at its timeout waits.
    assert took < 4.8, f"{took:.2f} s"
    errors = {r.url.rsplit("/", 1)[-1]: r.error for r in results}
    assert errors[silent.rsplit("/", 1)[-1]].startswith("unreachable: ConnectError")
    assert errors["slow"] == "no answer within 0.8 s"
    assert errors["invalid"].startswith("invalid status reply: JSON is malformed")
    assert errors["huge"].startswith(f"a reply past the {MAX_BODY:,}-byte bound (stopped reading at ")
    assert errors["huge"].endswith(" bytes): not a participant status")
    assert errors["wrong"] == "not a checkpoint participant: kind 'controller'"
    assert (
        errors["locked"] == "HTTP 401 from /status (wrong token: pass --token-file or set $CKPT_EVENTS_TOKEN)"
    )
    assert errors["escape"] is None
    failures = {r.url.rsplit("/", 1)[-1]: r.failure for r in results}
    assert failures.pop("locked") == "refused" and failures.pop("escape") is None
    assert set(failures.values()) == {"unreachable"}
    # No clock header from this app: its clock is read from the HTTP Date header, to the second.
    (good,) = [r for r in results if r.status is not None]
    assert good.clock_offset is not None and good.clock_error is not None
    assert 1.0 <= good.clock_error < 1.5 and abs(good.clock_offset) <= good.clock_error
    view = FleetView(urls)
    view.add_polls(results, time.time())
    out = Console(width=80, record=True, file=io.StringIO())
    out.print(view.render())
    text = out.export_text(styles=False)
    assert "agent agent-\\x1b[2Jx" in text and "\x1b" not in text
    assert all(url in text for url in urls) and "…" not in text  # long lines wrap, never cut


async def test_a_gzipped_status_is_read_and_a_gzip_bomb_is_cut_at_the_bound() -> None:
    """A status gzipped (a proxy, a GZip middleware: httpx asks for it) was read raw and failed as
    "invalid status reply"; it is read. A 64 KB gzip of 64 MiB of zeros stops at ``MAX_BODY`` as
    decoded, never inflated whole."""
    bomb = gzip.compress(bytes(64 << 20), 9)
    app = FastAPI()

    @app.get("/zipped" + CONTROL_PREFIX + "/status")
    async def zipped() -> Response:
        return Response(
            gzip.compress(GOOD), media_type="application/json", headers={"content-encoding": "gzip"}
        )

    @app.get("/bomb" + CONTROL_PREFIX + "/status")
    async def bombed() -> Response:
        return Response(bomb, media_type="application/json", headers={"content-encoding": "gzip"})

    async with serving(app) as base:
        urls = [f"{base}/zipped", f"{base}/bomb"]
        async with status_client(urls, headers={}, timeout=5) as client:
            zipped_result, bomb_result = await poll_all(client, urls, 5)
    assert zipped_result.error is None and zipped_result.status is not None
    assert zipped_result.status.kind == "agent"
    assert bomb_result.status is None and bomb_result.error is not None
    assert bomb_result.error.startswith(f"a reply past the {MAX_BODY:,}-byte bound (stopped reading at ")
    stopped = int(bomb_result.error.rsplit(" at ", 1)[1].split()[0].replace(",", ""))
    assert stopped <= MAX_BODY + 64 * 1024


async def test_a_reply_cut_short_is_no_whole_reply_not_unreachable() -> None:
    """A participant that took the connection and closed it mid-reply was reached: its line says
    so, where a refused connection says unreachable."""
    from ckpt_events.participants.cli.watch.sources import poll_one
    from tests.participants.cut_reply import cut_reply_and_closed_port

    async with cut_reply_and_closed_port() as urls:
        async with status_client(urls, headers={}, timeout=5) as client:
            cut = await poll_one(client, urls[0], 5)
            gone = await poll_one(client, urls[1], 5)
    assert cut.error is not None and cut.error.startswith("no whole reply: RemoteProtocolError")
    assert gone.error is not None and gone.error.startswith("unreachable: ConnectError")


async def test_time_this_process_could_not_run_is_not_the_participants() -> None:
    """``demo --watch`` polls servers that run on its own event loop, and on a loaded machine the
    whole process waits for a core: 16 healthy servers were once all 'no answer within 0.8 s'.
    A loop that cannot run for 1 s (here blocked) mid-poll gets the participant's answer."""
    app = FastAPI()

    @app.get("/ok" + CONTROL_PREFIX + "/status")
    async def ok() -> Response:
        return Response(GOOD, media_type="application/json")

    async with serving(app) as base:
        urls = [f"{base}/ok"] * 4
        async with status_client(urls, headers={}, timeout=0.8) as client:

            async def stall() -> None:
                await anyio.sleep(0)  # the polls are out, their answers not read yet
                time.sleep(1.0)  # this process gets no core for a second (the loop cannot run)

            async with anyio.create_task_group() as tg:
                tg.start_soon(stall)
                results = await poll_all(client, urls, 0.8)
    assert [r.error for r in results] == [None] * 4
    assert all(r.status is not None and r.seconds >= 1.0 for r in results)


async def test_a_poll_given_up_at_the_wall_clock_bound_is_not_judged_slow() -> None:
    """A loop that cannot run for longer than ``MAX_STRETCH`` times the timeout (here blocked
    0.8 s against 10 x 0.05 s) gives its polls up at the wall-clock bound, having listened for
    none of their 0.05 s: 'no answer within 0.05 s' (4 of 4) blamed healthy participants for it.
    Each is now ``unknown``, with this watch's own lateness."""
    app = FastAPI()

    @app.get("/ok" + CONTROL_PREFIX + "/status")
    async def ok() -> Response:
        return Response(GOOD, media_type="application/json")

    assert MAX_STRETCH * 0.05 < 0.8
    async with serving(app) as base:
        urls = [f"{base}/ok"] * 4
        async with status_client(urls, headers={}, timeout=0.05) as client:

            async def stall() -> None:
                await anyio.sleep(0)  # the polls are out, their answers not read yet
                time.sleep(0.8)  # this process gets no core past the polls' wall-clock bound

            async with anyio.create_task_group() as tg:
                tg.start_soon(stall)
                results = await poll_all(client, urls, 0.05)
    assert [r.failure for r in results] == ["unknown"] * 4
    for result in results:
        assert result.error is not None and result.error.startswith("not judged: this watch could not run")
        assert "no answer within" not in result.error


def _slow_once_app(timeout: float, block: float = 0.0) -> FastAPI:
    """``/once``: its first status past ``timeout`` (3 times it), the next at once, or, given
    ``block``, after blocking this process's loop that long, then 3 times ``timeout`` more;
    ``/slow``: every status after 3 times ``timeout``."""
    app = FastAPI()
    calls = 0

    @app.get("/once" + CONTROL_PREFIX + "/status")
    async def once() -> Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(3 * timeout)
        elif block:
            time.sleep(block)  # this process's loop cannot run past the poll's wall-clock bound
            await anyio.sleep(3 * timeout)
        return Response(GOOD, media_type="application/json")

    @app.get("/slow" + CONTROL_PREFIX + "/status")
    async def slow() -> Response:
        await anyio.sleep(3 * timeout)
        return Response(GOOD, media_type="application/json")

    return app


async def test_a_participant_missed_once_is_polled_again_and_a_slow_one_is_still_named() -> None:
    """Python threads of this process holding the GIL slow its loop unseen by its lateness and
    its CPU wait (3 busy threads: 128 to 314 of 1,000 refused URLs 'no answer within 0.1 s'). A
    participant not heard in time is polled again, alone: one that answers then is shown (it was
    'no answer within 0.2 s'); one that answers after 3 times the timeout still misses twice, and
    is named slow, within about twice the timeout."""
    async with serving(_slow_once_app(0.2)) as base:
        urls = [f"{base}/once", f"{base}/slow"]
        async with status_client(urls, headers={}, timeout=0.2) as client:
            started = time.monotonic()
            once, slow = await poll_all(client, urls, 0.2)
            took = time.monotonic() - started
    assert once.error is None and once.status is not None
    assert (slow.error, slow.failure) == ("no answer within 0.2 s", "unreachable")
    assert 0.4 <= took < 1.2  # two polls' timeouts, not the MAX_STRETCH bound (2 s)


async def test_a_second_poll_that_cannot_be_judged_is_not_judged() -> None:
    """A participant missed once whose second poll this process cannot listen to (its loop blocked
    past the poll's wall-clock bound) is ``unknown``: not named slow on the first miss alone."""
    assert MAX_STRETCH * 0.05 < 0.7
    async with serving(_slow_once_app(0.05, block=0.7)) as base:
        urls = [f"{base}/once"]
        async with status_client(urls, headers={}, timeout=0.05) as client:
            (result,) = await poll_all(client, urls, 0.05)
    assert result.failure == "unknown"
    assert result.error is not None and result.error.startswith("not judged: this watch could not run")


async def test_a_client_for_1000_participants_is_built_at_once_and_shares_one_tls_context() -> None:
    """A pool per participant is one transport each, and each built its own TLS context from the
    CA bundle: 1,000 participants took 17 s and 876 MB before the first poll. They share one."""
    urls = [f"http://127.0.0.1:{20_000 + i}" for i in range(1000)]
    started = time.monotonic()
    async with status_client(urls, headers={}, timeout=0.8) as client:
        took = time.monotonic() - started
        pools = client._transport
        assert isinstance(pools, MemberPools)
        contexts = {id(t._pool._ssl_context) for t in [*pools.pools.values(), pools.other]}  # type: ignore[attr-defined]
    assert len(pools.pools) == 1000 and len(contexts) == 1
    assert took < 2.0


@contextmanager
def _https_participant(folder: Path, name: str = "IP:127.0.0.1") -> Iterator[tuple[str, Path]]:
    """A participant's ``/status`` over HTTPS on 127.0.0.1, its certificate self-signed for
    ``name`` (made with the ``openssl`` command); yields its URL and the certificate."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    assert OPENSSL is not None
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-days", "2", "-subj", "/CN=participant", "-addext", f"subjectAltName={name}"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(GOOD)))
            self.end_headers()
            self.wfile.write(GOOD)

        def log_message(self, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


OPENSSL = shutil.which("openssl")


@pytest.mark.skipif(OPENSSL is None, reason="no openssl command to make the test certificate with")
async def test_a_tls_failure_is_said_as_such_never_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A participant whose certificate is not trusted, or an ``https://`` URL of a plain HTTP
    server, answered the connection: they were 'unreachable' with 'check the URL and that it
    runs'. Each says what failed and its fix; with ``$SSL_CERT_FILE`` the certificate is read."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    app = FastAPI()

    @app.get(CONTROL_PREFIX + "/status")
    async def ok() -> Response:
        return Response(GOOD, media_type="application/json")

    with (
        _https_participant(tmp_path) as (secure, cert),
        _https_participant(tmp_path, "DNS:elsewhere.example") as (misnamed_url, other_cert),
    ):
        async with serving(app) as plain:
            urls = [secure, plain.replace("http://", "https://")]
            async with status_client(urls, headers={}, timeout=2) as client:
                untrusted, not_tls = await poll_all(client, urls, 2)
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            async with status_client(urls[:1], headers={}, timeout=2) as client:
                (trusted,) = await poll_all(client, urls[:1], 2)
            monkeypatch.setenv("SSL_CERT_FILE", str(other_cert))  # trusted, made for another name
            async with status_client([misnamed_url], headers={}, timeout=2) as client:
                (misnamed,) = await poll_all(client, [misnamed_url], 2)
    assert untrusted.failure == not_tls.failure == "tls"
    assert untrusted.error == (
        "TLS: its certificate is not trusted (self-signed certificate): set $SSL_CERT_FILE to its CA bundle"
    )
    assert not_tls.error is not None and not_tls.error.startswith(
        "TLS handshake failed (WRONG_VERSION_NUMBER"
    )
    assert not_tls.error.endswith(": the URL says https://, an http:// server?")
    assert trusted.error is None and trusted.status is not None
    assert misnamed.failure == "tls" and misnamed.error is not None
    assert misnamed.error.startswith("TLS: its certificate is not for this host (IP address mismatch")
    assert misnamed.error.endswith("): use a name it is for")
    assert once_status([untrusted, not_tls, trusted]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-events watch:")]
    assert len(lines) == 2 and not any("unreachable" in line or "that it runs" in line for line in lines)


async def test_a_round_finds_each_participants_pool_in_one_look_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx's ``mounts`` matched each request against every participant's mount in turn: a round
    of 1,000 participants was 500,500 matches, 0.5 s of CPU a second. Each poll is one look-up,
    and each reaches its own origin (here: refused, each with its own error)."""
    import httpx._utils

    matched = 0
    matches = httpx._utils.URLPattern.matches

    def counted(self: httpx._utils.URLPattern, other: httpx.URL) -> bool:
        nonlocal matched
        matched += 1
        return matches(self, other)

    monkeypatch.setattr(httpx._utils.URLPattern, "matches", counted)
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(200)]
    async with status_client(urls, headers={}, timeout=5) as client:
        results = await poll_all(client, urls, 5)
    assert [r.url for r in results] == urls
    assert all(r.error is not None and r.error.startswith("unreachable: ConnectError") for r in results)
    assert matched <= len(urls)  # was len(urls) * (len(urls) + 1) / 2


async def test_participants_behind_one_origin_get_a_pool_each() -> None:
    """64 participants behind one origin, told apart by a path, shared one pool: httpcore's scan
    of its connections made a round 0.39 s of CPU (0.03 s apart; 1.2 s at 256). Each has its own
    pool, holding its one connection, as the controller's client does."""
    app = FastAPI()

    @app.get("/m{index}" + CONTROL_PREFIX + "/status")
    async def one(index: int) -> Response:
        return Response(GOOD, media_type="application/json")

    async with serving(app) as base:
        urls = [f"{base}/m{i}/" for i in range(64)]
        async with status_client(urls, headers={}, timeout=5) as client:
            results = await poll_all(client, urls, 5)
            pools = client._transport
            assert isinstance(pools, MemberPools)
            held = [len(t._pool.connections) for t in pools.pools.values()]  # type: ignore[attr-defined]
    assert [r.error for r in results] == [None] * 64
    assert held == [1] * 64


async def test_an_idle_poll_connection_is_dropped_before_the_participants_keep_alive_ends() -> None:
    """watch's pools keep an idle connection ``KEEPALIVE_SECONDS`` (2 s), as the controller's,
    not httpx's 5 s, the participants' own keep-alive: polling every ~5 s, a poll went out on a
    connection its server was closing ("no whole reply: ReadError", 2 of 30 polls at 4.985 to
    5.0 s). Here a poll past ``KEEPALIVE_SECONDS`` of idleness takes a new connection."""
    ports: list[int] = []
    app = FastAPI()

    @app.get(CONTROL_PREFIX + "/status")
    async def status(request: Request) -> Response:
        assert request.client is not None
        ports.append(request.client.port)
        return Response(
            b'{"kind":"agent","instance":"agent-0","phase":"idle"}', media_type="application/json"
        )

    assert KEEPALIVE_SECONDS <= server_limits()["timeout_keep_alive"] / 2
    async with serving(app) as base, status_client([base], headers={}, timeout=5) as client:
        with anyio.fail_after(10):
            await poll_all(client, [base], 5)
            await poll_all(client, [base], 5)  # at once: the same connection
            await anyio.sleep(KEEPALIVE_SECONDS + 0.5)
            await poll_all(client, [base], 5)
    assert len(ports) == 3 and ports[0] == ports[1] != ports[2], ports
