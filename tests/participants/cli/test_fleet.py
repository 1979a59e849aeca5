"""The fleets: the in-process one answers without Nagle (TCP_NODELAY on accepted sockets); a
process fleet whose start is cancelled leaves no process behind.

Without TCP_NODELAY, uvicorn's separate header and body writes waited for the client's delayed ACK:
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

from ckpt_events.participants.cli.fleet import (
    ServerProcess,
    local_fleet,
    process_fleet,
    serving,
    stop_processes,
    write_token_file,
)

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


async def test_an_error_in_a_fleets_body_comes_out_as_itself() -> None:
    """What the code inside ``local_fleet`` raises comes out as raised, the servers stopped: each
    ``serving`` re-raised it wrapped in an ExceptionGroup, and a fleet of five nested it five deep
    (two fleets in one test: deeper than the traceback shows, "max_group_depth is 10", the cause
    cut off)."""
    with pytest.raises(LookupError, match="^the body's own$") as info:
        async with local_fleet(token="t") as urls:
            assert len(urls) >= 2
            raise LookupError("the body's own")
    assert type(info.value) is LookupError and info.value.__context__ is None


class _Shutdowns:
    """Each participant's sinks, closed in its lifespan's shutdown: a closing one records how many
    had begun their shutdown, waiting (at most ``patience`` s) for all ``expected`` to begin."""

    def __init__(self, expected: int, patience: float) -> None:
        self.expected, self.patience = expected, patience
        self.begun = 0
        self.all_begun = anyio.Event()
        self.seen: list[int] = []

    def configure(self, bus: object) -> _Shutdowns:
        return self

    async def aclose(self) -> None:
        self.begun += 1
        if self.begun == self.expected:
            self.all_begun.set()
        with anyio.move_on_after(self.patience):
            await self.all_begun.wait()
        self.seen.append(self.begun)


async def test_a_fleets_servers_stop_together_not_one_after_another() -> None:
    """Leaving ``local_fleet`` starts every server's shutdown at once: they were stopped one by
    one, ~0.2 s each (uvicorn's 0.1 s tick, then its lifespan), and 33 servers took 6 s to stop
    (0.2 s now); each participant's lifespan saw only itself shutting down."""
    members = (("environment", "environment-0"), ("environment", "environment-1"), ("model", "model-0"))
    shutdowns = _Shutdowns(len(members), patience=1.0)
    options = {instance: {"configure_sinks": shutdowns.configure} for _, instance in members}
    async with local_fleet(token="t", members=members, options=options) as urls:
        assert len(urls) == len(members)
    assert shutdowns.seen == [len(members)] * len(members)


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


def _marked(mark: str) -> dict[int, bool]:
    """The live processes whose environment holds ``CKPT_TEST_FLEET_MARK=mark``: pid -> is a worker."""
    found: dict[int, bool] = {}
    needle = f"CKPT_TEST_FLEET_MARK={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ and state != "Z":
            found[int(name)] = any(v.startswith(b"CKPT_EVENTS_WORKER_INDEX=") for v in environ)
    return found


async def test_a_fleet_start_cancelled_while_workers_start_leaves_no_process(tmp_path: Path) -> None:
    """A Ctrl-C while ``serve --workers 2`` waits for its workers: the fleet's start stops every
    server and, through them, every worker. SIGKILLed servers left their workers (each in a
    session of its own) running ~2 s after the demo had exited."""
    mark = os.urandom(8).hex()
    started: list[ServerProcess] = []

    async def start() -> None:
        started.extend(
            await process_fleet(
                token_file=write_token_file(tmp_path / "token", "fleet-token"),
                log_dir=tmp_path / "logs",
                members=[("environment", "environment-0")],
                env=lambda instance: {"CKPT_TEST_FLEET_MARK": mark},
                extra_args=["--workers", "2"],
                checkpoint_root=tmp_path,
            )
        )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(start)
            with anyio.fail_after(60):
                while not any(_marked(mark).values()):  # a worker process has been started
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert not started, "the fleet listened before its start was cancelled: nothing was tested"
        left = _marked(mark)
        assert not left, f"still running after the cancelled start: {left} (pid: is a worker)"
    finally:
        await stop_processes(started, kill=True)
