"""bench_fleet_trace without a collector: each size keeps its rows, saying why, and misses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks import bench_fleet_trace, rotel


def test_sizes_without_rotel_are_skipped_not_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rotel-agent: each size said "NO" twice ("missing 0" of its traces against a target of
    0) and "exit -1" for a demo never run; now it says why and how to get rotel, met neither way."""
    monkeypatch.setenv(rotel.ENV_BINARY, str(tmp_path / "no-rotel-agent"))
    result = bench_fleet_trace.run(only=(1, 2))
    why = rotel.why_missing()
    assert [size["skipped"] for size in result["sizes"]] == [why, why]
    assert [met for _, _, _, met in result["rows"]] == [None] * 4
    assert [what for what, _, _, _ in result["rows"]][::2] == [
        f"fleet N=1 (4 participants): {why}",
        f"fleet N=2 (8 participants): {why}",
    ]
    assert "pip install rotel" in why
