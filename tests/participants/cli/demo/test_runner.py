"""The demo's runner (``participants.cli.demo.runner``): a run checkpoints, crashes, restores and
verifies, for any rollout count."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from ckpt_events import CollectionFinished, OperationFinished
from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.text import short_id
from ckpt_events.sinks.jsonl import CorruptLine, read_events
from ckpt_events.vocab import Operation


async def test_demo_checkpoints_crashes_restores_and_verifies(tmp_path: Path) -> None:
    """A small demo run completes every rollout once, continues the in-flight ones as attempt 1,
    and reports from its events; its JSON-lines log decodes back into events."""
    out = io.StringIO()
    options = DemoOptions(
        rollouts=60, concurrency=8, jsonl=tmp_path / "demo.jsonl", report=tmp_path / "t.svg", workdir=tmp_path
    )
    result = await run_demo(options, Console(file=out, width=170))
    assert result.second.completed == 60 and result.first.completed < 60
    assert result.continued and all(result.second.attempts[r] == 1 for r in result.continued)
    assert len(result.checks) == 5 and result.checks[4].startswith("1 of 1 checkpoint published")
    text = out.getvalue()
    # The breakdown adds up the run's checkpoints and restore, and says so.
    assert "60 rollouts x 2 steps, summed over 1 checkpoint and 1 restore: time per participant" in text
    named = f"{short_id(result.checkpoint_id)}: waterfall"
    assert "time per participant" in text and f"checkpoint {named}" in text and f"restore {named}" in text
    assert "stale_attempt" in text
    # The checkpoint's and the restore's attribution lines (a long line may wrap at 170 columns).
    assert " ".join(text.split()).count("ms unattributed") == 2
    assert "JSON lines" in text and "demo.jsonl" in text  # says what it exported and where
    assert (tmp_path / "t.svg").read_text().startswith("<svg")
    logged = [event for _, event in read_events(tmp_path / "demo.jsonl")]
    assert not any(isinstance(event, CorruptLine) for event in logged)
    assert {e.action for e in logged if isinstance(e, CollectionFinished)} == {
        "checkpoint",
        "restore",
        "publish",
    }
    assert {e.operation for e in logged if isinstance(e, OperationFinished)} >= {
        Operation.COMMIT,
        Operation.RESTORE,
    }


@pytest.mark.parametrize("rollouts", [1, 2, 5, 15])
async def test_demo_runs_for_small_rollout_counts(tmp_path: Path, rollouts: int) -> None:
    """Any rollout count >= 1 checkpoints with rollouts in flight, and done + in flight adds up."""
    options = DemoOptions(rollouts=rollouts, steps=2, concurrency=4, workdir=tmp_path)
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert result.second.completed == rollouts and len(result.first.checkpoints) == 1
    manifest = msgspec.json.decode((tmp_path / "run" / result.checkpoint_id / "collection.json").read_bytes())
    done, continued, restarted = (len(manifest[k]) for k in ("completed", "continued", "restarted"))
    assert continued >= 1 and done + continued + restarted <= rollouts
    assert done == min(int(0.4 * rollouts), rollouts - 1)
    assert result.first.completed == done


async def test_demo_samples_as_the_environment_says_and_still_diagnoses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_TRACES_SAMPLER=always_off`` samples out the controller's traces, and with them every
    participant's (they follow its ``traceparent``); was: the demo's controller sampled every trace
    whatever the environment said, while its sinks were configured from it. The log still holds
    every operation and the run is verified and reported from it alike."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    options = DemoOptions(rollouts=5, steps=2, concurrency=4, jsonl=tmp_path / "demo.jsonl", workdir=tmp_path)
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert result.second.completed == 5 and len(result.checks) == 5
    assert result.checks[4].startswith("1 of 1 checkpoint published")
    logged = [event for _, event in read_events(tmp_path / "demo.jsonl")]
    finished = [e for e in logged if isinstance(e, OperationFinished)]
    assert {e.operation for e in finished} >= {Operation.COMMIT, Operation.RESTORE}
    assert [e for e in logged if getattr(e, "sampled", False)] == []
