"""Trends across a run, from real fleets: a step slowed a little more at every checkpoint is
flagged as growing, one instance slowed at every checkpoint is flagged as the straggler, a
healthy run flags neither; and the overview folded from a stream matches the one from a list."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from participants.cli.run_overview import overview
from participants.cli.trends import spearman
from participants.workloads.environment import EnvironmentWorkload
from tests.participants.controller.test_coordinator import FOUR, coordinated

TWO_ENVIRONMENTS = (("environment", "environment-1"), *FOUR)
CHECKPOINTS = 8


async def _checkpoints(tmp_path: Path, members: Any = FOUR) -> list[Any]:
    async with coordinated(members=members) as (co, _, events):
        for n in range(CHECKPOINTS):
            await co.checkpoint(f"c{n}", str(tmp_path / f"ck{n}"), deadline_ts=time.time() + 10)
    return list(events)


def _slowed_export(monkeypatch: pytest.MonkeyPatch, seconds: Any) -> None:
    real = EnvironmentWorkload.export

    async def export(self: EnvironmentWorkload, scope: Any) -> Any:
        await anyio.sleep(seconds(self))
        return await real(self, scope)

    monkeypatch.setattr(EnvironmentWorkload, "export", export)


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4]) == pytest.approx(1.0)
    assert spearman([4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1]) is None and spearman([1, 2]) is None
    assert spearman([1, 3, 2, 4, 5]) == pytest.approx(0.9)


async def test_a_step_slowed_progressively_is_flagged_growing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = iter(range(1000))
    # 0, 15, 30 ... ms more at every checkpoint; the last one stalls half a second.
    _slowed_export(monkeypatch, lambda _: 0.5 if (n := next(calls)) == CHECKPOINTS - 1 else 0.015 * n)
    run = overview(await _checkpoints(tmp_path))
    assert [r.outcome for r in run.rows] == ["published"] * CHECKPOINTS
    flags = run.trends.flags()
    slow = [f for f in flags if f.startswith("checkpoint #")]
    assert len(slow) == 1 and slow[0].startswith(f"checkpoint #{CHECKPOINTS} c{CHECKPOINTS - 1} took "), flags
    growing = [f for f in flags if f.startswith("growing:")]
    assert any("environment commit.export" in f for f in growing), flags
    # The export's time reaches the commit and the collection around it; nothing else grew.
    assert not any("model" in f or "agent" in f or "resources" in f for f in growing), flags
    (export,) = [t for t in run.trends.table() if t.key == ("environment", "commit", "export")]
    assert export.count == CHECKPOINTS and export.rho is not None and export.rho > 0.9
    assert export.max >= 500 and export.p50 < 100


async def test_one_slowed_instance_is_named_the_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slowed_export(monkeypatch, lambda w: 0.05 if w.tel.instance == "environment-1" else 0.0)
    run = overview(await _checkpoints(tmp_path, TWO_ENVIRONMENTS))
    flags = run.trends.flags()
    stragglers = [f for f in flags if f.startswith("straggler:")]
    assert len(stragglers) == 1, flags
    assert "environment/environment-1 was the slowest environment in" in stragglers[0]
    # The slowed step is slower by a constant, never growing (other steps may grow on a loaded
    # machine as the run's files accumulate: commit.write went 4.6 -> 11.3 ms in one CI-like run).
    assert not any(f.startswith("growing:") and "export" in f for f in flags), flags


async def test_a_healthy_run_flags_nothing_and_a_stream_folds_like_a_list(tmp_path: Path) -> None:
    events = await _checkpoints(tmp_path, TWO_ENVIRONMENTS)
    listed = overview(events)
    streamed = overview(iter(events), again=lambda: iter(events))
    assert not [f for f in listed.trends.flags() if not f.startswith("checkpoint #")]
    assert [(r.checkpoint_id, r.outcome, r.ms, r.slowest, r.paused_ms) for r in listed.rows] == [
        (r.checkpoint_id, r.outcome, r.ms, r.slowest, r.paused_ms) for r in streamed.rows
    ]
    row = streamed.rows[3]
    detail = streamed.events_of(row)
    assert detail == listed.events_of(listed.rows[3])
    assert {e.trace_id for e in detail if hasattr(e, "trace_id")} == row.trace_ids
    assert 0 < len(detail) < len(events) / (CHECKPOINTS - 1)
    with pytest.raises(RuntimeError, match="again="):
        overview(iter(events)).events_of(row)
