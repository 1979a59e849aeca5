"""``participants.cli.demo.plan``: the demo's options checked, its checkpoints spread, its fault placed."""

from __future__ import annotations

import pytest

from ckpt_events.participants.cli.demo.plan import (
    DemoOptions,
    check_options,
    checkpoint_thresholds,
    deadline_s,
    fault_of,
    fault_plans,
    fleet_members,
    lease_target,
    stop_after,
)
from ckpt_events.participants.faults import NO_FAULTS, Fault, FaultPlan


def test_the_defaults_run() -> None:
    """The default options pass every check and take one checkpoint at 40 % of 1000 rollouts."""
    opts = DemoOptions()
    assert check_options(opts) is None
    assert (opts.checkpoint_count(), stop_after(opts), checkpoint_thresholds(opts)) == (1, 400, [])


@pytest.mark.parametrize(
    ("opts", "why"),
    [
        (DemoOptions(fault="nope"), "--fault 'nope' is not one of stall, lease, slow-restore, slow"),
        (DemoOptions(instances=0), "--instances and --restore-instances must be 1 or more"),
        (DemoOptions(restore_instances=0), "--instances and --restore-instances must be 1 or more"),
        (
            DemoOptions(instances=6000),
            "--instances 6000: at most 64 servers of each kind with one process on one machine "
            "(256 participants)",
        ),
        (
            DemoOptions(instances=2, restore_instances=17, processes=True),
            "--restore-instances 17: at most 16 servers of each kind with a process each on one machine "
            "(64 participants)",
        ),
        (
            DemoOptions(instances=65, restore_instances=2),
            "--instances 65: at most 64 servers of each kind with one process on one machine "
            "(256 participants)",
        ),
        (
            DemoOptions(workers=999999),
            "--workers 999999: 3999996 worker processes for 4 participants, at most 64 on one machine: "
            "lower --workers or --instances",
        ),
        (
            DemoOptions(instances=2, workers=2, restore_workers=9),
            "--restore-workers 9: 72 worker processes for 8 participants, at most 64 on one machine: "
            "lower --restore-workers or --instances",
        ),
        (
            DemoOptions(workers=2, restore_instances=9),
            "--workers 2: 72 worker processes for 36 participants, at most 64 on one machine: "
            "lower --workers or --restore-instances",
        ),
        (
            DemoOptions(checkpoints=0),
            "--checkpoints must be 1 or more, not 0 (the last one stops generation 1)",
        ),
        (
            DemoOptions(fault="slow"),
            "--fault slow makes one server slower than its peers: use --instances 2 or more",
        ),
        (
            DemoOptions(fault="slow", instances=2, checkpoints=2),
            "--fault slow is judged over the run's checkpoints: use --checkpoints 3 or more (8 by default)",
        ),
        (
            DemoOptions(fault="slow", instances=2, checkpoints=4),
            "--fault slow with --instances 2 needs --checkpoints 5 or more: a server slowest at each of 4 "
            "could be luck among 2 equals, and is not flagged",
        ),
        (
            DemoOptions(fault="stall", checkpoints=1),
            "--fault stall aborts the first checkpoint: use --checkpoints 2 or more "
            "so a later one publishes and is restored",
        ),
        (
            DemoOptions(rollouts=10, checkpoints=5),
            "--checkpoints 5 needs at least 5 rollouts done before the last checkpoint (4 are): "
            "raise --rollouts or --checkpoint-at",
        ),
    ],
)
def test_each_option_that_cannot_run_says_why(opts: DemoOptions, why: str) -> None:
    """One line per refused combination, naming the option to change."""
    assert check_options(opts) == why


@pytest.mark.parametrize(
    ("opts", "count"),
    [
        (DemoOptions(), 1),
        (DemoOptions(fault="stall"), 2),
        (DemoOptions(fault="lease"), 2),
        (DemoOptions(fault="slow"), 8),
        (DemoOptions(fault="slow-restore"), 1),
        (DemoOptions(fault="stall", checkpoints=3), 3),
    ],
)
def test_the_checkpoint_count_follows_the_fault_unless_given(opts: DemoOptions, count: int) -> None:
    """Aborting faults take two by default, the straggler fault eight, others one; ``--checkpoints`` wins."""
    assert opts.checkpoint_count() == count


def test_checkpoints_are_spread_evenly_before_the_last_and_one_rollout_stays_in_flight() -> None:
    """Thresholds split the stopping point evenly; ``checkpoint_at=1`` still leaves one rollout running."""
    assert checkpoint_thresholds(DemoOptions(checkpoints=4)) == [100, 200, 300]
    assert checkpoint_thresholds(DemoOptions(rollouts=10, checkpoints=3)) == [1, 2]
    assert stop_after(DemoOptions(rollouts=10, checkpoint_at=1.0)) == 9
    assert stop_after(DemoOptions(rollouts=10, checkpoint_at=0.0)) == 0


def test_servers_of_the_restored_generation_default_to_the_first_s() -> None:
    """``restore_instances`` counts for generation 2 only, and falls back to ``instances``."""
    assert (DemoOptions(instances=3).servers(1), DemoOptions(instances=3).servers(2)) == (3, 3)
    opts = DemoOptions(instances=3, restore_instances=1)
    assert (opts.servers(1), opts.servers(2)) == (3, 1)


def test_fleet_members_are_the_kinds_own_instances_or_numbered_kind_by_kind() -> None:
    """One server of each kind keeps its default name; several are ``<kind>-<i>``, kind by kind."""
    assert fleet_members(1) == (
        ("environment", "environment-0"),
        ("model", "model-0"),
        ("agent", "agent-0"),
        ("resources", "resources-0"),
    )
    assert fleet_members(2)[:4] == (
        ("environment", "environment-0"),
        ("environment", "environment-1"),
        ("model", "model-0"),
        ("model", "model-1"),
    )
    assert len(fleet_members(3)) == 12


def test_the_fault_hits_the_middle_server_of_its_kind() -> None:
    """``<kind>-<N // 2>``; a restore's fault picks among the servers both generations have."""
    assert fault_of(DemoOptions()) is None
    assert fault_of(DemoOptions(fault="stall", instances=4)) == Fault("stall", "environment-2")
    assert fault_of(DemoOptions(fault="stall")) == Fault("stall", "environment-0")
    assert fault_of(DemoOptions(fault="slow", instances=3)) == Fault("slow", "environment-1", factor=5.0)
    restore = DemoOptions(fault="slow-restore", instances=4, restore_instances=2)
    assert fault_of(restore) == Fault("slow-restore", "model-1", seconds=0.2)
    assert fault_of(DemoOptions(fault="lease", instances=4)) == Fault("lease", None, seconds=3.0)


def test_the_slow_restore_sleeps_longer_per_record_on_one_of_several_servers() -> None:
    """The slowed model server holds about 1/N of the records with N of each kind, so each
    sleeps N times 50 ms (at most as many times as rollouts in flight): its read takes about as
    long as with one server, and still dominates the restore (``--instances 8`` failed)."""
    assert fault_of(DemoOptions(fault="slow-restore")) == Fault("slow-restore", "model-0", seconds=0.05)
    eight = fault_of(DemoOptions(fault="slow-restore", instances=8))
    assert eight is not None and eight.instance == "model-4" and eight.seconds == pytest.approx(0.4)
    capped = fault_of(DemoOptions(fault="slow-restore", instances=32, concurrency=4))
    assert capped is not None and capped.seconds == pytest.approx(0.2)
    # Generation 1's servers wrote the records; the restored fleet's size does not change them.
    grown = fault_of(DemoOptions(fault="slow-restore", instances=2, restore_instances=6))
    assert grown is not None and grown.seconds == pytest.approx(0.1)


def test_the_lease_target_is_named_only_for_the_lease_fault_among_several_servers() -> None:
    """With one server per kind every lease is short (``None``); other faults have no target."""
    assert lease_target(DemoOptions(fault="lease", instances=4)) == "environment-2"
    assert lease_target(DemoOptions(fault="lease")) is None
    assert lease_target(DemoOptions(fault="stall", instances=4)) is None


def test_fault_plans_put_the_fault_on_the_generation_it_hits() -> None:
    """Stall, lease and slow hit generation 1; slow-restore generation 2; none: ``NO_FAULTS`` twice."""
    assert fault_plans(DemoOptions()) == (NO_FAULTS, NO_FAULTS)
    first, second = fault_plans(DemoOptions(fault="stall", instances=2))
    assert (first, second) == (FaultPlan(Fault("stall", "environment-1")), NO_FAULTS)
    first, second = fault_plans(DemoOptions(fault="slow-restore"))
    assert (first, second) == (NO_FAULTS, FaultPlan(Fault("slow-restore", "model-0", seconds=0.05)))
    assert second.environ() == {"CKPT_EVENTS_FAULT": "slow-restore:model-0:0.05"}


def test_straggler_checkpoints_is_where_the_report_s_rule_can_flag() -> None:
    """``--instances 2 --checkpoints 3 --fault slow`` ran and then failed: a server slowest at all
    3 of 3 is a 1-in-8 chance among 2 equals, over the report's 5%; 5 of 5 is 1 in 32."""
    from ckpt_events.participants.cli.demo.plan import straggler_checkpoints
    from ckpt_events.participants.cli.report.trends import STRAGGLER_CHANCE, binomial_tail

    for instances in (2, 3, 4, 9):
        needed = straggler_checkpoints(instances)
        assert binomial_tail(needed, needed, 1 / instances) < STRAGGLER_CHANCE
        assert needed == 3 or binomial_tail(needed - 1, needed - 1, 1 / instances) >= STRAGGLER_CHANCE
    assert (
        straggler_checkpoints(2) == 5
        and check_options(DemoOptions(fault="slow", instances=2, checkpoints=5)) is None
    )


def test_only_the_aborting_faults_shorten_the_deadline() -> None:
    """stall and lease abort at a 2 s deadline; slow-restore and slow (and no fault) keep 30 s:
    the short one failed generation 1's commit of 32 participants under load."""
    got = {
        fault: deadline_s(DemoOptions(fault=fault))
        for fault in (None, "stall", "lease", "slow-restore", "slow")
    }
    assert got == {None: 30.0, "stall": 2.0, "lease": 2.0, "slow-restore": 30.0, "slow": 30.0}
