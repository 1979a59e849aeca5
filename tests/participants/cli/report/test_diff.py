"""``ckpt-events diff`` on two real runs, the second with one participant slowed on purpose."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.workloads.model import ModelWorkload
from ckpt_events.sinks import JsonLinesSink
from tests.participants.controller.test_coordinator import coordinated


async def _checkpoints(path: Path, ck: Path) -> None:
    async with coordinated() as (co, _, events):
        for n in range(3):
            await co.checkpoint(f"c{n}", str(ck / f"c{n}"), deadline_ts=time.time() + 10)
    sink = JsonLinesSink(path)
    sink.handle(events)
    sink.close()


async def test_diff_flags_the_slowed_step_and_fails_above_the_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's export slowed by 40 ms leads the table and makes --fail-above exit 1."""
    await _checkpoints(tmp_path / "base.jsonl", tmp_path / "base")
    export = ModelWorkload.export

    async def slow_export(self: Any, scope: Any) -> Any:
        await anyio.sleep(0.04)
        return await export(self, scope)

    monkeypatch.setattr(ModelWorkload, "export", slow_export)
    await _checkpoints(tmp_path / "new.jsonl", tmp_path / "new")
    assert main(["diff", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl"), "--fail-above", "3"]) == 1
    captured = capsys.readouterr()
    first_row = next(line for line in captured.out.splitlines() if line.strip().startswith(("model", "agent",
                     "environment", "resources", "controller")))  # fmt: skip
    assert first_row.split()[:3] == ["model", "commit", "export"], captured.out
    assert "worst model/commit/export" in captured.err
    # Without the gate the same comparison only reports.
    assert main(["diff", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]) == 0
