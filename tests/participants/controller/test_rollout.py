"""What a collection knows of a rollout (``participants.controller.rollout``)."""

from __future__ import annotations

from ckpt_events.participants.controller.rollout import Rollout
from ckpt_events.participants.protocol import EpisodeId


def test_a_rollout_starts_pending_unplaced_and_names_its_episode() -> None:
    """A new rollout is pending and placed nowhere; its episode is its id at its attempt."""
    rollout = Rollout("r-3")
    assert (rollout.status, rollout.placed, rollout.started, rollout.at) == ("pending", (), set(), {})
    assert rollout.episode_id == EpisodeId("r-3", 0)
    rollout.attempt += 1  # a restore continues it as the next attempt
    assert rollout.episode_id == EpisodeId("r-3", 1) and rollout.episode_id.capture_key == "r-3-a1"
