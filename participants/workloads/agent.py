"""The agent workload: one simulated turn per unit of work, with its history."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from ckpt_events import Telemetry
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Episode, Record, Workload, finite_sleep
from ckpt_events.participants.workloads.records import digest, invalid_record
from ckpt_events.vocab import Kind

__all__ = ["AgentRecord", "AgentState", "AgentWorkload"]


class AgentRecord(Record, kw_only=True):
    """A session parked at a turn boundary: its key and the turns it has taken."""

    session_key: str
    history: list[str]


class AgentState(msgspec.Struct, kw_only=True, gc=False):
    """A live agent session: its key and the turns it has taken."""

    session_key: str
    history: list[str]


class AgentWorkload(Workload[AgentState, AgentRecord]):
    """Agent sessions that take one turn per unit of work."""

    kind = Kind.AGENT
    record_type = AgentRecord

    def __init__(self, tel: Telemetry, *, turn_seconds: float = 0.01, **options: Any) -> None:
        super().__init__(tel, **options)
        self.turn_seconds = finite_sleep(turn_seconds)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> AgentState:
        return AgentState(session_key=f"session-{episode_id.rollout_id}", history=[])

    async def work(self, episode: Episode[AgentState]) -> None:
        await anyio.sleep(self.turn_seconds)
        turn = episode.boundary
        episode.state.history.append(f"turn-{turn}:{digest(episode.episode_id.rollout_id, turn)[:12]}")

    def to_record(self, episode: Episode[AgentState]) -> AgentRecord:
        return AgentRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            session_key=episode.state.session_key,
            history=list(episode.state.history),
        )

    def from_record(self, record: AgentRecord) -> AgentState:
        if len(record.history) != record.boundary:
            raise invalid_record(record, f"{len(record.history)} turns at boundary {record.boundary}")
        return AgentState(session_key=record.session_key, history=list(record.history))

    def counts(self) -> dict[str, int]:
        at_boundary = self.episodes.count("idle")
        return {"sessions": len(self.episodes), "at_boundary": at_boundary}

    def describe(self, episode: Episode[AgentState]) -> dict[str, Any]:
        return {
            "session_key": episode.state.session_key,
            "turns": len(episode.state.history),
            "history": list(episode.state.history),
        }
