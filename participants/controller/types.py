"""What the coordinator works with and hands back: members, episode ids, results, errors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from ckpt_events.participants.errors import CheckpointNotPrepared, CoordinationError
from ckpt_events.participants.kinds import stage_index
from ckpt_events.participants.protocol import EpisodeId, PrepareReply

__all__ = [
    "CheckpointNotPrepared",
    "CoordinationError",
    "Member",
    "PrepareResult",
]


class Member(msgspec.Struct, frozen=True, order=True):
    """One discovered participant: its config ``name``, ``kind``, ``instance`` and base ``url``."""

    name: str
    #: A participant kind (a ``Kind`` constant's or a user's own, ``ckpt_events.participants.kinds``
    #: gives its place).
    kind: str
    instance: str
    url: str

    def sort_key(self) -> tuple[int, str, str]:
        return stage_index(self.kind), self.kind, self.name


@dataclass(frozen=True)
class PrepareResult:
    """The outcome of a staged prepare: every reply so far, and where it stopped."""

    checkpoint_id: str
    prepared: bool
    stopped_at: str | None = None
    replies: dict[str, PrepareReply] = field(default_factory=dict)

    def blockers(self) -> dict[str, list[str]]:
        """Member name to the blockers it reported (only members that reported some)."""
        return {name: list(r.report.blockers) for name, r in self.replies.items() if r.report.blockers}

    def blocker_count(self) -> int:
        """The full number of blockers over every member (replies cap the list at 100)."""
        return sum(r.report.blocker_count for r in self.replies.values())

    def restarts(self) -> set[str]:
        """The union of every reply's ``report.restarts`` (capture keys)."""
        return {key for r in self.replies.values() for key in r.report.restarts}

    def continued(self, episodes: Iterable[EpisodeId]) -> list[EpisodeId]:
        """``episodes`` without the restarts: what a commit may continue."""
        restarts = self.restarts()
        return [e for e in episodes if e.capture_key not in restarts]
