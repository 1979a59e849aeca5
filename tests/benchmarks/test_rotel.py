"""rotel: a collector that cannot start is a reason and a way to get it, not a missing row."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ckpt_events.benchmarks import rotel


def test_an_absent_binary_is_no_collector_and_says_why(tmp_path: Path) -> None:
    """$CKPT_EVENTS_BENCH_ROTEL naming no file: no binary, and the reason names it and the fix."""
    absent = tmp_path / "no-rotel-agent"
    environ = {rotel.ENV_BINARY: str(absent)}
    assert rotel.agent_binary(environ) is None
    why = rotel.why_missing(environ)
    assert why.startswith("skipped: ") and str(absent) in why and "pip install rotel" in why


def test_a_named_binary_is_used(tmp_path: Path) -> None:
    """$CKPT_EVENTS_BENCH_ROTEL naming a file: that file is the agent."""
    agent = tmp_path / "rotel-agent"
    agent.write_text("")
    assert rotel.agent_binary({rotel.ENV_BINARY: str(agent)}) == agent


def test_free_ports_are_distinct() -> None:
    """Each port stays bound until all are chosen: never one port twice."""
    for _ in range(20):
        ports = rotel.free_ports(4)
        assert len(set(ports)) == 4


def test_an_agent_that_exits_at_start_is_tried_three_times_then_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = tmp_path / "rotel-agent"
    agent.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\nexit 1\n")
    agent.chmod(0o755)
    monkeypatch.setenv(rotel.ENV_BINARY, str(agent))
    with pytest.raises(RuntimeError, match=r"rotel-agent exited at start \(3 tries\)"), rotel.collector():
        pass
    assert (tmp_path / "starts").read_text().count("started") == rotel.STARTS


def test_an_agent_that_cannot_run_is_one_line_naming_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A $CKPT_EVENTS_BENCH_ROTEL file that is no program was Popen's PermissionError, a
    traceback out of ``bench``: a ``CollectorError`` naming the variable to check."""
    agent = tmp_path / "rotel-agent"
    agent.write_text("not a program\n")
    monkeypatch.setenv(rotel.ENV_BINARY, str(agent))
    with pytest.raises(rotel.CollectorError) as info, rotel.collector():
        pass
    assert str(info.value) == (
        f"rotel-agent {agent} cannot run: Permission denied (check ${rotel.ENV_BINARY}={agent}, or unset it)"
    )


@pytest.mark.skipif(rotel.agent_binary() is None, reason=rotel.why_missing())
def test_a_port_taken_before_the_agent_binds_it_costs_a_second_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ports chosen are taken by the time the agent binds them (another process bound
    them first, not yet listening, as the demo's fleet holds its servers' ports): it exits, and
    the collector starts again on others."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        chosen = iter([[port, port]])
        real = rotel.free_ports
        monkeypatch.setattr(rotel, "free_ports", lambda count: next(chosen, None) or real(count))
        with rotel.collector() as url:
            assert url is not None and not url.endswith(f":{port}")
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5):
                pass
