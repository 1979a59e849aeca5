"""Injected failures: the four a checkpoint fleet meets, made to happen for real on demand.

Set ``CKPT_EVENTS_FAULT`` (read here and nowhere else; nothing is injected without it):

- ``stall:INSTANCE``: that participant holds one unit of work mid-step until a checkpoint has
  come and gone, so that checkpoint's prepare is not ready at its deadline
  (``prepare_not_ready``) and aborts. Once per process.
- ``lease[:SECONDS]``: the controller waits ``SECONDS`` (3) between a ready prepare and the
  commit, past the participants' lease, so they resume on their own (``lease_expired``) and
  the checkpoint aborts. Once per coordinator.
- ``slow-restore:INSTANCE[:SECONDS]``: that participant's checkpoint read sleeps ``SECONDS``
  (0.05) per record, so the restore waits on its read.
- ``slow:INSTANCE[:FACTOR]``: that participant's commit ``write`` step takes ``FACTOR`` (5)
  times as long as it did (it sleeps the difference once the write is done), at every
  checkpoint: one server consistently slower than its peers of the same kind, a straggler.

``ckpt-events demo --fault`` sets it for its servers (in-process ones and processes alike).
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio

from ckpt_events import ConfigurationError

__all__ = [
    "FAULT_ENV",
    "FAULT_MODES",
    "Fault",
    "active_fault",
    "controller_stall",
    "hold_one_step",
    "parse_fault",
    "read_pause",
    "slow_down",
    "stall_before_commit",
    "write_factor",
]

FAULT_ENV: Final = "CKPT_EVENTS_FAULT"
FAULT_MODES: Final = ("stall", "lease", "slow-restore", "slow")
_DEFAULT_SECONDS: Final = {"lease": 3.0, "slow-restore": 0.05}
_DEFAULT_FACTOR: Final = {"slow": 5.0}
_WITH_INSTANCE: Final = ("stall", "slow-restore", "slow")
#: The longest a stalled step is held, whatever happens to the checkpoint it blocks.
_HOLD_LIMIT: Final = 60.0
#: The coordinators that took their lease stall already.
_stalled: weakref.WeakSet[object] = weakref.WeakSet()


@dataclass(frozen=True)
class Fault:
    """One injected failure: its mode, the participant instance it hits, its seconds (``lease``,
    ``slow-restore``) or its factor (``slow``)."""

    mode: str
    instance: str | None = None
    seconds: float = 0.0
    factor: float = 1.0

    def hits(self, mode: str, instance: str | None = None) -> bool:
        return self.mode == mode and (instance is None or self.instance == instance)

    def __str__(self) -> str:
        parts = [self.mode, *([self.instance] if self.instance else [])]
        if self.mode in _DEFAULT_SECONDS:
            parts.append(f"{self.seconds:g}")
        if self.mode in _DEFAULT_FACTOR:
            parts.append(f"{self.factor:g}")
        return ":".join(parts)


def parse_fault(value: str) -> Fault:
    """``stall:INSTANCE``, ``lease[:SECONDS]``, ``slow-restore:INSTANCE[:SECONDS]`` or
    ``slow:INSTANCE[:FACTOR]`` (a factor above 1)."""
    mode, *rest = value.strip().split(":")
    usage = (
        f"{FAULT_ENV}={value!r} is not a fault: use stall:INSTANCE, lease[:SECONDS], "
        "slow-restore:INSTANCE[:SECONDS] or slow:INSTANCE[:FACTOR]"
    )
    instance = None
    if mode in _WITH_INSTANCE:
        if not rest or not rest[0]:
            raise ConfigurationError(usage)
        instance, *rest = rest
    elif mode != "lease":
        raise ConfigurationError(usage)
    if len(rest) > (1 if mode in _DEFAULT_SECONDS or mode in _DEFAULT_FACTOR else 0):
        raise ConfigurationError(usage)
    seconds = _DEFAULT_SECONDS.get(mode, 0.0)
    factor = _DEFAULT_FACTOR.get(mode, 1.0)
    if rest:
        try:
            number = float(rest[0])
        except ValueError:
            raise ConfigurationError(usage) from None
        if not math.isfinite(number) or number <= (1 if mode in _DEFAULT_FACTOR else 0):
            raise ConfigurationError(usage)
        if mode in _DEFAULT_FACTOR:
            factor = number
        else:
            seconds = number
    return Fault(mode, instance, seconds, factor)


def active_fault(environ: Mapping[str, str] | None = None) -> Fault | None:
    """The fault ``$CKPT_EVENTS_FAULT`` asks for, or ``None`` (unset or empty)."""
    value = (os.environ if environ is None else environ).get(FAULT_ENV, "")
    return parse_fault(value) if value.strip() else None


def hold_one_step(workload: Any, instance: str) -> None:
    """With ``stall:<instance>``: hold the first unit of work of ``workload`` until admission
    has closed and reopened (a checkpoint came and went), so that checkpoint is not ready."""
    fault = active_fault()
    if fault is None or not fault.hits("stall", instance):
        return
    work: Callable[[Any], Awaitable[None]] = workload.work
    held = False

    async def work_then_hold(episode: Any) -> None:
        nonlocal held
        await work(episode)
        if held:
            return
        held = True
        with anyio.move_on_after(_HOLD_LIMIT):
            while workload.admission_open:
                await anyio.sleep(0.01)
            await workload.wait_reopened()

    # An instance attribute shadows the method: the base class calls self.work(episode).
    setattr(workload, "work", work_then_hold)  # noqa: B010


def read_pause(instance: str) -> Callable[[int], None] | None:
    """With ``slow-restore:<instance>``: a function sleeping the fault's seconds per record read
    (called in the read's thread); otherwise ``None``."""
    fault = active_fault()
    if fault is None or not fault.hits("slow-restore", instance):
        return None
    seconds = fault.seconds
    return lambda records: time.sleep(seconds * records)


def write_factor(instance: str) -> float:
    """With ``slow:<instance>``: how many times as long that participant's commit write takes
    (read once, when its server is built); otherwise 1."""
    fault = active_fault()
    return fault.factor if fault is not None and fault.hits("slow", instance) else 1.0


async def slow_down(factor: float, started: float) -> None:
    """Sleep so that what began at ``started`` (``time.monotonic()``) takes ``factor`` times as
    long as it has so far; with ``factor`` 1 (no fault), return at once."""
    if factor > 1.0:
        await anyio.sleep((factor - 1.0) * (time.monotonic() - started))


async def stall_before_commit(coordinator: object) -> None:
    """With ``lease``: wait ``controller_stall()`` seconds, once per ``coordinator`` (its first
    checkpoint), between its ready prepare and its commit."""
    if (seconds := controller_stall()) and coordinator not in _stalled:
        _stalled.add(coordinator)
        await anyio.sleep(seconds)


def controller_stall() -> float:
    """With ``lease``: how long the controller waits between prepare and commit; else 0."""
    fault = active_fault()
    return fault.seconds if fault is not None and fault.hits("lease") else 0.0
