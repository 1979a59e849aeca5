"""Injected failures: the four a checkpoint fleet meets, made to happen for real on demand.

A ``FaultPlan`` says what is injected; ``NO_FAULTS`` (the default everywhere) injects nothing.
It is a value passed in: to ``create_app(faults=...)`` (the participant servers and their
workers), to ``Coordinator(faults=...)`` (the controller), or built by a test. Nothing in a
request path reads the environment: a process reads ``CKPT_EVENTS_FAULT`` once, at its edge
(``FaultPlan.from_environ``: ``ckpt-events serve`` and a worker process at start-up, since the
demo passes a fault to its child processes that way). The faults:

- ``stall:INSTANCE``: that participant holds one unit of work mid-step until a checkpoint has
  come and gone, so that checkpoint's prepare is not ready at its deadline
  (``prepare_not_ready``) and aborts. Once per process doing that participant's work: the
  server, or each of its worker processes (``--workers 2``: two episodes held).
- ``lease[:SECONDS]``: the controller waits ``SECONDS`` (3) between a ready prepare and the
  commit, past the participants' lease, so they resume on their own (``lease_expired``) and
  the checkpoint aborts. Once per coordinator.
- ``slow-restore:INSTANCE[:SECONDS]``: that participant's checkpoint read sleeps ``SECONDS``
  (0.05) per record, so the restore waits on its read.
- ``slow:INSTANCE[:FACTOR]``: that participant's commit ``write`` step takes ``FACTOR`` (5)
  times as long as it did (it sleeps the difference once the write is done), at every
  checkpoint: one server consistently slower than its peers of the same kind, a straggler.

A plan's ``on_step`` is the disk's fault seam: the store calls it before each step of a
commit that touches the disk (``store.COMMIT_STEPS``), and a test's hook raises at one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio

from ckpt_events import ConfigurationError
from ckpt_events.checks import shown

__all__ = [
    "FAULT_ENV",
    "FAULT_MODES",
    "NO_FAULTS",
    "Fault",
    "FaultPlan",
    "StepHook",
    "hold_one_step",
    "no_step",
    "parse_fault",
    "slow_down",
]

FAULT_ENV: Final = "CKPT_EVENTS_FAULT"
FAULT_MODES: Final = ("stall", "lease", "slow-restore", "slow")
_DEFAULT_SECONDS: Final = {"lease": 3.0, "slow-restore": 0.05}
_DEFAULT_FACTOR: Final = {"slow": 5.0}
_WITH_INSTANCE: Final = ("stall", "slow-restore", "slow")
#: The longest a stalled step is held, whatever happens to the checkpoint it blocks.
_HOLD_LIMIT: Final = 60.0
#: Called with a commit step's name (``store.COMMIT_STEPS``) before the store takes it.
StepHook = Callable[[str], None]


def no_step(name: str) -> None:
    """The ``StepHook`` that injects nothing (every store function's default)."""


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
        f"{FAULT_ENV}={shown(value)} is not a fault: use stall:INSTANCE, lease[:SECONDS], "
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


@dataclass(frozen=True)
class FaultPlan:
    """What is injected: ``fault`` (``None``: nothing) and the store's ``on_step`` hook (called
    before each commit step that touches the disk; by default ``no_step``). Each question below
    is answered for one participant instance."""

    fault: Fault | None = None
    on_step: StepHook = no_step

    @classmethod
    def parse(cls, value: str | None) -> FaultPlan:
        """The plan of ``value`` (``parse_fault``'s syntax); unset or blank: ``NO_FAULTS``."""
        return cls(parse_fault(value)) if value is not None and value.strip() else NO_FAULTS

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> FaultPlan:
        """The plan ``$CKPT_EVENTS_FAULT`` asks for (``environ``: by default ``os.environ``); read
        once, by a process at start-up."""
        return cls.parse((os.environ if environ is None else environ).get(FAULT_ENV))

    def environ(self) -> dict[str, str]:
        """What a child process's environment needs to inject ``fault`` too, and nothing else:
        with no fault, the variable blank, so a ``CKPT_EVENTS_FAULT`` left in the parent's
        environment is not inherited (``demo --processes`` without ``--fault`` stalled on one)."""
        return {FAULT_ENV: "" if self.fault is None else str(self.fault)}

    def _hit(self, mode: str, instance: str | None = None) -> Fault | None:
        fault = self.fault
        return fault if fault is not None and fault.hits(mode, instance) else None

    def stalls(self, instance: str) -> bool:
        """``stall:<instance>``: hold one step of that participant's work."""
        return self._hit("stall", instance) is not None

    def read_pause(self, instance: str) -> Callable[[int], None] | None:
        """With ``slow-restore:<instance>``: a function sleeping the fault's seconds per record read
        (called in the read's thread); otherwise ``None``."""
        if (fault := self._hit("slow-restore", instance)) is None:
            return None
        seconds = fault.seconds
        return lambda records: time.sleep(seconds * records)

    def write_factor(self, instance: str) -> float:
        """With ``slow:<instance>``: how many times as long that participant's commit write takes;
        otherwise 1."""
        fault = self._hit("slow", instance)
        return 1.0 if fault is None else fault.factor

    def lease_stall(self) -> float:
        """With ``lease``: how long the controller waits between prepare and commit; else 0."""
        fault = self._hit("lease")
        return 0.0 if fault is None else fault.seconds


#: The plan that injects nothing: every default.
NO_FAULTS: Final = FaultPlan()


def hold_one_step(workload: Any, instance: str, faults: FaultPlan) -> None:
    """With ``stall:<instance>``: hold the first unit of work of ``workload`` until admission
    has closed and reopened (a checkpoint came and went), so that checkpoint is not ready."""
    if not faults.stalls(instance):
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


async def slow_down(factor: float, started: float) -> None:
    """Sleep so that what began at ``started`` (``time.monotonic()``) takes ``factor`` times as
    long as it has so far; with ``factor`` 1 (no fault), return at once."""
    if factor > 1.0:
        await anyio.sleep((factor - 1.0) * (time.monotonic() - started))
