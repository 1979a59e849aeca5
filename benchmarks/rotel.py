"""Start the ``rotel-agent`` OTLP collector (from the ``rotel`` package) on loopback, for benchmarks.

``collector()`` yields the OTLP/HTTP base URL of an agent with a blackhole exporter (it
receives, decodes and discards), or ``None`` when the binary is not installed
(``why_missing()`` says why, and how to get it, for a row that is skipped).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from ckpt_events.participants import ports

from .load import listening, spawn, stop_process

__all__ = [
    "ENV_BINARY",
    "HOW",
    "CollectorError",
    "agent_binary",
    "agent_command",
    "agent_env",
    "collector",
    "free_port",
    "free_ports",
    "why_missing",
]

#: A ``rotel-agent`` executable to use instead of the ``rotel`` package's.
ENV_BINARY: Final = "CKPT_EVENTS_BENCH_ROTEL"
#: How to get the collector (it ships in the ``rotel`` package, part of the ``[dev]`` extra).
HOW: Final = "pip install rotel, or 'ckpt-events[dev]'"


class CollectorError(RuntimeError):
    """The ``rotel-agent`` found did not run (it cannot be executed, exits at start, or never
    listens): the message says how and what to check, in one line."""


def agent_binary(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``rotel-agent`` executable: ``$CKPT_EVENTS_BENCH_ROTEL`` when set (``None`` if that is
    no file), else the one shipped in the ``rotel`` package, if installed."""
    chosen = (os.environ if environ is None else environ).get(ENV_BINARY)
    if chosen:
        return Path(chosen) if Path(chosen).is_file() else None
    spec = importlib.util.find_spec("rotel")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "rotel-agent"
        if candidate.is_file():
            return candidate
    return None


def why_missing(environ: Mapping[str, str] | None = None) -> str:
    """Why ``agent_binary()`` found none and how to get one: a skipped row's text."""
    chosen = (os.environ if environ is None else environ).get(ENV_BINARY)
    if chosen:
        return f"skipped: ${ENV_BINARY}={chosen} is not a file ({HOW})"
    return f"skipped: the rotel OTLP collector is not installed ({HOW})"


def agent_command(
    binary: Path, http_port: int, grpc_port: int, workdir: Path, *, debug: bool = False
) -> list[str]:
    """``rotel-agent start`` on loopback with a blackhole exporter, its pid and log in ``workdir``;
    ``debug`` prints every span and metric point it receives on stdout (detailed)."""
    command = [
        str(binary),
        "start",
        "--otlp-http-endpoint",
        f"127.0.0.1:{http_port}",
        "--otlp-grpc-endpoint",
        f"127.0.0.1:{grpc_port}",
        "--exporter",
        "blackhole",
        "--pid-file",
        str(workdir / "rotel.pid"),
        "--log-file",
        str(workdir / "rotel.log"),
    ]
    if debug:
        command += ["--debug-log", "traces", "--debug-log", "metrics", "--debug-log-verbosity", "detailed"]
    return command


def agent_env() -> dict[str, str]:
    """The environment for rotel-agent: the interpreter's library directory on the loader path.

    rotel-agent links libpython; a CPython built as a shared library outside the loader's
    search path (``libpython3.13.so.1.0`` under a pyenv prefix) is found only through it.
    """
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 a moment ago, below the ephemeral range
    (``participants.ports``: the collector cannot be handed a bound socket)."""
    return ports.free_ports(count)


#: Starts tried before ``collector`` gives up on an agent that exits: a port chosen free may be
#: taken before the agent binds it (it cannot be handed a bound socket), and it then exits at
#: once. One that neither listens nor exits within the start-up time is not tried again. (A port
#: another process already listens on passes the check that the agent listens: connecting works.)
STARTS: Final = 3


@contextlib.contextmanager
def collector(startup_seconds: float = 15.0, *, debug_out: Path | None = None) -> Iterator[str | None]:
    """A running collector's base URL (``None`` without the binary); stopped on exit. With
    ``debug_out``, every span and metric point it receives is printed to that file (``rotel_spans``
    reads the spans back)."""
    binary = agent_binary()
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(STARTS):
            http_port, grpc_port = free_ports(2)
            command = agent_command(binary, http_port, grpc_port, Path(tmp), debug=debug_out is not None)
            with open(debug_out or os.devnull, "ab" if attempt else "wb") as out:
                try:
                    proc = spawn(command, stdout=out, stderr=subprocess.STDOUT, env=agent_env())
                except OSError as exc:  # not executable, not a program: a traceback before
                    raise CollectorError(
                        f"rotel-agent {binary} cannot run: {exc.strerror or exc}{_check()}"
                    ) from None
            started = listening(proc, http_port, startup_seconds)
            if started:
                break
            stop_process(proc)
            if started is None:
                raise CollectorError(f"rotel-agent did not listen within {startup_seconds:g} s{_check()}")
        else:
            raise CollectorError(f"rotel-agent exited at start ({STARTS} tries): {binary}{_check()}")
        try:
            yield f"http://127.0.0.1:{http_port}"
        finally:
            stop_process(proc)


def _check() -> str:
    """What to check when the agent found does not run: the variable that named it, if one did."""
    chosen = os.environ.get(ENV_BINARY)
    return f" (check ${ENV_BINARY}={chosen}, or unset it)" if chosen else f" ({HOW})"
