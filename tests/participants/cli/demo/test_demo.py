"""The main job: ``ckpt-events demo`` in process, and ``report`` / ``replay`` on its log."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from ckpt_events import CollectionFinished, OperationFinished
from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.main import main
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
    assert "time per participant" in text and "checkpoint: waterfall" in text and "restore: waterfall" in text
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


def test_report_skips_a_corrupt_line_with_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """report prints the breakdown from a log and names a corrupt line by number."""
    log = tmp_path / "log.jsonl"
    good = (
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
    )
    log.write_bytes(good + b"{not json\n" + good)
    assert main(["report", str(log), "--report", str(tmp_path / "t.html")]) == 0
    captured = capsys.readouterr()
    assert f"{log}:2: corrupt line skipped" in captured.err
    assert "model/m0" in captured.out
    assert "<svg" in (tmp_path / "t.html").read_text()


def test_user_mistakes_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad flags, paths and endpoints exit non-zero with one line, never a traceback."""
    for argv in (
        ["demo", "--rollouts", "zero"],
        ["demo", "--otlp-endpoint", "127.0.0.1:4318"],
        ["demo", "--jsonl", str(tmp_path / "missing" / "t.jsonl")],
        ["bench", "--only", "everything"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, argv
    for argv in (
        ["report", str(tmp_path / "nope.jsonl")],
        ["replay", str(tmp_path / "nope.jsonl"), "--otlp-endpoint", "http://127.0.0.1:9"],
    ):
        assert main(argv) == 2  # paths may be globs: checked when expanded, not by argparse
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "no such file, directory or matching glob" in err, argv
    # --report is checked with its extension, by the command, before any work
    assert main(["demo", "--report", str(tmp_path / "missing" / "t.svg")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert main(["report", str(empty)]) == 2
    assert "holds no checkpoint events" in capsys.readouterr().err


def test_replay_to_an_unreachable_collector_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """replay to a port where nothing listens exits non-zero naming the endpoint."""
    from ckpt_events.participants.cli.fleet import free_port

    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":1,'
        b'"span_id":2,"start_ns":1000000,"end_ns":5000000,"operation":"commit"}\n'
    )
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    err = capsys.readouterr().err
    assert url in err and "collector" in err and len(err.strip().splitlines()) == 1


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
