"""A checkpoint and a restore emitted through the real emitter, with the gaps a report must name.

Time is a clock of the emitter's that moves only by the pauses below, not the wall clock: under
load, a preemption between two spans (the test sharing one core with two busy loops) was
time no span names, and the report rightly called it unattributed (4.2 ms between the last
resume and the root's end, 12 ms before ``coordinate.prepare``: 3 of 60 runs past 5%). Here
every part lasts exactly what the pauses say, run after run."""

from __future__ import annotations

import time
from typing import Any

from ckpt_events import Telemetry
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.testing import capture_events


class _PausedClock:
    """Nanoseconds since the epoch for every stamp of the emitter (``Telemetry(clock=...)``,
    which then times the spans too) and every arrival: each reading 1 us after the last, as
    reads of a real clock are apart (tied stamps are another test: a log's order must not
    matter), and ``pause`` moves it on."""

    def __init__(self) -> None:
        self.now_ns = time.time_ns()

    def __call__(self) -> int:
        self.now_ns += 1_000
        return self.now_ns

    def pause(self, ms: float) -> None:
        self.now_ns += round(ms * 1_000_000)


async def checkpoint_and_restore() -> list[Any]:
    """Events of one collection checkpoint (prepare stages, commit, renew, publish, resume) and
    one collection restore, with participants' arrival stamps and loop lag."""
    clock = _PausedClock()
    _pause = clock.pause
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination", clock=clock)
        who = {
            kind: Telemetry(bus, kind=kind, instance=f"{kind.value}-0", clock=clock) for kind in PREPARE_ORDER
        }

        def call(parent: Any, kind: Any, operation: str, cid: str, steps: tuple[str, ...] = ()) -> None:
            _pause(1)  # request on its way
            received = clock()
            _pause(0.5)  # queued in the participant
            with who[kind].operation(operation, checkpoint_id=cid, traceparent=parent.traceparent()) as op:
                op.set(received_ns=received, loop_lag_ms=1.5)
                for step in steps:
                    with op.step(step):
                        _pause(1)
                _pause(0.5)
            _pause(0.5)  # reply on its way

        with ctl.collection("checkpoint", checkpoint_id="c1") as coll:
            with ctl.coordinate("prepare", checkpoint_id="c1", parent=coll) as coord:
                for kind in PREPARE_ORDER:
                    with coord.stage(kind) as stage:
                        call(stage, kind, "prepare", "c1", ("wait_ready",))
            for operation, steps in (("commit", ("export", "write")), ("renew", ())):
                with ctl.coordinate(operation, checkpoint_id="c1", parent=coll) as coord:
                    for kind in PREPARE_ORDER:
                        call(coord, kind, operation, "c1", steps)
            with ctl.collection("publish", checkpoint_id="c1", parent=coll):
                _pause(3)
            with ctl.coordinate("resume", checkpoint_id="c1", parent=coll) as coord:
                for kind in reversed(PREPARE_ORDER):
                    call(coord, kind, "resume", "c1")
            _pause(0.3)  # nothing names this: unattributed
        with ctl.collection("restore", checkpoint_id="c1") as coll:
            for operation, steps in (("restore", ("read", "install")), ("resume", ())):
                with ctl.coordinate(operation, checkpoint_id="r1", parent=coll) as coord:
                    for kind in PREPARE_ORDER:
                        call(coord, kind, operation, "r1", steps)
    return events
