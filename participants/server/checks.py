"""The control plane's argument checks: deadlines in bounds, commit and restore scopes exact.

A commit's ``episode_ids`` name only episodes the participant holds, else 422
``invalid_checkpoint_state``: admission is closed while prepared, so an unknown id can never
become known and a retry cannot help (a 409 would invite one). A restore installs exactly the
episodes it was asked for: one missing from the checkpoint (an older pair, a dropped record,
an empty file, an id never committed) refuses the whole restore with the same code; one
that would continue as an attempt retired here refuses it as ``stale_attempt``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

from ckpt_events.participants.errors import InvalidCheckpointError, MalformedRequest, ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Record
from ckpt_events.participants.workloads.fence import RetiredAttempts
from ckpt_events.vocab import ErrorCode, Operation, Phase

__all__ = [
    "MAX_DEADLINE_SECONDS",
    "check_commit_scope",
    "check_deadline",
    "check_outside",
    "check_restore_keys",
    "check_restore_not_retired",
    "check_restore_scope",
]

#: How far ahead a ``deadline_ts`` may be (24 h): every lease expires.
MAX_DEADLINE_SECONDS: Final = 24 * 3600.0
_NAMED: Final = 10
_OUTSIDE_CHECKPOINT: Final = frozenset({Phase.IDLE, Phase.RESTORED})


def check_deadline(deadline_ts: float) -> None:
    """A past deadline is ``deadline_exceeded`` (409); one beyond the bound is ``invalid_request``."""
    now = time.time()
    if deadline_ts <= now:
        raise ProtocolRefusal(ErrorCode.DEADLINE_EXCEEDED, f"deadline_ts {deadline_ts:.3f} has passed")
    if deadline_ts > now + MAX_DEADLINE_SECONDS:
        raise MalformedRequest(
            f"deadline_ts {deadline_ts:.3f} is more than {MAX_DEADLINE_SECONDS:.0f} s (24 h) from now"
        )


def check_outside(op: Operation, phase: Phase, deadline_ts: float) -> None:
    """Retire and forget run outside a checkpoint (idle or restored) before their deadline."""
    if phase not in _OUTSIDE_CHECKPOINT:
        raise ProtocolRefusal(
            ErrorCode.INVALID_PHASE, f"{op.value} is not allowed in phase {phase.value}: resume first"
        )
    check_deadline(deadline_ts)


def check_commit_scope(keys: frozenset[str] | None, held: Mapping[str, object]) -> None:
    """Every episode named in a commit scope (by capture key) is held by this participant."""
    unknown = sorted(keys - held.keys()) if keys is not None else []
    if unknown:
        raise ProtocolRefusal(
            ErrorCode.INVALID_CHECKPOINT_STATE,
            f"commit scope names {len(unknown)} episodes this participant does not hold: "
            f"{', '.join(unknown[:_NAMED])}",
        )


def check_restore_scope(scope: set[EpisodeId], chosen: list[Record], source: str) -> None:
    """Every requested episode is in the checkpoint read (keys made only for the missing ones)."""
    missing = scope - {r.episode_id for r in chosen}
    _refuse_missing(sorted(e.capture_key for e in missing), len(scope), source)


def check_restore_not_retired(scope: set[EpisodeId], fence: RetiredAttempts) -> None:
    """No episode of a restore continues as an attempt retired here (as a failed restore's
    cleanup retires the next attempts): installed, it would be refused every call as
    ``stale_attempt``, so the restore is (409 ``stale_attempt``)."""
    retired = sorted(e.next().capture_key for e in scope if fence.is_retired(e.next()))
    if retired:
        raise ProtocolRefusal(
            ErrorCode.STALE_ATTEMPT,
            f"restore would continue {len(retired)} episodes as attempts retired here: "
            f"{', '.join(retired[:_NAMED])} (restore into fresh participants, or forget those "
            "rollouts first)",
        )


def check_restore_keys(scope: set[str], found: set[str], source: str) -> None:
    """Every requested episode (by capture key) is among those ``found`` in the checkpoint read."""
    _refuse_missing(sorted(scope - found), len(scope), source)


def _refuse_missing(missing: list[str], requested: int, source: str) -> None:
    if missing:
        raise InvalidCheckpointError(
            f"checkpoint {source} lacks {len(missing)} of the {requested} requested episodes: "
            f"{', '.join(missing[:_NAMED])}"
        )
