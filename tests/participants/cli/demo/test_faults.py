"""``ckpt-events demo --checkpoints N`` and ``--fault``: real runs, diagnosed by ``report``."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from ckpt_events import LeaseExpired, PrepareNotReady
from ckpt_events.participants.cli.demo.checks import diagnosis_checks
from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import FAULT_ENV, parse_fault
from ckpt_events.sinks.jsonl import read_events
from ckpt_events.vocab import Phase

PARTICIPANTS = ("environment/environment-0", "model/model-0", "agent/agent-0", "resources/resources-0")


def _report(log: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``ckpt-events report LOG``'s output, with runs of white space (line wraps) as one space."""
    capsys.readouterr()
    assert main(["report", str(log)]) == 0
    return " ".join(capsys.readouterr().out.split())


async def test_three_checkpoints_are_published_and_the_last_is_restored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--checkpoints 3: three real checkpoints through the controller, the restore from the
    last; the report's overview shows each; the diagnosis refuses faults that did not happen."""
    log = tmp_path / "run.jsonl"
    options = DemoOptions(rollouts=30, concurrency=4, checkpoints=3, jsonl=log, workdir=tmp_path)
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert len(result.first.checkpoints) == 3
    assert result.second.restored_from == result.first.checkpoints[-1] == result.checkpoint_id
    assert result.second.completed == 30
    assert result.checks[4] == "3 of 3 checkpoints published, each through the controller"
    run = overview(result.events)
    assert [(r.what, r.outcome) for r in run.rows] == [("checkpoint", "published")] * 3 + [
        ("restore", "restored")
    ]
    assert [r.checkpoint_id for r in run.rows[:3]] == result.first.checkpoints
    text = _report(log, capsys)
    assert "4 checkpoints and restores" in text and text.count(" published ") >= 3
    # A fault that did not happen is not claimed: the checks fail on a healthy run's events.
    for fault in ("stall:environment-0", "lease", "slow-restore:model-0"):
        with pytest.raises(DemoFailed):
            diagnosis_checks(run, published=3, fault=parse_fault(fault))
    assert FAULT_ENV not in os.environ


@pytest.mark.slow
async def test_stall_aborts_the_first_checkpoint_not_ready_on_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    options = DemoOptions(rollouts=40, concurrency=4, fault="stall", jsonl=log, workdir=tmp_path)
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert len(result.first.checkpoints) == 1 and result.second.completed == 40
    assert any("aborted: not ready at its deadline: environment/environment-0" in c for c in result.checks)
    events = [e for _, e in read_events(log)]
    not_ready = [e for e in events if isinstance(e, PrepareNotReady)]
    assert [(e.instance, e.blockers) for e in not_ready] == [("environment-0", 1)]
    assert not any(isinstance(e, LeaseExpired) for e in events)
    text = _report(log, capsys)
    assert (
        "#1 checkpoint aborted: not ready at its deadline: environment/environment-0 blocked by 1 episode"
        in text
    )
    assert "#2 checkpoint, critical path: " in text and "#3 restore, critical path: " in text
    assert FAULT_ENV not in os.environ


@pytest.mark.slow
def test_stall_with_worker_processes_holds_a_step_in_a_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --fault stall --workers 2``: the environment's work runs in its worker processes,
    and the stall was injected only in the server's own process, which does none: nothing was
    held, and the demo failed with "2 checkpoints published, not 1"."""
    argv = ["demo", "--fault", "stall", "--workers", "2", "--rollouts", "40", "--concurrency", "4"]
    assert main([*argv, "--workdir", str(tmp_path / "work")]) == 0, capsys.readouterr().err
    out = " ".join(capsys.readouterr().out.split())
    assert "aborted: not ready at its deadline: environment/environment-0" in out, out[-3000:]


@pytest.mark.slow
async def test_lease_expires_on_every_participant_and_a_later_checkpoint_publishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    options = DemoOptions(
        rollouts=40, concurrency=4, checkpoints=3, fault="lease", jsonl=log, workdir=tmp_path
    )
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert len(result.first.checkpoints) == 2 and result.second.restored_from == result.first.checkpoints[-1]
    events = [e for _, e in read_events(log)]
    expired = [e for e in events if isinstance(e, LeaseExpired)]
    assert sorted(e.instance for e in expired) == sorted(p.split("/")[1] for p in PARTICIPANTS)
    assert {e.phase for e in expired} == {Phase.PREPARED}
    assert len({e.checkpoint_id for e in expired}) == 1
    text = _report(log, capsys)
    assert "#1 checkpoint aborted: lease expired on" in text
    for who in PARTICIPANTS:
        assert f"lease expired on {who} in phase prepared" in text
    assert "#2 checkpoint, critical path: " in text and "#3 checkpoint, critical path: " in text


@pytest.mark.slow
async def test_slow_restore_is_dominated_by_the_model_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    options = DemoOptions(rollouts=40, concurrency=8, fault="slow-restore", jsonl=log, workdir=tmp_path)
    result = await run_demo(options, Console(file=io.StringIO(), width=170))
    assert len(result.first.checkpoints) == 1 and result.second.completed == 40
    restore = next(r for r in overview(result.events).rows if r.what == "restore")
    assert restore.ms is not None and restore.dominant_ms is not None
    assert restore.dominant_ms > 0.5 * restore.ms  # 50 ms per record, several records in flight
    text = _report(log, capsys)
    assert "#2 restore, critical path:" in text and "read on model/model-0" in text and "dominated" in text
    assert "aborted" not in text


def test_an_aborting_fault_needs_a_second_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--fault", "lease", "--checkpoints", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--checkpoints 2 or more" in err and len(err.splitlines()) == 1


def test_two_different_faults_are_refused_not_one_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    """A second --fault is refused in one line: the last one alone was injected, and the run passed."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--fault", "stall", "--fault", "lease"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--fault: given twice (stall, then lease)" in err.splitlines()[-1]


def test_more_checkpoints_than_rollouts_before_the_last_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--rollouts", "5", "--checkpoints", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "raise --rollouts or --checkpoint-at" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_processes_lease_fault_is_named_from_every_serve_process_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real command, ``demo --processes --fault lease --jsonl``: the participants are
    ``serve`` processes, so their lease-expired events reach the file only from their own logs;
    ``report`` on it names the aborted checkpoint's cause on each participant, in its phase."""
    log = tmp_path / "run.jsonl"
    argv = ["demo", "--processes", "--fault", "lease", "--rollouts", "30", "--concurrency", "4",
            "--jsonl", str(log), "--workdir", str(tmp_path / "work")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr()
    events = [e for _, e in read_events(log)]
    expired = [e for e in events if isinstance(e, LeaseExpired)]
    assert sorted(e.instance for e in expired) == sorted(p.split("/")[1] for p in PARTICIPANTS)
    assert {e.phase for e in expired} == {Phase.PREPARED} and len({e.checkpoint_id for e in expired}) == 1
    text = _report(log, capsys)
    assert "#1 checkpoint aborted: lease expired on" in text
    for who in PARTICIPANTS:
        assert f"lease expired on {who} in phase prepared" in text
    assert "#2 checkpoint, critical path: " in text and "#3 restore, critical path: " in text
    assert FAULT_ENV not in os.environ


@pytest.mark.slow
def test_processes_slow_restore_is_named_by_the_demos_own_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``demo --processes --fault slow-restore``: the slowed read is in model-0's own log, which
    the demo folds in after its own events; its check must still find that read dominating."""
    argv = ["demo", "--processes", "--fault", "slow-restore", "--rollouts", "30", "--concurrency", "4"]
    assert main([*argv, "--workdir", str(tmp_path / "work")]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # the check's line wraps at the console's width
    assert "read on model/model-0" in flat and "injected: slow-restore:model-0" in flat, out[-2000:]


@pytest.mark.slow
def test_processes_inject_the_demos_fault_not_one_left_in_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CKPT_EVENTS_FAULT=stall:environment-0`` left in the shell (from a ``serve`` session) and
    ``demo --processes`` without ``--fault``: its ``serve`` processes inherited the variable,
    stalled, and the demo failed with "generation 1 finished without its checkpoint"; a
    generation injects what its own plan says, nothing else."""
    monkeypatch.setenv(FAULT_ENV, "stall:environment-0")
    argv = ["demo", "--processes", "--rollouts", "20", "--concurrency", "4"]
    assert main([*argv, "--workdir", str(tmp_path / "work")]) == 0, capsys.readouterr().err
    assert "1 of 1 checkpoint published" in capsys.readouterr().out
