"""What ``ckpt-events serve`` checks before it starts, each refusal one line (cause and fix):
the workers' Prometheus ports and logs, the address to listen on or the socket inherited, the
logs' exclusive ``flock`` claims (held while the server runs), and the free file descriptors
(the soft ``ulimit -n`` raised to what the connections need).

The sinks' settings are checked by ``serve`` itself, by building them (``_check_settings``).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import resource
import socket
import stat
from typing import Any, Final

from ckpt_events import ConfigurationError
from ckpt_events.participants.cli.command import CommandError
from ckpt_events.participants.cli.text import say
from ckpt_events.participants.errors import shown

__all__ = [
    "ENV_JSONL",
    "check_descriptors",
    "check_listen",
    "check_workers_can_start",
    "claim_logs",
    "inherited_socket",
    "raise_descriptor_limit",
]

#: ``sinks.ENV_JSONL``, spelled here so ``--help`` imports no sinks.
ENV_JSONL: Final = "CKPT_EVENTS_JSONL"


def check_workers_can_start(workers: int) -> None:
    """Each worker's Prometheus port and JSON-lines log, checked before the app is built: a
    refusal needs no server stack imported (with it, 0.75 s of CPU; 11 s on a loaded machine
    before the one line). A bad OTel variable is left to ``serve``'s ``_check_settings`` to say."""
    from ckpt_events import sinks

    try:
        settings = sinks.read_otel_env(os.environ)
    except ConfigurationError:
        settings = None
    if settings is not None:
        _check_worker_metrics_ports(settings, workers)
    _check_worker_logs(workers)


def _check_worker_metrics_ports(settings: Any, workers: int) -> None:
    """Each worker's Prometheus port (base + 1 + index) is free now, else one line: which, why,
    and what to do. A worker that cannot bind its port would die at start, be restarted and die
    again until the restart budget is spent (6 exits in 32 s, the main port never served)."""
    base = settings.prometheus_port
    if workers < 2 or "prometheus" not in settings.metrics or settings.sdk_disabled or base == 0:
        return
    from ckpt_events.participants.cli.worker_process import port_taken, worker_metrics_port

    for index in range(workers):
        port = worker_metrics_port(base, index)
        why = port_taken(settings.prometheus_host, port)
        if why is not None:
            raise CommandError(
                f"worker {index}'s Prometheus port {port} on {settings.prometheus_host} "
                f"(OTEL_EXPORTER_PROMETHEUS_PORT {base} + 1 + {index}) is taken ({why}): free it, or "
                f"set OTEL_EXPORTER_PROMETHEUS_PORT to a port whose next {workers} are free too "
                "(0: any free port for every process)"
            )


def _check_worker_logs(workers: int) -> None:
    """Each worker's JSON-lines log (``$CKPT_EVENTS_JSONL.w<index>``) can be opened for appending
    now (created if need be, as the worker's sink does), else one line: which, why, and what to
    do. A worker that cannot open its log dies at each start, and the restart budget is spent
    (6 exits in 30 s, the main port never served)."""
    base = os.environ.get(ENV_JSONL, "").strip()
    if workers < 2 or not base:
        return
    for index in range(workers):
        path = f"{base}.w{index}"
        try:
            # O_NONBLOCK: a FIFO there must not block the start.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CommandError(
                f"worker {index}'s log {shown(path)} (${ENV_JSONL} + .w{index}) cannot be opened "
                f"for appending "
                f"({exc.strerror or exc}): make it a file this user can write, or point ${ENV_JSONL} "
                "elsewhere"
            ) from None
        os.close(fd)


def check_listen(host: str, port: int) -> None:
    """``CommandError`` now, in one line with what to do, if ``host:port`` cannot be listened on
    (bound as uvicorn binds: ``SO_REUSEADDR``); uvicorn's own "ERROR: [Errno 98] ..." came only
    after the app was built and the sinks checked, with exit 3."""
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise CommandError(
            f"--host {host}: not an address of this machine ({exc.strerror}): pass one, e.g. 127.0.0.1"
        ) from None
    family, _, _, _, sockaddr = address
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
            probe.listen(1)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                fix = "another process listens there: stop it, or pick another --port (0: any free port)"
            elif exc.errno == errno.EADDRNOTAVAIL:
                fix = "--host must be an address of this machine, e.g. 127.0.0.1"
            elif exc.errno == errno.EACCES:
                fix = "ports below 1024 need privileges: pick --port 1024 or above (0: any free port)"
            else:
                fix = "pick another --host or --port"
            raise CommandError(f"cannot listen on {host}:{port} ({why}): {fix}") from None


def claim_logs(workers: int) -> list[int]:
    """Hold an exclusive ``flock`` on the ``$CKPT_EVENTS_JSONL`` log, and on each worker's
    (``.w<index>``) with ``--workers``, while this server runs (the descriptors returned; none
    without a log, or for one the sinks' own check will refuse).

    A server starting on a log closes, as truncated, the work its predecessor left open in it
    (``serve``'s ``_close_predecessors_work``; a worker on its own log likewise): a second server on a log a
    live one writes closed that one's open work (a prepare still waiting), and the log said it
    had been killed. A lock held by the writer, released by the kernel however it ends (SIGKILL
    too), tells the two cases apart. The workers' logs are held here, by the process that
    outlives their restarts: unheld, a server given ``log.w1`` as its own log wrote into the file
    a live server's worker 1 writes."""
    base = os.environ.get(ENV_JSONL, "").strip()
    if not base:
        return []
    # Each log, and what a refusal says before and after the holder's pid.
    logs = [(base, f"${ENV_JSONL} {shown(base)}: another running server", " writes this log")]
    if workers > 1:
        logs += [
            (
                f"{base}.w{index}",
                f"worker {index}'s log {shown(f'{base}.w{index}')} (${ENV_JSONL} + .w{index}): "
                "another running server",
                " writes it",
            )
            for index in range(workers)
        ]
    held: list[int] = []
    try:
        for path, before, after in logs:
            fd = _claim_log(path, before, after)
            if fd is not None:
                held.append(fd)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def _claim_log(path: str, before: str, after: str) -> int | None:
    """The descriptor of ``path`` with this process's exclusive ``flock`` on it; ``CommandError``
    (``before``, the holder's pid where the system says it, ``after``) if another process holds one."""
    try:
        # O_NONBLOCK: a FIFO there must not block the start (the sink says what it is).
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError:
        return None  # a folder, a missing folder: refused in one line by the sinks' check
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        # A named pipe: held open here, this server was its reader, so the sink's open found
        # one, and its lines went into a pipe nobody read (the server froze once it was full).
        os.close(fd)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _flock_holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None  # a file system without locks: served unguarded, as before
        pid = "" if holder is None else f" (pid {holder})"
        raise CommandError(f"{before}{pid}{after}: give each server a log of its own") from None
    return fd


#: Lines of ``/proc/locks`` read at most (one per lock held on the machine).
_MAX_LOCK_LINES: Final = 100_000


def _flock_holder(fd: int) -> int | None:
    """The pid holding a ``flock`` on ``fd``'s file, from Linux's ``/proc/locks``; ``None``
    where that is not to be read (another system) or names none."""
    try:
        info = os.fstat(fd)
        wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in itertools.islice(locks, _MAX_LOCK_LINES):
                # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == wanted:
                    return int(fields[4])
    except (OSError, ValueError):
        return None
    return None


def inherited_socket(fd: int) -> socket.socket:
    """The TCP socket this process inherited as ``fd`` (``CommandError`` if it is not one)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise CommandError(
            f"--fd {fd} is not a socket this process inherited ({exc.strerror or exc}): pass one, "
            "or bind with --port"
        ) from None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()  # not ours to close
        raise CommandError(f"--fd {fd} is not a TCP socket: pass a bound TCP socket, or bind with --port")
    return sock


#: Descriptors that must be free when uvicorn starts: its event loop takes a few (uvloop's
#: own, the signal socketpair; it started at ``ulimit -n`` 14 here, not 12), each connection one.
_SPARE_DESCRIPTORS: Final = 16


def check_descriptors() -> None:
    """Refuse to start, in one line, when fewer than ``_SPARE_DESCRIPTORS`` descriptors are free:
    under a low ``ulimit -n`` the event loop's own start failed, a traceback of three chained
    exceptions (EMFILE, then "Cannot close a running event loop") and asyncio's warnings."""
    opened: list[int] = []
    try:
        for _ in range(_SPARE_DESCRIPTORS):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise CommandError(
            f"only {len(opened)} file descriptors free (the limit is {soft}), {_SPARE_DESCRIPTORS} "
            "needed to start serving and one more per connection: raise it (ulimit -n 1024)"
        ) from None
    finally:
        for fd in opened:
            os.close(fd)


#: Descriptors beyond one per connection: the app's own files and sockets (logs, a collector,
#: workers' channels), the event loop's.
_DESCRIPTOR_HEADROOM: Final = 64


def raise_descriptor_limit(connections: int) -> None:
    """Raise the soft ``ulimit -n`` (up to the hard one) to what ``connections`` need, and say
    in one line when even the hard limit is short: out of descriptors, uvloop (libuv) accepts
    and resets each new connection without a word, so under ``ulimit -n`` 64 a client past ~55
    connections held open was reset and nothing in the server's log said why."""
    need = connections + _DESCRIPTOR_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        say(
            f"ckpt-events serve: warning: the open-file limit is {target}, under the {need} that "
            f"{connections} connections need: past that, new connections are reset without a "
            f"word; raise it (ulimit -n {need})",
        )
