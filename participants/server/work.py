"""``WorkService``: what the work routes serve, whether the episodes live here or in workers.

``routes.work_router`` is built on one: ``LocalWork`` (a workload in this process: a
single-process server, or a worker's own port) or ``workers.app.PooledWork`` (the main port of
a multi-worker server, forwarding each call to the worker that holds the session).
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

import msgspec

from ckpt_events.participants.errors import EpisodeGone
from ckpt_events.participants.protocol import EpisodeId, WorkAdvanceReply, WorkStartReply
from ckpt_events.participants.workloads.base import Episode, Workload

__all__ = ["EpisodeGone", "EpisodeView", "LocalWork", "WorkService", "episode_view"]

_Count = Annotated[int, msgspec.Meta(ge=0)]


class WorkService(Protocol):
    """``POST /work/start``, ``POST /work/advance`` and ``GET /work/{capture_key}``, as calls."""

    async def start(self, episode_id: EpisodeId, steps: int) -> WorkStartReply:
        """Begin ``episode_id`` (admission and the fence refuse as ``ProtocolRefusal``)."""
        ...

    async def advance(self, episode_id: EpisodeId) -> WorkAdvanceReply:
        """One unit of work on ``episode_id``; ``LookupError`` if there is no such episode
        (``EpisodeGone``: one this server lost)."""
        ...

    async def view(self, key: str) -> Any:
        """What ``GET /work/{key}`` answers (a JSON-encodable value), or ``None``: no such episode
        (``EpisodeGone``: one this server lost)."""
        ...


class EpisodeView(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What ``GET /work/{capture_key}`` answers about an episode; a worker's view names the
    worker that holds it (``worker``; absent on a single-process server)."""

    capture_key: str
    rollout_id: str
    attempt: _Count
    boundary: _Count
    steps: Annotated[int, msgspec.Meta(ge=1)]
    done: bool
    status: str
    kind: str
    state: dict[str, Any]
    worker: int | None = None


def episode_view(
    workload: Workload[Any, Any], episode: Episode[Any], worker: int | None = None
) -> EpisodeView:
    """What ``GET /work/{capture_key}`` answers about ``episode`` (held by ``worker``, if given)."""
    episode_id = episode.episode_id
    return EpisodeView(
        capture_key=episode.key,
        rollout_id=episode_id.rollout_id,
        attempt=episode_id.attempt,
        boundary=episode.boundary,
        steps=episode.steps,
        done=episode.done,
        status=episode.status,
        kind=str(workload.kind),
        state=workload.describe(episode),
        worker=worker,
    )


class LocalWork:
    """The work calls of ``workload``, in this process; a worker's own port passes its ``worker``
    index, which its views carry."""

    def __init__(self, workload: Workload[Any, Any], *, worker: int | None = None) -> None:
        self.workload = workload
        self.worker = worker

    async def start(self, episode_id: EpisodeId, steps: int) -> WorkStartReply:
        episode = self.workload.start(episode_id, steps)
        return WorkStartReply(capture_key=episode.key, boundary=episode.boundary)

    async def advance(self, episode_id: EpisodeId) -> WorkAdvanceReply:
        episode = await self.workload.advance(episode_id)
        return WorkAdvanceReply(boundary=episode.boundary, done=episode.done)

    async def view(self, key: str) -> EpisodeView | None:
        episode = self.workload.get(key)
        return None if episode is None else episode_view(self.workload, episode, self.worker)
