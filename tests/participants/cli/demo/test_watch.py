"""``demo --fault stall --watch``: the watch view in place of the progress bars, the stuck participant
named in it while the stall lasts, and the stall warning and the counted ``stalled`` saying the same."""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from ckpt_events import Stalled
from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.demo.watch import FAULT_STALL_AFTER_S, stall_environ, view_stall_after
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.watch.layout import ROWS_OVER
from ckpt_events.participants.faults import FAULT_ENV
from ckpt_events.sinks.stall_watch import ENV_STALL_AFTER
from ckpt_events.vocab import Kind, Operation

_OPEN_PREPARE = re.compile(r"open prepare (\S+) (\d+\.\d) s( STALLED)?")
_WAITING = re.compile(
    r"(?m)^  open prepare \S+ >=\d+\.\d s, waiting on environment/environment-0 \(stalled\)$"
)


def _snapshots(out: str) -> list[str]:
    """The plain snapshots the demo printed, each from its ``-- <generation>: ... --`` heading."""
    return ["-- generation" + part for part in out.split("-- generation")[1:]]


def _block(snapshot: str, who: str) -> str:
    """The lines of participant ``who`` ("kind instance") in ``snapshot``, or ``""``."""
    lines = snapshot.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(who + " ") or line == who:
            rest = [line]
            for more in lines[index + 1 :]:
                if not more.startswith(" "):
                    break
                rest.append(more)
            return "\n".join(rest)
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("processes", [False, pytest.param(True, marks=pytest.mark.e2e)])
async def test_the_stalled_participant_is_named_in_the_view_while_it_is_stuck(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, processes: bool
) -> None:
    """Piped, each refresh is a snapshot: one taken within 2 s of the stall names environment-0 as
    not ready with its blocker, its lease, and the open prepare (stalled past 0.5 s); the demo's
    StallWatch warns once about that prepare, and the counted ``stalled`` names the same one."""
    monkeypatch.delenv(ENV_STALL_AFTER, raising=False)
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    text = io.StringIO()
    options = DemoOptions(
        rollouts=40, concurrency=4, fault="stall", watch=True, processes=processes, workdir=tmp_path
    )
    result = await run_demo(options, Console(file=text, width=120))
    out = text.getvalue()
    assert result.second.completed == 40
    assert "━" not in out, "progress bars were drawn besides the view"
    snapshots = _snapshots(out)
    assert snapshots[0].startswith("-- generation 1: checkpoint and stop: ")
    assert any(s.startswith("-- generation 2 (restored): ") for s in snapshots)
    stuck = [
        (block, match)
        for block in (_block(s, "environment environment-0") for s in snapshots)
        if (match := _OPEN_PREPARE.search(block)) is not None and "NOT READY" in block
    ]
    assert stuck, out
    first, match = stuck[0]
    checkpoint_id = match[1]
    assert float(match[2]) < 2.0, f"first seen {match[2]} s into the stall:\n{first}"
    assert re.search(r"NOT READY: 1 blocking: r\d{5}", first), first
    assert f"phase preparing  checkpoint {checkpoint_id}" in first and " left" in first, first
    assert any(m[3] for _, m in stuck), "the open prepare was never marked stalled"
    # The controller's prepare waits on environment-0: was "open prepare ... STALLED" beside it.
    controller = [_block(s, "controller coordination") for s in snapshots]
    waiting = [b for b in controller if f"open prepare {checkpoint_id}" in b]
    assert waiting and not any("STALLED" in b for b in controller), out
    assert any(_WAITING.search(b) for b in waiting), out
    docs = (Path(__file__).parents[4] / "docs" / "demo.md").read_text()
    assert _WAITING.search(docs), "docs/demo.md's excerpt is not what the view prints"
    aborted = [c for c in result.checks if "aborted: not ready at its deadline" in c]
    assert aborted and "environment/environment-0" in aborted[0]
    # The warning (this process's StallWatch: in-process servers share its bus) and the counted
    # `stalled` (the metric sinks' gym.checkpoint.events_total) say the same.
    stalled = [e for e in result.events if isinstance(e, Stalled)]
    assert [
        (e.kind, e.instance, e.operation, e.checkpoint_id) for e in stalled if e.kind == Kind.ENVIRONMENT
    ] == [(Kind.ENVIRONMENT, "environment-0", Operation.PREPARE, checkpoint_id)]
    messages = [r.getMessage() for r in caplog.records]
    warned = [m for m in messages if m.startswith("stalled: ")]
    # The controller's prepare waits on environment-0 (in-process: its prepare is on this bus;
    # with --processes: its stage): was "stalled: prepare of controller coordination".
    assert not [w for w in warned if "controller" in w], warned
    holder = "its environment stage (calls not seen here)" if processes else "environment/environment-0"
    ours = (
        f"waiting: prepare of controller coordination (checkpoint {checkpoint_id}, phase preparing) "
        f"waiting on {holder}"
    )
    assert any(m.startswith(ours) for m in messages), messages
    if not processes:  # a process's own StallWatch warns into its log file
        env = f"stalled: prepare of environment environment-0 (checkpoint {checkpoint_id}, phase preparing)"
        assert [w for w in warned if "environment-0" in w] == [w for w in warned if w.startswith(env)]
        assert len([w for w in warned if w.startswith(env)]) == 1
    else:
        logs = "".join(
            p.read_text(errors="replace") for p in (tmp_path / "logs").glob("environment-0.stderr")
        )
        assert f"stalled: prepare of environment environment-0 (checkpoint {checkpoint_id}" in logs, logs
    assert FAULT_ENV not in os.environ
    print(first)


def test_the_stall_threshold_is_the_users_else_short_with_a_fault() -> None:
    """$CKPT_EVENTS_STALL_AFTER wins; else a fault's stall is warned about past 0.5 s; else nothing."""
    assert stall_environ("stall", {ENV_STALL_AFTER: " 7 "}) == {ENV_STALL_AFTER: "7"}
    assert stall_environ("stall", {}) == {ENV_STALL_AFTER: "0.5"}
    assert stall_environ(None, {}) == {}
    assert view_stall_after({ENV_STALL_AFTER: "7"}) == 7.0
    assert view_stall_after({}) == 30.0
    assert view_stall_after(stall_environ("lease", {})) == FAULT_STALL_AFTER_S


@pytest.mark.slow
def test_16_servers_are_one_line_each_in_every_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --instances 4 --watch`` (16 servers, past ``ROWS_OVER``) piped at 80 columns: every
    snapshot is a summary line and one line per server (each server once), none wider than 80
    columns."""
    # Any fleet past ROWS_OVER is laid out in rows; 64 servers showed the same in 40 s, not 12.
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv(ENV_STALL_AFTER, raising=False)
    argv = ["demo", "--instances", "4", "--watch", "--rollouts", "20", "--workdir", str(tmp_path)]
    assert main(argv) == 0
    snapshots = _snapshots(capsys.readouterr().out)
    servers = {f"{kind}-{i}" for kind in ("environment", "model", "agent", "resources") for i in range(4)}
    assert len(servers) > ROWS_OVER and len(snapshots) >= 2
    for snapshot in snapshots:
        lines = snapshot.splitlines()[1:]
        assert re.match(r"1[67] participants: ", lines[0]), snapshot
        assert max(len(line) for line in lines) <= 80, snapshot
        starts = [line.split()[0] for line in lines[1:] if line.split()]
        assert sorted(s for s in starts if s in servers) == sorted(servers), snapshot
