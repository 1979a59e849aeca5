"""The agent workload (``participants.workloads.agent``): one turn per unit of work, its history
checkpointed and checked."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.agent import AgentWorkload


async def test_turns_depend_on_the_rollout_not_the_attempt_and_the_record_checks() -> None:
    """Two attempts of a rollout take the same turns; the record reads back as the state; a record
    whose history does not match its boundary is refused."""
    workload = AgentWorkload(Telemetry(None, kind="agent", instance="agent-0"), turn_seconds=0)
    for attempt in (0, 1):
        workload.start(EpisodeId("r1", attempt), 3)
        for _ in range(2):
            await workload.advance(EpisodeId("r1", attempt))
    first, second = workload.episodes["r1"], workload.episodes["r1-a1"]
    assert first.state.history == second.state.history and len(first.state.history) == 2
    assert first.state.session_key == "session-r1"
    record = workload.to_record(first)
    assert workload.check_record(record) == first.state
    assert workload.describe(first)["turns"] == 2
    with pytest.raises(InvalidCheckpointError, match="1 turns at boundary 2"):
        workload.check_record(msgspec.structs.replace(record, history=record.history[:1]))
