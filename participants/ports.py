"""Free TCP ports for servers started by a port number (the tests' servers, the benchmarks'
collector), chosen below the kernel's ephemeral range.

A port bound to 0 and released is an ephemeral one: before its server binds it, the kernel may
hand it to any socket that connects out or binds port 0 (a client or a server of a test running
beside it), and the server then fails "address already in use" (a clean-clone CI run lost a test
so). The kernel never hands out a port below that range by itself: only another process that
picks the same one at the same moment can take it. Where the range cannot be read (not Linux),
ports are the kernel's as before. A server that can be handed a bound socket needs none of this.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path
from typing import Final

__all__ = ["free_ports"]

#: Where Linux says its ephemeral range (``32768 60999`` by default).
_EPHEMERAL: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Ports below the ephemeral range chosen from, at most; the lowest is never under 10,000.
_SPAN: Final = 12_000
_LOWEST: Final = 10_000
#: Ports tried per port wanted before the kernel's own are taken.
_TRIES: Final = 50
#: Not the ``random`` module's generator: a plugin that seeds it alike in every test worker
#: would have them all pick the same ports.
_PICK: Final = random.SystemRandom()


def _below_ephemeral() -> range | None:
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ports = range(max(_LOWEST, low - _SPAN), low)
    return ports if len(ports) >= 1_000 else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago (each held bound
    until all are chosen), below the ephemeral range where it can be read."""
    ports = _below_ephemeral()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        for _ in range(count * _TRIES):
            if ports is None or len(chosen) == count:
                break
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            try:
                sock.bind((host, _PICK.choice(ports)))
            except OSError:  # in use, or in TIME_WAIT: another
                continue
            chosen.append(int(sock.getsockname()[1]))
        while len(chosen) < count:  # the kernel's own: no range, or none free in it
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            chosen.append(int(sock.getsockname()[1]))
        return chosen
