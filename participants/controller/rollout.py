"""What a collection knows of each rollout, and what its ``run()`` reports."""

from __future__ import annotations

import msgspec

from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.protocol import EpisodeId

__all__ = ["CollectionSummary", "Rollout"]


class Rollout:
    """What the controller knows of one rollout: its attempt and where each participant is."""

    __slots__ = ("at", "attempt", "direct", "done_at", "placed", "rollout_id", "started", "status")

    def __init__(self, rollout_id: str, attempt: int = 0) -> None:
        self.rollout_id = rollout_id
        self.attempt = attempt
        self.status = "pending"  # pending, running, done, retired
        # The members this attempt's session is on, one of each kind (empty until it is placed).
        self.placed: tuple[Member, ...] = ()
        self.started: set[str] = set()  # members that accepted /work/start for this attempt
        self.done_at: set[str] = set()  # members where this attempt reached its last step
        self.at: dict[str, int] = {}  # the step boundary each member last reported for this attempt
        # (attempt, URL) of the worker port that holds this rollout's session on a member with
        # several workers: its work calls go there directly, past the member's main process.
        self.direct: dict[str, tuple[int, str]] = {}

    @property
    def episode_id(self) -> EpisodeId:
        return EpisodeId(self.rollout_id, self.attempt)


class CollectionSummary(msgspec.Struct, kw_only=True):
    """What ``run()`` did: rollouts finished, the attempts they finished as, checkpoints taken."""

    completed: int
    stopped: bool
    restored_from: str | None
    checkpoints: list[str]
    attempts: dict[str, int]
