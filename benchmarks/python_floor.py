"""The least a pure-Python implementation of the span API can do, as a reference row.

``FloorTelemetry`` has ``Telemetry``'s call shape (``operation(name, *, checkpoint_id=...)``,
``op.step(name)``, ``with``, keyword-only ``set(...)`` with the same parameters) and does
only what any implementation must: draw the ids, read the clock on entry and exit, store
each value, and hand the finished handle to a list. No validation, no routing, no flags,
no events, no delivery. ``bench_sinks`` times it beside the real emitting side, so the
table shows how much of our cost is the interpreter's floor for this API.
"""

from __future__ import annotations

from random import getrandbits
from time import time_ns
from types import TracebackType
from typing import Any

import msgspec

__all__ = ["FloorTelemetry", "emit"]


class FloorStep(msgspec.Struct, gc=False):
    done: list[Any]
    step: str
    trace_id: int
    span_id: int
    parent_span_id: int
    start_ns: int = 0
    end_ns: int = 0
    records: int | None = None
    bytes: int | None = None
    calls: int | None = None
    cut_durable_prefix: int | None = None
    cut_durable_failure: int | None = None

    def __enter__(self) -> FloorStep:
        self.start_ns = time_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end_ns = time_ns()
        self.done.append(self)

    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        calls: int | None = None,
        cut_durable_prefix: int | None = None,
        cut_durable_failure: int | None = None,
    ) -> None:
        if records is not None:
            self.records = records
        if bytes is not None:
            self.bytes = bytes
        if calls is not None:
            self.calls = calls
        if cut_durable_prefix is not None:
            self.cut_durable_prefix = cut_durable_prefix
        if cut_durable_failure is not None:
            self.cut_durable_failure = cut_durable_failure


class FloorOperation(msgspec.Struct, gc=False):
    done: list[Any]
    operation: str
    checkpoint_id: str | None
    trace_id: int
    span_id: int
    start_ns: int = 0
    end_ns: int = 0
    records: int | None = None
    bytes: int | None = None
    phase: str | None = None
    blockers: int | None = None
    episodes: int | None = None
    rollouts: int | None = None
    received_ns: int | None = None
    loop_lag_ms: float | None = None

    def __enter__(self) -> FloorOperation:
        self.start_ns = time_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end_ns = time_ns()
        self.done.append(self)

    def step(self, step: str) -> FloorStep:
        return FloorStep(self.done, step, self.trace_id, getrandbits(64), self.span_id)

    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        phase: str | None = None,
        blockers: int | None = None,
        episodes: int | None = None,
        rollouts: int | None = None,
        received_ns: int | None = None,
        loop_lag_ms: float | None = None,
    ) -> None:
        if records is not None:
            self.records = records
        if bytes is not None:
            self.bytes = bytes
        if phase is not None:
            self.phase = phase
        if blockers is not None:
            self.blockers = blockers
        if episodes is not None:
            self.episodes = episodes
        if rollouts is not None:
            self.rollouts = rollouts
        if received_ns is not None:
            self.received_ns = received_ns
        if loop_lag_ms is not None:
            self.loop_lag_ms = loop_lag_ms


class FloorTelemetry:
    """Hands out floor handles; ``done`` collects the finished ones (clear it between rounds)."""

    def __init__(self) -> None:
        self.done: list[Any] = []

    def operation(
        self,
        operation: str,
        *,
        checkpoint_id: str | None = None,
        traceparent: str | None = None,
        parent: object = None,
    ) -> FloorOperation:
        return FloorOperation(self.done, operation, checkpoint_id, getrandbits(128), getrandbits(64))


def emit(tel: FloorTelemetry, n: int) -> None:
    """The benchmark's operation shape (two steps, three ``set`` calls), ``n`` times."""
    for _ in range(n):
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("export") as step:
                step.set(records=5)
            with op.step("write") as step:
                step.set(records=5, bytes=2048)
            op.set(records=5, bytes=2048)
