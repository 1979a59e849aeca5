"""rotel: a collector that cannot start is a reason and a way to get it, not a missing row."""

from __future__ import annotations

from pathlib import Path

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
