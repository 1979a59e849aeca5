"""Running servers for tests and demos: ``serve`` processes, or uvicorn inside this process.

``ServerProcess`` starts ``python -m ckpt_events.participants.cli.main serve <kind>`` on 127.0.0.1; its
stdout and stderr go to files in ``log_dir`` (a pipe nobody reads could fill and stall
it), and one that exits before it listens raises ``LaunchError`` with its stderr's tail.
``serving(app)`` runs an ASGI app under a real uvicorn server in the current event loop,
on a socket bound to a free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

import anyio
import uvicorn

from ckpt_events.participants.errors import LaunchError, shown
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.ports import free_ports
from ckpt_events.participants.server.limits import log_shutdown_cuts_in_one_line, server_limits
from ckpt_events.participants.workloads.registry import KINDS, KindRegistry

__all__ = [
    "LaunchError",
    "ServerProcess",
    "free_port",
    "local_fleet",
    "process_fleet",
    "serving",
    "stop_processes",
    "write_token_file",
]

_POLL: Final = 0.05
#: ``process_fleet``'s deadline for all to listen: this, plus ``_LISTEN_PER_PROCESS_S`` for each.
#: They start at once, ~0.6 s of CPU each (measured): on 2 shared cores 17 took 25.6 s to
#: listen, and 65 (``demo --instances 16 --processes``) ~89 s, past a fixed 30 s. One that
#: exits still fails at once.
_LISTEN_BASE_S: Final = 30.0
_LISTEN_PER_PROCESS_S: Final = 2.0
#: How long an embedded server may take to stop (its lifespan closes the bus and sinks).
_STOP_TIMEOUT: Final = 5.0


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # The child imports this very checkout, however (or whether) it was installed.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    # Never the working directory on its path: a user's own sinks.py must not shadow ours.
    env["PYTHONSAFEPATH"] = "1"
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, below the ephemeral range (``participants.ports``)."""
    (port,) = free_ports(1, host)
    return port


def _bound_socket(host: str) -> socket.socket:
    """A TCP socket bound to a free port on ``host``, not listening (the server it is handed to
    listens once it has started)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (see serving()).
    # No SO_REUSEADDR: on Linux two sockets that both set it may bind one port while neither
    # listens, and until its server listens this one must be the port's only holder.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


class ServerProcess:
    """One ``python -m ckpt_events.participants.cli serve <kind>`` process."""

    def __init__(
        self,
        kind: str,
        *,
        instance: str,
        token_file: Path,
        log_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.instance = instance
        self.host = host
        # Without a port given, this process binds one for the server and hands it the socket
        # (--fd): a port chosen free and bound later by the server could be taken in between
        # (a worker process binding port 0 took a fleet's model port, and its 404s said "no
        # model participant"). Bound, not listening: connecting is refused until the server
        # listens, after its startup, as with --port.
        bound: socket.socket | None = None
        if port is None:
            bound = _bound_socket(host)
            port = int(bound.getsockname()[1])
        self.port: int = port
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = log_dir / f"{instance}.stderr"
        where = ["--port", str(self.port)] if bound is None else ["--fd", str(bound.fileno())]
        argv = [
            sys.executable,
            "-m",
            "ckpt_events.participants.cli",
            "serve",
            kind,
            "--instance",
            instance,
            "--host",
            host,
            *where,
            "--token-file",
            str(token_file),
            *extra_args,
        ]
        try:
            self._out: IO[bytes] = open(log_dir / f"{instance}.stdout", "ab")  # noqa: SIM115 - closed in wait()
            self._err: IO[bytes] = open(self.stderr_path, "ab")  # noqa: SIM115
            self.proc = subprocess.Popen(
                argv,
                stdout=self._out,
                stderr=self._err,
                stdin=subprocess.DEVNULL,
                env=_child_env(env),
                pass_fds=() if bound is None else (bound.fileno(),),
            )
        finally:
            if bound is not None:
                bound.close()  # the server holds its own copy; when it dies, so does the port

    def __repr__(self) -> str:
        return f"<ServerProcess {self.kind} {self.instance} {self.url} pid={self.proc.pid}>"

    def _stderr_tail(self, limit: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    async def wait_listening(self, timeout: float = 20.0) -> None:
        """Return once the port accepts connections (uvicorn binds after its lifespan startup)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LaunchError(f"{self!r} exited with {self.proc.returncode}: {self._stderr_tail()}")
            try:
                stream = await anyio.connect_tcp(self.host, self.port)
            except OSError:
                await anyio.sleep(_POLL)
                continue
            await stream.aclose()
            return
        raise LaunchError(f"{self!r} did not listen within {timeout} s: {self._stderr_tail()}")

    def kill(self) -> int:
        """SIGKILL (a crash: nothing is flushed or closed), then reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.wait(10.0)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM (uvicorn shuts down, the lifespan closes the bus), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                return self.kill()
        return self.wait(timeout)

    def send(self, sig: int) -> None:
        """Send ``sig`` if the process still runs; returns at once (``stop_processes`` waits)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.returncode is not None:
                self._out.close()
                self._err.close()


async def stop_processes(
    processes: Sequence[ServerProcess], *, kill: bool = False, timeout: float = 5.0
) -> None:
    """Stop every process at once: SIGTERM (``kill``: SIGKILL) to all, then wait for them
    together, never blocking the event loop; what still runs after ``timeout`` is killed.

    One after the other, ``terminate()`` blocked the loop for each in turn (a fleet of five
    under a Ctrl-C: seconds). Shielded: it runs in ``finally`` blocks of cancelled work."""
    with anyio.CancelScope(shield=True):
        for process in processes:
            process.send(signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p.proc.poll() is None for p in processes) and time.monotonic() < deadline:
            await anyio.sleep(_POLL / 5)
        for process in processes:
            process.kill()  # reaps; SIGKILL only to one that outlived the deadline


class _EmbeddedServer(uvicorn.Server):
    # Signals belong to the host process (pytest, a CLI), not to each embedded server.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _exit_when(stopping: anyio.Event, server: uvicorn.Server) -> None:
    await stopping.wait()
    server.should_exit = True


@contextlib.asynccontextmanager
async def serving(
    app: Any,
    *,
    host: str = "127.0.0.1",
    start_timeout: float = 10.0,
    stopping: anyio.Event | None = None,
    leaving: anyio.Event | None = None,
) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this event loop; yields its base URL, stops on exit.

    Setting ``stopping`` shuts the server down gracefully before that (requests in flight end);
    so does setting ``leaving``, which a fleet sets as its block is left, so that its servers
    stop together, not one after another (~0.2 s each).
    What the body raises comes out as raised, once the server has stopped (never wrapped in an
    ``ExceptionGroup``: a ``local_fleet`` of five nested it five deep)."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP,
    # and accepted sockets inherit the listener's. With proto 0 Nagle stayed on, and uvicorn's
    # separate header and body writes waited out the client's delayed ACK: 44 ms per request
    # (1.3 ms with it), which was most of the report's "transit" in the in-process demo.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    log_shutdown_cuts_in_one_line()
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,  # requests still running are cut after 2 s
        **server_limits(),
    )
    server = _EmbeddedServer(config)
    ended = anyio.Event()
    # The body's own error, re-raised once the task group is left: raised through it, it came out
    # wrapped in an ExceptionGroup, and a fleet of N servers nested it N deep.
    body_error: Exception | None = None

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            ended.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            for event in (stopping, leaving):
                if event is not None:
                    tg.start_soon(_exit_when, event, server)
            with anyio.move_on_after(start_timeout):
                while not server.started and not ended.is_set():
                    await anyio.sleep(0.01)
            if not server.started:
                server.should_exit = True
                raise LaunchError(f"uvicorn did not start {shown(app)} on {host}:{port}")
            try:
                yield f"http://{host}:{port}"
            except Exception as exc:
                body_error = exc
            finally:
                # Shut down before the task group would cancel the server: cancelled, uvicorn's
                # lifespan logs a traceback per app (five for a fleet, on every error or Ctrl-C).
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_TIMEOUT):
                    await ended.wait()
                tg.cancel_scope.cancel()  # the _exit_when watcher
    except BaseExceptionGroup as group:
        if body_error is None:
            raise
        # The server failed too: both said, neither as the other's cause.
        raise BaseExceptionGroup(
            f"the body and the server of {host}:{port} both failed", [body_error, *group.exceptions]
        ) from None
    finally:
        sock.close()
    if body_error is not None:
        raise body_error


@contextlib.asynccontextmanager
async def local_fleet(
    *,
    token: str,
    bus: Any = None,
    members: Sequence[tuple[str, str]] | None = None,
    kinds: KindRegistry = KINDS,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int = 1,
    checkpoint_root: Path | None = None,
    stopping: anyio.Event | None = None,
    worker_env: Callable[[str], Mapping[str, str]] | None = None,
    faults: FaultPlan = NO_FAULTS,
) -> AsyncIterator[dict[str, str]]:
    """Serve the inference worker and ``members`` (kind, instance) in this loop; yields instance -> URL.

    ``members`` defaults to one participant of each of ``kinds`` (default instance names), and
    each app runs its kind's row of ``kinds``.

    Every app shares ``bus`` (``None``: each app's lifespan makes its own). ``options`` maps an
    instance to extra ``create_app`` keyword arguments; ``checkpoint_root`` goes to every app.
    With ``workers`` > 1 each participant runs that many worker processes, with
    ``worker_env(instance)`` added to their environment. ``stopping`` stops them all gracefully.
    Every app injects ``faults`` (its worker processes are passed it in their environment).
    """
    from ckpt_events.participants import create_app, create_inference_app

    urls: dict[str, str] = {}
    # Set as the block is left: every server starts its shutdown then. Stopped one by one, each
    # waiting for uvicorn's 0.1 s tick and its lifespan, 33 servers (--instances 8) took 6 s.
    leaving = anyio.Event()
    async with contextlib.AsyncExitStack() as stack:
        inference_url = await stack.enter_async_context(
            serving(create_inference_app(token=token), stopping=stopping, leaving=leaving)
        )
        for kind, instance in kinds.members() if members is None else members:
            extra = dict((options or {}).get(instance, {}))
            if kinds[kind].uses_inference:
                extra.setdefault("inference_url", inference_url)
                extra.setdefault("inference_token", token)
            if workers > 1:
                from ckpt_events.participants.cli.worker_process import worker_command

                # The worker processes build the workload alone: the app's own arguments (the lease
                # grace, ...) stay here, its workload options (and the inference worker) go there.
                command = worker_command(kind, instance, workload_options(extra))
                command.env.update(worker_env(instance) if worker_env is not None else {})
                command.env.update(faults.environ())  # a worker process reads it at start-up
                extra.update(workers=workers, worker_command=command)
            if checkpoint_root is not None:
                extra.setdefault("checkpoint_root", checkpoint_root)
            app = create_app(
                kind, instance=instance, token=token, bus=bus, kinds=kinds, faults=faults, **extra
            )
            urls[instance] = await stack.enter_async_context(serving(app, stopping=stopping, leaving=leaving))
        try:
            yield urls
        finally:
            leaving.set()


def workload_options(app_options: Mapping[str, Any]) -> dict[str, Any]:
    """What of ``create_app`` keyword arguments a kind's workload takes: all but the app's own
    parameters, less the two it hands the workload (``inference_url``, ``inference_token``)."""
    import inspect

    from ckpt_events.participants import create_app

    own = set(inspect.signature(create_app).parameters) - {"inference_url", "inference_token"}
    return {k: v for k, v in app_options.items() if k not in own}


async def process_fleet(
    *,
    token_file: Path,
    log_dir: Path,
    members: Sequence[tuple[str, str]],
    env: Callable[[str], Mapping[str, str]] = lambda instance: {},
    listen_timeout: float | None = None,
    extra_args: Sequence[str] | Callable[[str], Sequence[str]] = (),
    checkpoint_root: Path | None = None,
) -> list[ServerProcess]:
    """Start the inference worker, then ``members`` (kind, instance), as ``serve`` processes.

    Returns them inference worker first, once every one listens (within ``listen_timeout``, by
    default 30 s plus 2 s per process: they compete for the cores); ``env(instance)`` adds to
    each process's environment, ``extra_args`` (or ``extra_args(instance)``) to each
    participant's command line (e.g. ``--workers 2``). If any fails to come up, or the start
    is cancelled, all are stopped (``stop_processes``: their workers with them) and it raises.
    """
    # Each server's port is bound here and handed to it (ServerProcess): no two servers of the
    # fleet, nor a worker process binding port 0, can be given the same one.
    fleet: list[ServerProcess] = []
    try:
        inference = ServerProcess(
            "inference",
            instance="inference-0",
            token_file=token_file,
            log_dir=log_dir,
            env=env("inference-0"),
        )
        fleet.append(inference)
        for kind, instance in members:
            own = extra_args(instance) if callable(extra_args) else extra_args
            extra = [*(["--inference-url", inference.url] if KINDS[kind].uses_inference else []), *own]
            if checkpoint_root is not None:
                extra += ["--checkpoint-root", str(checkpoint_root)]
            fleet.append(
                ServerProcess(
                    kind,
                    instance=instance,
                    token_file=token_file,
                    log_dir=log_dir,
                    env=env(instance),
                    extra_args=extra,
                )
            )
        deadline = (
            listen_timeout
            if listen_timeout is not None
            else _LISTEN_BASE_S + _LISTEN_PER_PROCESS_S * len(fleet)
        )
        async with anyio.create_task_group() as tg:
            for process in fleet:
                tg.start_soon(process.wait_listening, deadline)
    except BaseException:
        # SIGTERM, not SIGKILL: a server already running its worker processes (each in a
        # session of its own) stops them on the way out; killed, it left them serving on for
        # ~2 s (11 processes after a Ctrl-C in the first second of `demo --processes --workers 2`).
        # One still importing dies of the SIGTERM at once; one that lingers is killed.
        await stop_processes(fleet)
        raise
    return fleet
