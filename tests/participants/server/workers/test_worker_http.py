"""``participants.server.workers.worker_http``: a worker's own port for its sessions' work calls."""

from __future__ import annotations

import errno
import socket
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.loop_lag import LoopLagMonitor
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.workers.worker_http import WorkerHttp
from ckpt_events.participants.workloads.base import Workload
from tests.participants.helpers import AUTH, TOKEN

pytestmark = pytest.mark.anyio


def _workload(bus: Bus) -> Workload[Any, Any]:
    tel = Telemetry(bus, kind="environment", instance="environment-0", worker=2)
    return make_workload("environment", tel, step_seconds=0.0)


async def test_the_port_is_bound_and_listening_before_it_serves() -> None:
    """The URL names a port that already accepts connections, on the loopback by default."""
    async with Bus() as bus:
        workload = _workload(bus)
        http = WorkerHttp(workload, 2, token=TOKEN)
        try:
            port = http.socket.getsockname()[1]
            assert http.url == f"http://127.0.0.1:{port}" and port > 0
            assert isinstance(http.monitor, LoopLagMonitor)
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass
        finally:
            http.socket.close()
            await workload.aclose()


async def test_its_app_serves_advance_and_get_with_the_token_but_never_start() -> None:
    """The work routes of the sessions this worker holds; ``/work/start`` belongs to the main port."""
    async with Bus() as bus:
        workload = _workload(bus)
        http = WorkerHttp(workload, 2, token=TOKEN)
        http.socket.close()
        workload.start(EpisodeId("r1"), 2)
        app = http.server.config.app
        assert isinstance(app, FastAPI)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=AUTH) as client:
            view = (await client.get("/work/r1")).json()
            assert (view["boundary"], view["worker"]) == (0, 2)
            advanced = await client.post("/work/advance", json={"rollout_id": "r1", "attempt": 0})
            assert advanced.status_code == 200 and advanced.json()["boundary"] == 1
            started = await client.post("/work/start", json={"rollout_id": "r2", "attempt": 0, "steps": 1})
            assert started.status_code in (404, 405)
            refused = await client.get("/work/r1", headers={"authorization": "Bearer wrong"})
            assert refused.status_code == 401
        await workload.aclose()


async def test_it_serves_over_real_tcp_until_stopped_then_closes_its_socket() -> None:
    """``serve`` answers on the announced URL; ``stop`` ends it and the socket is closed."""
    async with Bus() as bus:
        workload = _workload(bus)
        workload.start(EpisodeId("r1"), 2)
        http = WorkerHttp(workload, 2, token=TOKEN)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(http.serve)
                async with httpx.AsyncClient(base_url=http.url, headers=AUTH) as client:
                    reply = await client.get("/work/r1")
                assert reply.status_code == 200 and reply.json()["capture_key"] == "r1"
                http.stop()
        assert http.socket.fileno() == -1
        await workload.aclose()


async def test_an_ipv6_host_is_bracketed_and_a_foreign_address_is_an_error() -> None:
    """``::1`` gives ``http://[::1]:port``; an address this machine lacks raises and leaks nothing."""
    async with Bus() as bus:
        workload = _workload(bus)
        if socket.has_ipv6:
            try:
                http = WorkerHttp(workload, 0, token=TOKEN, host="::1")
            except OSError:
                pass  # no IPv6 loopback here
            else:
                port = http.socket.getsockname()[1]
                http.socket.close()
                assert (http.url, http.socket.family) == (f"http://[::1]:{port}", socket.AF_INET6)
        with pytest.raises(OSError) as info:
            WorkerHttp(workload, 0, token=TOKEN, host="192.0.2.1")
        assert info.value.errno == errno.EADDRNOTAVAIL
        await workload.aclose()
