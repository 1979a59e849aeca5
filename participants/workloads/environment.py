"""The environment workload: one simulated environment step per unit of work."""

from __future__ import annotations

from typing import Any

import anyio

from ckpt_events import Kind, Telemetry
from participants.protocol import EpisodeId
from participants.workloads.base import Episode, Record, Workload, finite_sleep
from participants.workloads.records import digest, invalid_record, task_digest

__all__ = ["EnvironmentRecord", "EnvironmentWorkload"]


class EnvironmentRecord(Record, kw_only=True):
    """An episode parked at ``boundary`` steps, with the reward it has collected so far."""

    task_digest: str
    total_reward: int


class EnvironmentWorkload(Workload):
    """Episodes that take one simulated environment step per unit of work."""

    kind = Kind.ENVIRONMENT
    record_type = EnvironmentRecord

    def __init__(self, tel: Telemetry, *, step_seconds: float = 0.01) -> None:
        super().__init__(tel)
        self.step_seconds = finite_sleep(step_seconds)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> Any:
        return {"task_digest": task_digest(episode_id.rollout_id, steps), "total_reward": 0}

    async def work(self, episode: Episode) -> None:
        await anyio.sleep(self.step_seconds)
        reward = int(digest(episode.episode_id.rollout_id, episode.boundary)[:2], 16) % 10
        episode.state["total_reward"] += reward

    def to_record(self, episode: Episode) -> Record:
        return EnvironmentRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            task_digest=episode.state["task_digest"],
            total_reward=episode.state["total_reward"],
        )

    def from_record(self, record: Any) -> Any:
        if record.task_digest != task_digest(record.episode_id.rollout_id, record.steps):
            raise invalid_record(record, "task_digest does not match its task")
        return {"task_digest": record.task_digest, "total_reward": record.total_reward}

    def describe(self, episode: Episode) -> dict[str, Any]:
        return dict(episode.state)
