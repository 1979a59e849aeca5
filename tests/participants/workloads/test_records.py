"""Helpers the workloads share (``participants.workloads.records``): stable digests, and the error of a
record that does not verify."""

from __future__ import annotations

import hashlib

from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Record
from ckpt_events.participants.workloads.records import digest, invalid_record, task_digest


def test_digest_is_stable_and_depends_on_every_part_in_order() -> None:
    """The same parts give the same SHA-256; another order or value gives another."""
    assert digest("r1", 3) == digest("r1", 3)
    assert len(digest("r1", 3)) == 64
    assert len({digest("r1", 3), digest(3, "r1"), digest("r1", 4), digest("r1", "3")}) == 4


def test_task_digest_is_sha256_of_the_task_as_sorted_compact_json() -> None:
    """Anyone can recompute it from the rollout id and step count."""
    expected = hashlib.sha256(b'{"rollout_id":"r-7","steps":12}').hexdigest()
    assert task_digest("r-7", 12) == expected


def test_an_invalid_record_names_its_episode() -> None:
    """The error says which episode's record failed (by capture key) and why."""
    record = Record(episode_id=EpisodeId("r-7", 2), boundary=1, steps=4)
    error = invalid_record(record, "digest mismatch")
    assert isinstance(error, InvalidCheckpointError)
    assert str(error) == "record of r-7-a2: digest mismatch"
