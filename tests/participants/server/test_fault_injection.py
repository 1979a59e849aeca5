"""The demo's failures: a ``FaultPlan`` passed in, parsed in one place (``CKPT_EVENTS_FAULT``
is read only by ``FaultPlan.from_environ``, at a process's edge), nothing injected unless asked,
a wrong value refused in one line."""

from __future__ import annotations

import time

import anyio
import pytest

from ckpt_events import ConfigurationError
from ckpt_events.participants.faults import (
    FAULT_ENV,
    NO_FAULTS,
    Fault,
    FaultPlan,
    parse_fault,
    slow_down,
)


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("stall:environment-0", Fault("stall", "environment-0")),
        ("lease", Fault("lease", None, 3.0)),
        ("lease:1.5", Fault("lease", None, 1.5)),
        ("slow-restore:model-0", Fault("slow-restore", "model-0", 0.05)),
        ("slow-restore:model-0:0.2", Fault("slow-restore", "model-0", 0.2)),
        ("slow:environment-1", Fault("slow", "environment-1", factor=5.0)),
        ("slow:environment-1:2.5", Fault("slow", "environment-1", factor=2.5)),
    ],
)
def test_each_fault_parses_and_prints_back(value: str, fault: Fault) -> None:
    assert parse_fault(value) == fault
    assert parse_fault(str(fault)) == fault


@pytest.mark.parametrize(
    "value",
    [
        "crash",
        "stall",
        "stall:",
        "lease:0",
        "lease:nan",
        "lease:x",
        "stall:e-0:1",
        "lease:1:2",
        "slow",
        "slow:e-0:1",
        "slow:e-0:0.5",
        "slow:e-0:5:1",
    ],
)
def test_a_wrong_value_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError, match=FAULT_ENV) as caught:
        parse_fault(value)
    assert "stall:INSTANCE" in str(caught.value) and "\n" not in str(caught.value)


def test_nothing_is_injected_unless_asked() -> None:
    """``NO_FAULTS`` (every default) and an unset or blank variable inject nothing."""
    for plan in (NO_FAULTS, FaultPlan.from_environ({}), FaultPlan.from_environ({FAULT_ENV: " "})):
        assert plan == NO_FAULTS and plan.environ() == {FAULT_ENV: ""}  # blank: none inherited
        assert plan.lease_stall() == 0.0 and plan.read_pause("model-0") is None
        assert plan.write_factor("model-0") == 1.0 and not plan.stalls("model-0")
        plan.on_step("make_dirs")  # the store's hook does nothing


def test_each_plan_hits_its_own_instance_only() -> None:
    """Each question is answered for one instance: the fault's, and no other."""
    plan = FaultPlan.from_environ({FAULT_ENV: "slow-restore:model-0:0.001"})
    assert plan.read_pause("environment-0") is None and plan.lease_stall() == 0.0
    assert plan.read_pause("model-0") is not None
    lease = FaultPlan(parse_fault("lease:2"))
    assert lease.lease_stall() == 2.0 and lease.read_pause("model-0") is None
    stall = FaultPlan.parse("stall:environment-0")
    assert stall.stalls("environment-0") and not stall.stalls("environment-1")


def test_a_plan_passes_to_a_child_process_through_its_environment() -> None:
    """What the demo hands a server or worker process is what that process reads back."""
    plan = FaultPlan(parse_fault("slow:environment-1:3"))
    assert plan.environ() == {FAULT_ENV: "slow:environment-1:3"}
    assert FaultPlan.from_environ(plan.environ()) == plan


async def test_slow_makes_one_instance_write_that_many_times_as_long() -> None:
    """slow:INSTANCE:FACTOR: only that instance's factor is above 1, and slow_down stretches what
    began at ``started`` to that many times its length."""
    plan = FaultPlan(parse_fault("slow:environment-1:3"))
    assert plan.write_factor("environment-1") == 3.0 and plan.write_factor("environment-0") == 1.0
    assert plan.lease_stall() == 0.0 and plan.read_pause("environment-1") is None
    started = time.monotonic()
    await anyio.sleep(0.05)
    await slow_down(3.0, started)
    assert time.monotonic() - started >= 0.15
    started = time.monotonic()
    await slow_down(1.0, started - 10)  # no fault: no wait, however long the work took
    assert time.monotonic() - started < 0.05
