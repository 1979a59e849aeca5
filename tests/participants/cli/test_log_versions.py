"""Logs kept across an upgrade, and one log shared by a fleet running two versions at once.

``demo-0.2.0-fed5445.jsonl.gz`` (tests/sinks/jsonl/data) was written by commit fed5445 (version
0.2.0, before kinds and steps became the user's names): ``ckpt-events demo --rollouts 12
--concurrency 4 --steps 1 --jsonl ...`` run from that checkout, then gzipped. 130 lines: one
published checkpoint and its restore, 4 refusals.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import get_args

import anyio
import pytest

from ckpt_events import CheckpointEvent
from ckpt_events.participants.cli.main import main
from ckpt_events.sinks.replay import replay

_FIXTURE = Path(__file__).parents[2] / "sinks" / "jsonl" / "data" / "demo-0.2.0-fed5445.jsonl.gz"
_LINES = 130


def _old_lines() -> list[bytes]:
    lines = gzip.decompress(_FIXTURE.read_bytes()).splitlines(keepends=True)
    assert len(lines) == _LINES
    return lines


class _Collect:
    interests = get_args(CheckpointEvent)

    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def handle(self, batch: list[CheckpointEvent]) -> None:
        self.events.extend(batch)


def test_a_0_2_0_log_reads_in_report_diff_watch_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guard: the old version's log, read by every reader of this one, without a word of
    damage, every line an event."""
    log = tmp_path / "old.jsonl"
    log.write_bytes(b"".join(_old_lines()))
    assert main(["report", str(log)]) == 0
    out, err = capsys.readouterr()
    assert "corrupt" not in err and "not a ckpt-events" not in err, err
    assert "1 checkpoint and restore" not in out and "published" in out and "restored" in out
    assert main(["diff", str(log), str(log)]) == 0
    assert "corrupt" not in capsys.readouterr().err
    assert main(["watch", "--once", "--follow", str(log)]) == 0
    out, err = capsys.readouterr()
    assert "skipped" not in out + err
    assert all(f"{kind}-0" in out for kind in ("environment", "model", "agent", "resources"))
    sink = _Collect()
    result = anyio.run(replay, log, sink)
    assert (result.events, result.corrupt_lines, len(sink.events)) == (_LINES, 0, _LINES)
