"""The resources workload: a counter and a small document per episode."""

from __future__ import annotations

from typing import Any

import anyio

from ckpt_events import Kind, Telemetry
from participants.protocol import EpisodeId
from participants.workloads.base import Episode, Record, Workload, finite_sleep
from participants.workloads.records import DOCUMENT_LINES, invalid_record

__all__ = ["ResourcesRecord", "ResourcesWorkload"]


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
            raise invalid_record(record, "counter or document does not match the boundary")
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
