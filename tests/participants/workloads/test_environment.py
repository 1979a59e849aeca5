"""The environment workload (``participants.workloads.environment``): a reward per step, the task's
digest checkpointed and checked."""

from __future__ import annotations

import time

import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.environment import EnvironmentWorkload, burn_cpu
from ckpt_events.participants.workloads.records import task_digest


async def test_rewards_follow_the_rollout_and_a_record_of_another_task_is_refused() -> None:
    """Two attempts collect the same reward; the record reads back; a record whose task digest is
    not its task's is refused."""
    workload = EnvironmentWorkload(
        Telemetry(None, kind="environment", instance="environment-0"), step_seconds=0
    )
    for attempt in (0, 1):
        workload.start(EpisodeId("r1", attempt), 4)
        for _ in range(3):
            await workload.advance(EpisodeId("r1", attempt))
    first, second = workload.episodes["r1"], workload.episodes["r1-a1"]
    assert first.state == second.state and first.state.task_digest == task_digest("r1", 4)
    record = workload.to_record(first)
    assert workload.check_record(record) == first.state
    with pytest.raises(InvalidCheckpointError, match="task_digest"):
        workload.check_record(msgspec.structs.replace(record, task_digest=task_digest("r2", 4)))


def test_burn_cpu_spends_thread_time() -> None:
    """A CPU-bound step spends at least the asked CPU time on this thread."""
    started = time.thread_time()
    burn_cpu(0.02)
    assert time.thread_time() - started >= 0.02
