"""The environment, agent and resources workloads: small, real, deterministic work.

Each unit of work depends only on the rollout id and the boundary, never on the attempt,
so an episode continued after a restore ends in the same state as one never interrupted.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import anyio
import msgspec

from ckpt_events import ErrorCode, Kind, Telemetry
from participants._workload import Episode, Record, Workload, finite_sleep
from participants.protocol import ControlError, EpisodeId

__all__ = [
    "AgentRecord",
    "AgentWorkload",
    "EnvironmentRecord",
    "EnvironmentWorkload",
    "ResourcesRecord",
    "ResourcesWorkload",
    "task_digest",
]

#: The resources document keeps this many lines (it stays small on purpose).
DOCUMENT_LINES: Final = 32


def _digest(*parts: object) -> str:
    return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()


def task_digest(rollout_id: str, steps: int) -> str:
    """SHA-256 of the episode's task as compact JSON with sorted keys."""
    task = msgspec.json.encode({"rollout_id": rollout_id, "steps": steps}, order="sorted")
    return hashlib.sha256(task).hexdigest()


def _invalid(record: Record, why: str) -> ControlError:
    return ControlError(
        ErrorCode.INVALID_CHECKPOINT_STATE, f"record of {record.episode_id.capture_key}: {why}"
    )


# -- environment ---------------------------------------------------------------------------------


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
        reward = int(_digest(episode.episode_id.rollout_id, episode.boundary)[:2], 16) % 10
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
            raise _invalid(record, "task_digest does not match its task")
        return {"task_digest": record.task_digest, "total_reward": record.total_reward}

    def describe(self, episode: Episode) -> dict[str, Any]:
        return dict(episode.state)


# -- agent ---------------------------------------------------------------------------------------


class AgentRecord(Record, kw_only=True):
    """A session parked at a turn boundary: its key and the turns it has taken."""

    session_key: str
    history: list[str]


class AgentWorkload(Workload):
    """Agent sessions that take one turn per unit of work."""

    kind = Kind.AGENT
    record_type = AgentRecord

    def __init__(self, tel: Telemetry, *, turn_seconds: float = 0.01) -> None:
        super().__init__(tel)
        self.turn_seconds = finite_sleep(turn_seconds)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> Any:
        return {"session_key": f"session-{episode_id.rollout_id}", "history": []}

    async def work(self, episode: Episode) -> None:
        await anyio.sleep(self.turn_seconds)
        turn = episode.boundary
        episode.state["history"].append(f"turn-{turn}:{_digest(episode.episode_id.rollout_id, turn)[:12]}")

    def to_record(self, episode: Episode) -> Record:
        return AgentRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            session_key=episode.state["session_key"],
            history=list(episode.state["history"]),
        )

    def from_record(self, record: Any) -> Any:
        if len(record.history) != record.boundary:
            raise _invalid(record, f"{len(record.history)} turns at boundary {record.boundary}")
        return {"session_key": record.session_key, "history": list(record.history)}

    def counts(self) -> dict[str, int]:
        at_boundary = sum(1 for e in self.episodes.values() if e.status == "idle")
        return {"sessions": len(self.episodes), "at_boundary": at_boundary}

    def describe(self, episode: Episode) -> dict[str, Any]:
        return {
            "session_key": episode.state["session_key"],
            "turns": len(episode.state["history"]),
            "history": list(episode.state["history"]),
        }


# -- resources -----------------------------------------------------------------------------------


class ResourcesRecord(Record, kw_only=True):
    """A session's state: a counter and a small document (its last lines)."""

    session_id: str
    counter: int
    document: list[str]


class ResourcesWorkload(Workload):
    """Per-session state: each unit of work bumps a counter and appends to a document."""

    kind = Kind.RESOURCES
    record_type = ResourcesRecord

    def __init__(self, tel: Telemetry, *, request_seconds: float = 0.002) -> None:
        super().__init__(tel)
        self.request_seconds = finite_sleep(request_seconds)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> Any:
        return {"session_id": f"res-{episode_id.rollout_id}", "counter": 0, "document": []}

    async def work(self, episode: Episode) -> None:
        await anyio.sleep(self.request_seconds)
        state = episode.state
        state["counter"] += 1
        state["document"].append(f"line {state['counter']} of {episode.episode_id.rollout_id}")
        del state["document"][:-DOCUMENT_LINES]

    def to_record(self, episode: Episode) -> Record:
        return ResourcesRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            session_id=episode.state["session_id"],
            counter=episode.state["counter"],
            document=list(episode.state["document"]),
        )

    def from_record(self, record: Any) -> Any:
        if record.counter != record.boundary or len(record.document) > DOCUMENT_LINES:
            raise _invalid(record, "counter or document does not match the boundary")
        return {"session_id": record.session_id, "counter": record.counter, "document": list(record.document)}

    def counts(self) -> dict[str, int]:
        inflight = sum(1 for e in self.episodes.values() if e.status == "running")
        return {"inflight": inflight, "sessions": len(self.episodes)}

    def describe(self, episode: Episode) -> dict[str, Any]:
        return {
            "session_id": episode.state["session_id"],
            "counter": episode.state["counter"],
            "document": list(episode.state["document"]),
        }
