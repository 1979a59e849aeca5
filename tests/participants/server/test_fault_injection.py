"""The demo's failure hook ``CKPT_EVENTS_FAULT``: parsed in one place, never active unless set,
refused in one line."""

from __future__ import annotations

import time

import anyio
import pytest

from ckpt_events import ConfigurationError
from ckpt_events.participants.faults import (
    FAULT_ENV,
    Fault,
    active_fault,
    controller_stall,
    parse_fault,
    read_pause,
    slow_down,
    write_factor,
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


def test_nothing_is_injected_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert active_fault() is None and controller_stall() == 0.0 and read_pause("model-0") is None
    monkeypatch.setenv(FAULT_ENV, " ")
    assert active_fault() is None
    monkeypatch.setenv(FAULT_ENV, "slow-restore:model-0:0.001")
    assert read_pause("environment-0") is None and controller_stall() == 0.0
    pause = read_pause("model-0")
    assert pause is not None
    monkeypatch.setenv(FAULT_ENV, "lease:2")
    assert controller_stall() == 2.0 and read_pause("model-0") is None


async def test_slow_makes_one_instance_write_that_many_times_as_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """slow:INSTANCE:FACTOR: only that instance's factor is above 1, and slow_down stretches what
    began at ``started`` to that many times its length."""
    monkeypatch.setenv(FAULT_ENV, "slow:environment-1:3")
    assert write_factor("environment-1") == 3.0 and write_factor("environment-0") == 1.0
    assert controller_stall() == 0.0 and read_pause("environment-1") is None
    started = time.monotonic()
    await anyio.sleep(0.05)
    await slow_down(3.0, started)
    assert time.monotonic() - started >= 0.15
    started = time.monotonic()
    await slow_down(1.0, started - 10)  # no fault: no wait, however long the work took
    assert time.monotonic() - started < 0.05
