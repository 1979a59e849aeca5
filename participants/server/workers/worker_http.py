"""A worker's own HTTP port: the work routes served by the worker that owns the sessions.

Why a port per worker: the main process forwarding every work call costs it more CPU per call
(parse, frame, decode, re-encode) than a single-process server spends serving the call, so
forwarding alone can never add capacity. With its own port a worker serves its sessions'
``POST /work/advance`` and ``GET /work/{key}`` itself and the main process does nothing per
call. Sessions are still placed by the main port's ``/work/start`` (once per session), which
checks admission and the fence of the whole server, so no worker needs every other worker's
retired marks. The URL is announced in the worker's ``hello`` and given to clients in every
forwarded work reply (``worker_url``) and in ``GET /status``; the main port still forwards,
for clients that do not route.

The port is bound before ``hello`` (port 0: any free one, on the server's host), so the
URL announced is one that already accepts connections.
"""

from __future__ import annotations

import socket
from typing import Any, Final

import uvicorn

from ckpt_events.checks import library_logger
from ckpt_events.participants.loop_lag import LoopLagMonitor
from ckpt_events.participants.server.builder import build_work_app
from ckpt_events.participants.server.connection_guard import ConnectionLimits
from ckpt_events.participants.server.interrupts import cut_in_flight, once_per_interrupt
from ckpt_events.participants.server.limits import DEFAULT_MAX_BODY_BYTES, server_limits
from ckpt_events.participants.server.routes import work_router
from ckpt_events.participants.server.work import LocalWork
from ckpt_events.participants.workloads.base import Workload

__all__ = ["ENV_WORKER_HEADER_TIMEOUT", "ENV_WORKER_HOST", "ENV_WORKER_TOKEN", "WorkerHttp"]

#: The host a worker process binds its own port on (the server's ``--host``; loopback if unset).
ENV_WORKER_HOST: Final = "CKPT_EVENTS_WORKER_HOST"
#: The server's token, which a worker process's own port takes (never on a command line).
ENV_WORKER_TOKEN: Final = "CKPT_EVENTS_WORKER_TOKEN"
#: ``serve --header-timeout``, which a worker process's own port keeps too.
ENV_WORKER_HEADER_TIMEOUT: Final = "CKPT_EVENTS_WORKER_HEADER_TIMEOUT"
_DEFAULT_HOST: Final = "127.0.0.1"

log = library_logger("ckpt_events.workers")


class WorkerHttp:
    """Worker ``index``'s HTTP server for ``workload``'s work routes, on a port bound now."""

    def __init__(
        self,
        workload: Workload[Any, Any],
        index: int,
        *,
        token: str,
        host: str = _DEFAULT_HOST,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        connections: ConnectionLimits | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and without it
        # a reply written as head then body waits out the client's delayed ACK (about 40 ms).
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, 0))
            self.socket.listen(1024)
        except OSError:
            self.socket.close()
            raise
        port = self.socket.getsockname()[1]
        self.url = f"http://[{host}]:{port}" if family == socket.AF_INET6 else f"http://{host}:{port}"
        app = build_work_app(
            title=f"ckpt-events {workload.kind} worker {index} of {workload.tel.instance}",
            tel=workload.tel,
            work_router=work_router(LocalWork(workload, worker=index), token, start=False),
            max_body_bytes=max_body_bytes,
        )
        monitor = app.state.monitor
        assert isinstance(monitor, LoopLagMonitor)
        self.monitor = monitor
        limits = server_limits(connections)
        config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning", **limits)
        # A SIGINT delivered twice at once (to a worker's group) is one stop, as in ``serve``.
        self.server = once_per_interrupt(uvicorn.Server)(config)

    async def serve(self) -> None:
        """Serve until ``stop()`` (the worker's coordinator socket ended) or a signal."""
        try:
            await self.server.serve(sockets=[self.socket])
        finally:
            self.socket.close()

    def stop(self) -> None:
        self.server.should_exit = True

    def cut(self) -> list[str]:
        """Stop taking requests and cut those still served (the server is stopping): each one
        cut, ``"METHOD /path"`` (``""`` for one not known)."""
        return cut_in_flight(self.server)
