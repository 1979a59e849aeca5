"""``ckpt-events demo --instances N`` with a fault of time on one server: a lease, a slow commit,
a slow restore (apart from test_instances.py so that two workers share the demo runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import LeaseExpired
from ckpt_events.sinks.jsonl import read_events
from tests.participants.cli.demo.instances import checks, demo_text


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # One check per line: rich wraps at $COLUMNS (80 when piped).
    monkeypatch.setenv("COLUMNS", "250")


@pytest.mark.slow
def test_a_lease_fault_on_one_server_expires_that_lease_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fault lease with 2 servers of each kind: only environment-1's lease is short, so only
    it expires, and the check names it among its peers; the restore is into as many servers."""
    log = tmp_path / "run.jsonl"
    text = demo_text(
        capsys,
        "--instances",
        "2",
        "--rollouts",
        "40",
        "--concurrency",
        "4",
        "--fault",
        "lease",
        "--jsonl",
        str(log),
    )
    assert "generation 2: 8 participants (2 of each kind)" in text
    (check,) = [c for c in checks(text) if "aborted:" in c]
    assert "aborted: lease expired on environment/environment-1 in phase prepared" in check
    assert "(injected: lease:3, the one of 2 environment servers)" in check
    events = [e for _, e in read_events(log)]
    assert [e.instance for e in events if isinstance(e, LeaseExpired)] == ["environment-1"]


@pytest.mark.slow
def test_a_slow_server_is_flagged_as_the_only_straggler(capsys: pytest.CaptureFixture[str]) -> None:
    """--fault slow with 3 servers of each kind over 6 checkpoints: environment-1's commits
    write 5x slower, the run's trends flag it as its kind's straggler, and no other server."""
    text = demo_text(capsys, "--instances", "3", "--checkpoints", "6", "--rollouts", "150", "--fault", "slow")
    assert "6 of 6 checkpoints published" in text
    (check,) = [c for c in checks(text) if "injected: slow" in c]
    assert check.startswith("environment/environment-1 was the slowest environment in ")
    assert "and no other server (injected: slow:environment-1:5)" in check
    assert text.count("flag: straggler: ") == 1


@pytest.mark.slow
def test_a_slow_restore_on_one_of_eight_servers_still_dominates_the_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fault slow-restore --instances 8: model-4 holds 2 of the 16 rollouts in flight; at 50 ms
    a record its read was a third of the restore of 32 participants, and the demo exited 2
    ("not dominated by model-4's read") on a report that named model-4 rightly. Its read is now
    judged against the 31 other participants' reads: under load its 819 ms read was 48% of the
    restore, and the demo failed a run that showed the fault plainly."""
    text = demo_text(
        capsys,
        *("--instances", "8", "--rollouts", "60", "--fault", "slow-restore", "--workdir", str(tmp_path)),
    )
    (check,) = [c for c in checks(text) if "injected: slow-restore" in c]
    assert "read on model/model-4 " in check, check
    assert "x the median of the other 31 participants' reads" in check, check
    assert "(injected: slow-restore:model-4:0.4)" in check, check
