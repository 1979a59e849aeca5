"""Free ports for servers started by a port number (``participants.ports``): below the kernel's
ephemeral range, where a released port 0 could be handed to a parallel client before its
server bound it ("address already in use" in a clean-clone CI run)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ckpt_events.participants import ports
from ckpt_events.participants.cli.fleet import free_port

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not _RANGE.exists(), reason="no ephemeral range to read (not Linux)")
def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    """Every port chosen is below the range the kernel hands out by itself, 20 distinct in one
    call, and each can be bound once released."""
    low = int(_RANGE.read_text().split()[0])
    chosen = ports.free_ports(20)
    assert len(set(chosen)) == 20
    assert all(low - 12_000 <= port < low for port in chosen), (low, chosen)
    assert free_port() < low
    for port in chosen:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_with_no_range_to_read_the_kernel_s_ports_are_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where the range cannot be read, the ports are the kernel's (port 0), still distinct."""
    monkeypatch.setattr(ports, "_EPHEMERAL", tmp_path / "none")
    chosen = ports.free_ports(5)
    assert len(set(chosen)) == 5
    if _RANGE.exists():
        low, high = map(int, _RANGE.read_text().split())
        assert all(low <= port <= high for port in chosen)
