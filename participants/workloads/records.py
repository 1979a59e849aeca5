"""Helpers the workloads share: stable digests and the error of a record that does not verify.

Each unit of work depends only on the rollout id and the boundary, never on the attempt,
so an episode continued after a restore ends in the same state as one never interrupted.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.workloads.base import Record

__all__ = ["DOCUMENT_LINES", "digest", "invalid_record", "task_digest"]


#: The resources document keeps this many lines (it stays small on purpose).
DOCUMENT_LINES: Final = 32


def digest(*parts: object) -> str:
    return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()


def task_digest(rollout_id: str, steps: int) -> str:
    """SHA-256 of the episode's task as compact JSON with sorted keys."""
    task = msgspec.json.encode({"rollout_id": rollout_id, "steps": steps}, order="sorted")
    return hashlib.sha256(task).hexdigest()


def invalid_record(record: Record, why: str) -> InvalidCheckpointError:
    """The error of a record that does not verify (answered ``invalid_checkpoint_state``)."""
    return InvalidCheckpointError(f"record of {record.episode_id.capture_key}: {why}")
