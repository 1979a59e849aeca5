"""``ckpt-events demo --instances N``: several servers of each kind, a fault on one of them."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from ckpt_events import PrepareNotReady
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.faults import FAULT_ENV
from ckpt_events.sinks.jsonl import read_events
from tests.participants.cli.demo.instances import checks, demo_text

KINDS = ("environment", "model", "agent", "resources")


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # One check per line: rich wraps at $COLUMNS (80 when piped).
    monkeypatch.setenv("COLUMNS", "250")


@dataclass(frozen=True)
class Grown:
    """A finished ``demo --instances 2 --restore-instances 3``: its work folder and its output."""

    workdir: Path
    text: str


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Grown:
    """``demo --instances 2 --restore-instances 3 --rollouts 60 --concurrency 9``, run once: the
    placement test reads its first generation, the restore test its second."""
    workdir = tmp_path_factory.mktemp("grown")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setenv("COLUMNS", "250")
        argv = ["demo", "--instances", "2", "--restore-instances", "3", "--rollouts", "60"]
        code = main([*argv, "--concurrency", "9", "--workdir", str(workdir)])
    assert code == 0, out.getvalue()[-2000:]
    return Grown(workdir, " ".join(out.getvalue().split()))


def test_sessions_spread_over_the_servers_and_each_commits_its_own(grown: Grown) -> None:
    """--instances 2: 8 participants; each rollout in flight is on one server of each kind,
    each server's commit holds exactly the rollouts placed on it. (The run restores into 3
    servers of each kind, shared with the restore test: the placement is generation 1's.)"""
    text = grown.text
    assert "generation 1: 8 participants (2 of each kind), each rollout's session on one of each kind" in text
    assert "all 60 rollouts completed" in text and "stale_attempt on every participant" in text
    run = grown.workdir / "run"
    (checkpoint,) = [p for p in run.iterdir() if p.is_dir()]
    collection = msgspec.json.decode((checkpoint / "collection.json").read_bytes())
    continued = {e["rollout_id"] for e in collection["continued"]}
    assert continued and set(collection["placement"]) == continued
    assert sorted(collection["members"]) == sorted(f"{k}-{i}" for k in KINDS for i in range(2))
    for kind in KINDS:
        held: dict[str, set[str]] = {}
        for instance in (f"{kind}-0", f"{kind}-1"):
            where = checkpoint / "gym" / kind / instance
            manifest = msgspec.json.decode((where / "manifest.json").read_bytes())
            lines = (where / manifest["records_file"]).read_bytes().splitlines()
            held[instance] = {msgspec.json.decode(line)["episode_id"]["rollout_id"] for line in lines}
            assert held[instance] == {r for r, on in collection["placement"].items() if instance in on}
        assert (
            held[f"{kind}-0"].isdisjoint(held[f"{kind}-1"])
            and held[f"{kind}-0"] | held[f"{kind}-1"] == continued
        )
    assert f"{len(continued)} rollouts in flight at the checkpoint continued as attempt 1" in text


def test_a_stall_on_one_environment_server_of_three_is_named_with_its_blocker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fault stall with 3 servers of each kind: environment-1 alone is not ready; the demo's
    check names it, its blocker and no other server, and so does ``report`` from the log."""
    log = tmp_path / "run.jsonl"
    text = demo_text(
        capsys,
        "--instances",
        "3",
        "--rollouts",
        "60",
        "--concurrency",
        "6",
        "--fault",
        "stall",
        "--jsonl",
        str(log),
    )
    (check,) = [c for c in checks(text) if "aborted:" in c]
    assert "aborted: not ready at its deadline: environment/environment-1 blocked by 1 episode: r" in check
    assert "(injected: stall:environment-1, the one of 3 environment servers)" in check
    events = [e for _, e in read_events(log)]
    assert [(e.instance, e.blockers) for e in events if isinstance(e, PrepareNotReady)] == [
        ("environment-1", 1)
    ]
    capsys.readouterr()
    assert main(["report", str(log)]) == 0
    report = " ".join(capsys.readouterr().out.split())
    assert (
        "#1 checkpoint aborted: not ready at its deadline: environment/environment-1 blocked by 1 episode"
        in report
    )
    assert FAULT_ENV not in os.environ


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3)])
def test_a_restore_into_another_number_of_servers(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    before: int,
    after: int,
) -> None:
    """--restore-instances: more servers start the new ones empty; fewer restart the rollouts
    whose server is gone (a server reads only its own records) as attempt 1, and continue the rest.
    2 into 3 is the run the placement test reads too."""
    if (before, after) == (2, 3):
        shared: Grown = request.getfixturevalue("grown")
        text, workdir = shared.text, shared.workdir
    else:
        workdir = tmp_path
        text = demo_text(
            capsys,
            *("--instances", str(before), "--restore-instances", str(after)),
            *("--rollouts", "60", "--concurrency", "9", "--workdir", str(tmp_path)),
        )
    assert f"restoring into {after} servers of each kind" in text
    assert f"generation 2: {4 * after} participants ({after} of each kind)" in text
    assert "all 60 rollouts completed" in text and "no rollout ran twice" in text
    (checkpoint,) = [p for p in (workdir / "run").iterdir() if p.is_dir()]
    collection = msgspec.json.decode((checkpoint / "collection.json").read_bytes())
    gone = sorted(r for r, on in collection["placement"].items() if any(int(n[-1]) >= after for n in on))
    kept = len(collection["continued"]) - len(gone)
    assert f"{kept} rollouts in flight at the checkpoint continued as attempt 1" in text
    if before > after:
        assert gone, "with 9 in flight over 3 servers, some were on the one that is gone"
        assert f"{len(gone)} rollouts in flight on servers it lacks restart" in text
        assert f", {len(gone)} on servers the restored fleet lacks restarted as attempt 1" in text
    else:
        assert not gone and "restarted as attempt 1" not in text


def test_fleet_faults_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--fault slow needs peers and checkpoints to be judged over: refused before any work."""
    for argv, why in (
        (["--fault", "slow"], "use --instances 2 or more"),
        (["--fault", "slow", "--instances", "2", "--checkpoints", "2"], "use --checkpoints 3 or more"),
    ):
        assert main(["demo", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, argv


@pytest.mark.slow
def test_processes_stall_one_environment_server_of_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--processes --instances 2: eight participant processes; the stall fault reaches
    environment-1's process alone, and the check names it and its blocker."""
    text = demo_text(
        capsys,
        *("--instances", "2", "--processes", "--rollouts", "40", "--concurrency", "4"),
        *("--fault", "stall", "--workdir", str(tmp_path)),
    )
    assert "generation 1: 8 participants (2 of each kind)" in text
    (check,) = [c for c in checks(text) if "aborted:" in c]
    assert "not ready at its deadline: environment/environment-1 blocked by 1 episode: r" in check
    assert "(injected: stall:environment-1, the one of 2 environment servers)" in check
    logs = sorted(p.name for p in (tmp_path / "logs").glob("environment-*.gen1.jsonl"))
    assert logs == ["environment-0.gen1.jsonl", "environment-1.gen1.jsonl"]


def test_a_workdir_or_log_that_is_not_fresh_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --workdir that is a file or cannot be made was a traceback (exit 1); one holding another
    demo's run was resumed (its restore found two checkpoints: a traceback); a --jsonl holding
    events was appended to (report showed both runs). Each is one line, exit 2, before any work."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    used = tmp_path / "used"
    (used / "run").mkdir(parents=True)
    log = tmp_path / "old.jsonl"
    log.write_text('{"type":"refused"}\n')
    for argv, why in (
        (["--workdir", str(afile)], f"--workdir {afile} is not a folder"),
        (["--workdir", str(afile / "sub")], f"--workdir {afile / 'sub'}: cannot make it (Not a directory)"),
        (
            ["--workdir", str(used)],
            f"--workdir {used} holds another demo's files (run): the demo starts in a folder",
        ),
        (["--jsonl", str(log)], f"--jsonl {log} holds events already"),
    ):
        assert main(["demo", "--rollouts", "2", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, (argv, err)
    assert log.read_text() == '{"type":"refused"}\n'  # nothing appended
