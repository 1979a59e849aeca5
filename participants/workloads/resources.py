"""The resources workload: a counter and a small document per episode."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from ckpt_events import Telemetry
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Episode, Record, Workload, finite_sleep
from ckpt_events.participants.workloads.records import DOCUMENT_LINES, invalid_record
from ckpt_events.vocab import Kind

__all__ = ["ResourcesRecord", "ResourcesState", "ResourcesWorkload"]


class ResourcesRecord(Record, kw_only=True):
    """A session's state: a counter and a small document (its last lines)."""

    session_id: str
    counter: int
    document: list[str]


class ResourcesState(msgspec.Struct, kw_only=True, gc=False):
    """A live resources session: its id, its counter and its document's last lines."""

    session_id: str
    counter: int
    document: list[str]


class ResourcesWorkload(Workload[ResourcesState, ResourcesRecord]):
    """Per-session state: each unit of work bumps a counter and appends to a document."""

    kind = Kind.RESOURCES
    record_type = ResourcesRecord

    def __init__(self, tel: Telemetry, *, request_seconds: float = 0.002, **options: Any) -> None:
        super().__init__(tel, **options)
        self.request_seconds = finite_sleep(request_seconds)

    def initial_state(self, episode_id: EpisodeId, steps: int) -> ResourcesState:
        return ResourcesState(session_id=f"res-{episode_id.rollout_id}", counter=0, document=[])

    async def work(self, episode: Episode[ResourcesState]) -> None:
        await anyio.sleep(self.request_seconds)
        state = episode.state
        state.counter += 1
        state.document.append(f"line {state.counter} of {episode.episode_id.rollout_id}")
        del state.document[:-DOCUMENT_LINES]

    def to_record(self, episode: Episode[ResourcesState]) -> ResourcesRecord:
        return ResourcesRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            session_id=episode.state.session_id,
            counter=episode.state.counter,
            document=list(episode.state.document),
        )

    def from_record(self, record: ResourcesRecord) -> ResourcesState:
        if record.counter != record.boundary or len(record.document) > DOCUMENT_LINES:
            raise invalid_record(record, "counter or document does not match the boundary")
        return ResourcesState(
            session_id=record.session_id, counter=record.counter, document=list(record.document)
        )

    def counts(self) -> dict[str, int]:
        inflight = self.episodes.count("running")
        return {"inflight": inflight, "sessions": len(self.episodes)}

    def describe(self, episode: Episode[ResourcesState]) -> dict[str, Any]:
        return {
            "session_id": episode.state.session_id,
            "counter": episode.state.counter,
            "document": list(episode.state.document),
        }
