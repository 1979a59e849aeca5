"""Two fleets' logs in one folder (``report.runs``): each run's pause over its own logs' time,
never the two runs' pauses summed over both (150%); one log of both: overlaps counted once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.testing import TickingClock

#: 2027-01-15 08:00 UTC; fleet b starts 3 ms after fleet a, so their checkpoints overlap.
T0 = 1_800_000_000_000_000_000
_SHARE = re.compile(r"(\d+\.\d)% of (?:the|its) logs' ([\d.]+ m?s)")


async def fleet(path: Path, start_ns: int, checkpoints: int = 2) -> None:
    """One fleet's run, written by the JSON-lines sink: 10 ms idle, then a checkpoint (prepare
    stages, commit, publish, resume of every participant), twice; one reading of its clock a ms."""
    clock = TickingClock(start_ns=start_ns, step_ns=1_000_000)
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        ctl = Telemetry(bus, kind="controller", instance="coordination", clock=clock)
        who = {k: Telemetry(bus, kind=k, instance=f"{k.value}-0", clock=clock) for k in PREPARE_ORDER}

        def call(parent: Any, kind: Any, operation: str, cid: str) -> None:
            with who[kind].operation(operation, checkpoint_id=cid, traceparent=parent.traceparent()):
                pass

        for n in range(checkpoints):
            for _ in range(10):
                clock()
            cid = f"{path.stem}-c{n}"
            with ctl.collection("checkpoint", checkpoint_id=cid) as coll:
                with ctl.coordinate("prepare", checkpoint_id=cid, parent=coll) as coord:
                    for kind in PREPARE_ORDER:
                        with coord.stage(kind) as stage:
                            call(stage, kind, "prepare", cid)
                with ctl.coordinate("commit", checkpoint_id=cid, parent=coll) as coord:
                    for kind in PREPARE_ORDER:
                        call(coord, kind, "commit", cid)
                with ctl.collection("publish", checkpoint_id=cid, parent=coll):
                    pass
                with ctl.coordinate("resume", checkpoint_id=cid, parent=coll) as coord:
                    for kind in reversed(PREPARE_ORDER):
                        call(coord, kind, "resume", cid)


def _report(spec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["report", str(spec)]) == 0
    return capsys.readouterr().out


async def test_two_fleets_in_one_folder_each_paused_over_its_own_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fleets a and b, each alone 72.0 ms paused, 77.4% of its 93.0 ms, run at once: their
    folder said 144.0 ms, 150.0% of the logs' 96.0 ms. Now one line per run (no trace in common),
    each as its log alone says; a log holding both (nothing tells them apart) counts the time
    either was paused once: within the logs' time."""
    folder = tmp_path / "fleets"
    folder.mkdir()
    await fleet(folder / "a.jsonl", T0)
    await fleet(folder / "b.jsonl", T0 + 3_000_000)
    alone = _report(folder / "a.jsonl", monkeypatch, capsys)
    assert "paused the fleet (admission closed, first prepare to last resume) 72.0 ms in all" in alone
    assert _SHARE.findall(alone) == [("77.4", "93.0 ms")], alone
    both = _report(folder, monkeypatch, capsys)
    assert _SHARE.findall(both) == [("77.4", "93.0 ms"), ("77.4", "93.0 ms")], both
    assert "run 1 of 2 (a.jsonl, no trace in common with the others): checkpointing paused its fleet" in both
    assert "run 2 of 2 (b.jsonl, no trace in common with the others)" in both
    one_file = tmp_path / "both.jsonl"
    lines = sorted(
        (folder / "a.jsonl").read_bytes().splitlines() + (folder / "b.jsonl").read_bytes().splitlines()
    )
    one_file.write_bytes(b"\n".join(lines) + b"\n")
    merged = _report(one_file, monkeypatch, capsys)
    assert "paused the fleet (admission closed, first prepare to last resume) 78.0 ms in all" in merged
    assert _SHARE.findall(merged) == [("81.2", "96.0 ms")], merged  # 78 of 96 ms: either paused


async def test_a_fleet_killed_mid_checkpoint_ages_its_open_spans_by_its_own_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fleet a killed during its checkpoint's commit, fleet b's logs an hour later in the same
    folder: a's open spans were 'still open, 3600008.0 ms', aged by b's last line. Each run's
    open work is aged by the end of its own logs, as when a's log is read alone."""
    folder = tmp_path / "fleets"
    folder.mkdir()
    await fleet(folder / "a.jsonl", T0, checkpoints=1)
    lines = (folder / "a.jsonl").read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"operation":"commit"' in line)
    (folder / "a.jsonl").write_bytes(b"".join(lines[: cut + 3]))  # killed in the commit
    alone = _report(folder / "a.jsonl", monkeypatch, capsys)
    ages = re.findall(r"still open, ([\d.]+) ms", alone)
    assert ages and all(float(age) < 100 for age in ages), alone
    await fleet(folder / "b.jsonl", T0 + 3_600_000_000_000)
    both = _report(folder, monkeypatch, capsys)
    assert "run 1 of 2 (a.jsonl" in both
    assert re.findall(r"still open, ([\d.]+) ms", both) == ages, both


async def test_two_fleets_folders_of_the_same_file_names_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two fleets' folders hold logs of the same names (each fleet's run.jsonl): both runs
    were 'run N of 2 (run.jsonl, ...)', which told the reader nothing. A name two files share
    is given as the path named on the command line."""
    for name, start in (("a", T0), ("b", T0 + 3_000_000)):
        (tmp_path / name).mkdir()
        await fleet(tmp_path / name / "run.jsonl", start)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert f"run 1 of 2 ({tmp_path / 'a' / 'run.jsonl'}, no trace in common" in out, out
    assert f"run 2 of 2 ({tmp_path / 'b' / 'run.jsonl'}, no trace in common" in out, out
