"""Issue 29's connection attacks, kept as tests against real ``serve`` processes: 520 idle TCP
connections on the main port and on a worker's port, and slowloris peers on the scrape endpoint.
Control calls, work calls and scrapes must keep answering, and the idle sockets must be closed."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, free_port, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.server.connection_guard import ConnectionLimits

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "attack-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
#: The attack's size: past uvicorn's old ``limit_concurrency`` of 512.
IDLE = 520
#: ``serve --header-timeout`` here (5 s by default); the idle sockets must be gone soon after it.
HEADER_TIMEOUT = 1.0
#: ``ConnectionLimits.displace_after``: before it, a connection past the caps is answered 503.
DISPLACE_AFTER = ConnectionLimits().displace_after


@contextlib.asynccontextmanager
async def _idle(url: str, count: int) -> AsyncIterator[list[anyio.abc.SocketStream]]:
    """``count`` connections to ``url`` that never send a byte; closed on exit."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    streams: list[anyio.abc.SocketStream] = []
    try:
        for _ in range(count):
            streams.append(await anyio.connect_tcp(host.strip("[]"), int(port)))
        yield streams
    finally:
        for stream in streams:
            await stream.aclose()


async def _seconds_until_all_closed(streams: list[anyio.abc.SocketStream], limit: float) -> float:
    """Seconds (from now) until the server has closed every stream; fails after ``limit``."""
    started = time.monotonic()
    with anyio.fail_after(limit):
        for stream in streams:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    await stream.receive()
    return time.monotonic() - started


async def _statuses(client: httpx.AsyncClient, path: str, count: int, **options: object) -> list[int]:
    codes = []
    for _ in range(count):
        codes.append((await client.get(path, headers=AUTH, **options)).status_code)  # type: ignore[arg-type]
        await anyio.sleep(0.05)
    return codes


def _server(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        extra_args=["--checkpoint-root", str(tmp_path), "--header-timeout", str(HEADER_TIMEOUT), *extra],
        env=env,
    )


async def test_idle_connections_leave_the_control_plane_answering(tmp_path: Path) -> None:
    """520 idle connections without a token: every ``/status`` meanwhile answers 200 (before:
    503 for as long as they stayed), and all 520 are closed within the header timeout (before:
    still open after 100 s)."""
    server = _server(tmp_path)
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
            async with _idle(server.url, IDLE) as idle:
                opened = time.monotonic()
                await anyio.sleep(DISPLACE_AFTER)  # a connection younger than that is not displaced
                codes = await _statuses(client, f"{CONTROL_PREFIX}/status", 10)
                closed_after = await _seconds_until_all_closed(idle, 10) + time.monotonic() - opened
            assert codes == [200] * 10
            assert closed_after < HEADER_TIMEOUT + 3
            # and the server is whole afterwards
            assert (await client.get(f"{CONTROL_PREFIX}/status", headers=AUTH)).status_code == 200
    finally:
        server.terminate()


async def test_idle_connections_leave_a_worker_port_answering(tmp_path: Path) -> None:
    """``--workers 2``: 520 idle connections on worker 0's own port; work calls there keep
    answering 200 and the idle sockets are closed by the worker's header timeout too."""
    server = _server(tmp_path, "--workers", "2")
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            worker_url = None
            with anyio.fail_after(20):
                for i in range(64):  # sessions land on both workers; find one on a worker port
                    body = {"rollout_id": f"r{i}", "steps": 3}
                    reply = await client.post("/work/start", json=body, headers=AUTH)
                    assert reply.status_code == 200, reply.text
                    worker_url, key = reply.json()["worker_url"], reply.json()["capture_key"]
                    if worker_url is not None:
                        break
            assert worker_url is not None
            async with _idle(worker_url, IDLE) as idle:
                opened = time.monotonic()
                await anyio.sleep(DISPLACE_AFTER)  # a connection younger than that is not displaced
                codes = await _statuses(client, f"{worker_url}/work/{key}", 10)
                closed_after = await _seconds_until_all_closed(idle, 10) + time.monotonic() - opened
            assert codes == [200] * 10
            assert closed_after < HEADER_TIMEOUT + 3
    finally:
        server.terminate()


async def test_slowloris_peers_leave_the_scrape_endpoint_answering(tmp_path: Path) -> None:
    """8 connections (as many as the scrape slots) trickling a head: every scrape meanwhile
    answers 200 (before: 30 of 30 got 503), and the tricklers are closed at the header timeout."""
    port = free_port()
    env = {
        **os.environ,
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
    }
    server = _server(tmp_path, env=env)
    try:
        await server.wait_listening(30)
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 50
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        try:
            async with httpx.AsyncClient(timeout=5) as client, anyio.create_task_group() as tg:

                async def drip() -> None:
                    for i in range(len(head)):
                        for sock in slow:
                            with contextlib.suppress(OSError):
                                sock.send(head[i : i + 1])
                        await anyio.sleep(0.3)

                tg.start_soon(drip)
                codes = []
                for _ in range(20):  # over 3 s: past the scrape endpoint's 2 s header timeout
                    codes.append((await client.get(f"http://127.0.0.1:{port}/metrics")).status_code)
                    await anyio.sleep(0.15)
                tg.cancel_scope.cancel()
            assert codes == [200] * 20
            for sock in slow:
                sock.settimeout(5)
                assert sock.recv(1024).startswith(b"HTTP/1.1 408 ")
        finally:
            for sock in slow:
                sock.close()
    finally:
        server.terminate()
