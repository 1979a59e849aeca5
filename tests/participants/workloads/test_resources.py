"""The resources workload (``participants.workloads.resources``): a counter and a short document per
session, checkpointed and checked."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.records import DOCUMENT_LINES
from ckpt_events.participants.workloads.resources import ResourcesWorkload


async def test_the_document_keeps_its_last_lines_and_a_record_off_its_boundary_is_refused() -> None:
    """Each unit bumps the counter and appends a line, the document keeps the last 32; the record
    reads back; a counter that is not the boundary is refused."""
    workload = ResourcesWorkload(Telemetry(None, kind="resources", instance="resources-0"), request_seconds=0)
    steps = DOCUMENT_LINES + 3
    workload.start(EpisodeId("r1"), steps)
    for _ in range(steps):
        await workload.advance(EpisodeId("r1"))
    state = workload.episodes["r1"].state
    assert state.counter == steps and len(state.document) == DOCUMENT_LINES
    assert state.document[0] == "line 4 of r1" and state.document[-1] == f"line {steps} of r1"
    assert workload.counts() == {"inflight": 0, "sessions": 1}
    record = workload.to_record(workload.episodes["r1"])
    assert workload.check_record(record) == state
    with pytest.raises(InvalidCheckpointError, match="counter or document"):
        workload.check_record(msgspec.structs.replace(record, counter=steps - 1))
