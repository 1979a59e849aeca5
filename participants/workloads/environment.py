"""The environment workload: one simulated environment step per unit of work."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import anyio
import msgspec

from ckpt_events import Telemetry
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Episode, Record, Workload, finite_sleep
from ckpt_events.participants.workloads.records import digest, invalid_record, task_digest
from ckpt_events.vocab import Kind

__all__ = ["EnvironmentRecord", "EnvironmentState", "EnvironmentWorkload", "burn_cpu"]


def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time hashing (a step that computes, not waits)."""
    end = time.thread_time() + seconds
    block = b"\x00" * 4096
    while time.thread_time() < end:
        hashlib.sha256(block).digest()


class EnvironmentRecord(Record, kw_only=True):
    """An episode parked at ``boundary`` steps, with the reward it has collected so far."""

    task_digest: str
    total_reward: int


class EnvironmentState(msgspec.Struct, kw_only=True, gc=False):
    """A live environment episode: its task's digest and the reward collected so far."""

    task_digest: str
    total_reward: int


class EnvironmentWorkload(Workload[EnvironmentState, EnvironmentRecord]):
    """Episodes that take one simulated environment step per unit of work."""

    kind = Kind.ENVIRONMENT
    record_type = EnvironmentRecord

    def __init__(
        self, tel: Telemetry, *, step_seconds: float = 0.01, step_cpu_ms: float = 0.0, **options: Any
    ) -> None:
        super().__init__(tel, **options)
        self.step_seconds = finite_sleep(step_seconds)
        #: CPU each step spends hashing, in the loop (a CPU-bound environment, for benchmarks).
        self.step_cpu_seconds = finite_sleep(step_cpu_ms / 1000.0)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> EnvironmentState:
        return EnvironmentState(task_digest=task_digest(episode_id.rollout_id, steps), total_reward=0)

    async def work(self, episode: Episode[EnvironmentState]) -> None:
        if self.step_cpu_seconds:
            burn_cpu(self.step_cpu_seconds)
        await anyio.sleep(self.step_seconds)
        reward = int(digest(episode.episode_id.rollout_id, episode.boundary)[:2], 16) % 10
        episode.state.total_reward += reward

    def to_record(self, episode: Episode[EnvironmentState]) -> EnvironmentRecord:
        return EnvironmentRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            task_digest=episode.state.task_digest,
            total_reward=episode.state.total_reward,
        )

    def from_record(self, record: EnvironmentRecord) -> EnvironmentState:
        if record.task_digest != task_digest(record.episode_id.rollout_id, record.steps):
            raise invalid_record(record, "task_digest does not match its task")
        return EnvironmentState(task_digest=record.task_digest, total_reward=record.total_reward)

    def describe(self, episode: Episode[EnvironmentState]) -> dict[str, Any]:
        return msgspec.structs.asdict(episode.state)
