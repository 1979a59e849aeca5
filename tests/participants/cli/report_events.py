"""A checkpoint and a restore emitted through the real emitter, with the gaps a report must name."""

from __future__ import annotations

import time
from typing import Any

from ckpt_events import Telemetry
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.testing import capture_events


def _pause(ms: float) -> None:
    time.sleep(ms / 1000)  # a span needs a measurable duration; sleeps keep the shapes stable


async def checkpoint_and_restore() -> list[Any]:
    """Events of one collection checkpoint (prepare stages, commit, renew, publish, resume) and
    one collection restore, with participants' arrival stamps and loop lag."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        who = {kind: Telemetry(bus, kind=kind, instance=f"{kind.value}-0") for kind in PREPARE_ORDER}

        def call(parent: Any, kind: Any, operation: str, cid: str, steps: tuple[str, ...] = ()) -> None:
            _pause(1)  # request on its way
            received = time.time_ns()
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
