"""The in-process fleet's servers answer without Nagle: their accepted sockets have TCP_NODELAY.

Without it, uvicorn's separate header and body writes waited for the client's delayed ACK:
44 ms per request on loopback, most of what the demo's report called transit.
"""

from __future__ import annotations

import http.client
import os
import socket
import sys
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI

from ckpt_events.participants.cli.fleet import serving

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def _inode_of(local_port: int, remote_port: int) -> str:
    """The socket inode of the loopback TCP connection ``local_port`` -> ``remote_port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            return inode
    raise LookupError(f"no connection {local_port} -> {remote_port}")


def _fd_of(inode: str) -> int:
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == f"socket:[{inode}]":
                return int(name)
        except OSError:
            continue
    raise LookupError(f"socket {inode} is not ours")


async def test_accepted_sockets_have_tcp_nodelay() -> None:
    """The server side of a connection to an embedded server has TCP_NODELAY set."""
    app = FastAPI()

    @app.get("/x")
    async def x() -> dict[str, int]:
        return {"ok": 1}

    async with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])

        def request_and_inspect() -> int:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", "/x")
                conn.getresponse().read()
                client_port = conn.sock.getsockname()[1]
                fd = _fd_of(_inode_of(port, client_port))
                with socket.socket(fileno=os.dup(fd)) as server_side:
                    return server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            finally:
                conn.close()

        assert await anyio.to_thread.run_sync(request_and_inspect) != 0


def test_worker_processes_get_the_workload_options_and_never_the_apps_own() -> None:
    """The lease grace (an app argument) once reached the worker processes' workload and every
    worker of `demo --workers 2 --fault ...` died at start ("unknown environment workload
    options: lease_grace_seconds")."""
    from ckpt_events.participants.cli.fleet import workload_options

    given = {
        "lease_grace_seconds": 1.5,
        "checkpoint_root": "/tmp",
        "step_seconds": 0.0,
        "inference_url": "http://127.0.0.1:1",
        "inference_token": "t",
    }
    assert workload_options(given) == {
        "step_seconds": 0.0,
        "inference_url": "http://127.0.0.1:1",
        "inference_token": "t",
    }
