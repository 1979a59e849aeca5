"""The control plane's argument checks: deadline bounds, outside-checkpoint phases, exact scopes."""

from __future__ import annotations

import time

import pytest

from ckpt_events.participants.errors import InvalidCheckpointError, MalformedRequest, ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.server.checks import (
    MAX_DEADLINE_SECONDS,
    check_commit_scope,
    check_deadline,
    check_outside,
    check_restore_keys,
    check_restore_scope,
)
from ckpt_events.participants.workloads.base import Record
from ckpt_events.vocab import ErrorCode, Operation, Phase
from tests.participants.helpers import resources_record


def test_a_deadline_ahead_and_within_the_bound_passes() -> None:
    """A deadline a second ahead, or just short of 24 h ahead, raises nothing."""
    check_deadline(time.time() + 1.0)
    check_deadline(time.time() + MAX_DEADLINE_SECONDS - 60)
    assert MAX_DEADLINE_SECONDS == 24 * 3600.0


def test_a_past_deadline_is_deadline_exceeded() -> None:
    """A deadline now or before is a 409 deadline_exceeded refusal naming the deadline."""
    with pytest.raises(ProtocolRefusal) as info:
        check_deadline(1000.25)
    assert info.value.code is ErrorCode.DEADLINE_EXCEEDED and info.value.status == 409
    assert info.value.detail == "deadline_ts 1000.250 has passed"


def test_a_deadline_beyond_24_hours_is_a_malformed_request() -> None:
    """A deadline more than a day ahead is 422 invalid_request, not a protocol refusal."""
    deadline = time.time() + MAX_DEADLINE_SECONDS + 600
    with pytest.raises(MalformedRequest) as info:
        check_deadline(deadline)
    assert info.value.status == 422
    assert info.value.detail == f"deadline_ts {deadline:.3f} is more than 86400 s (24 h) from now"


@pytest.mark.parametrize("phase", [Phase.PREPARING, Phase.PREPARED, Phase.COMMITTED])
def test_retire_and_forget_inside_a_checkpoint_are_invalid_phase(phase: Phase) -> None:
    """Inside a checkpoint, retire and forget are 409 invalid_phase naming the op and phase."""
    for op in (Operation.RETIRE, Operation.FORGET):
        with pytest.raises(ProtocolRefusal) as info:
            check_outside(op, phase, time.time() + 5)
        assert info.value.code is ErrorCode.INVALID_PHASE and info.value.status == 409
        assert info.value.detail == f"{op.value} is not allowed in phase {phase.value}: resume first"


def test_outside_a_checkpoint_the_deadline_is_still_checked() -> None:
    """Idle and restored pass with a live deadline; a past one is still deadline_exceeded."""
    for phase in (Phase.IDLE, Phase.RESTORED):
        check_outside(Operation.RETIRE, phase, time.time() + 5)
        with pytest.raises(ProtocolRefusal) as info:
            check_outside(Operation.FORGET, phase, time.time() - 1)
        assert info.value.code is ErrorCode.DEADLINE_EXCEEDED


def test_the_phase_is_judged_before_the_deadline() -> None:
    """A prepared participant refuses with invalid_phase even when the deadline has passed."""
    with pytest.raises(ProtocolRefusal) as info:
        check_outside(Operation.RETIRE, Phase.PREPARED, time.time() - 1)
    assert info.value.code is ErrorCode.INVALID_PHASE


def test_a_commit_scope_of_held_episodes_passes() -> None:
    """No scope (everything), an empty scope and a subset of the held keys all pass."""
    held = {"a": 1, "b": 2, "c-a1": 3}
    check_commit_scope(None, held)
    check_commit_scope(frozenset(), held)
    check_commit_scope(frozenset({"a", "c-a1"}), held)


def test_a_commit_scope_naming_unknown_episodes_is_invalid_checkpoint_state() -> None:
    """Unknown keys are a 422 refusal counting them all and naming the first ten, sorted."""
    unknown = frozenset(f"r{i:02d}" for i in range(12))
    with pytest.raises(ProtocolRefusal) as info:
        check_commit_scope(unknown | {"held"}, {"held": None})
    assert info.value.code is ErrorCode.INVALID_CHECKPOINT_STATE and info.value.status == 422
    named = ", ".join(f"r{i:02d}" for i in range(10))
    assert info.value.detail == f"commit scope names 12 episodes this participant does not hold: {named}"


def test_a_restore_scope_found_in_full_passes() -> None:
    """Every requested episode among the records read: nothing is raised (extra records are fine)."""
    chosen: list[Record] = [resources_record("a"), resources_record("b", 1), resources_record("extra")]
    check_restore_scope({EpisodeId("a"), EpisodeId("b", 1)}, chosen, "c1")
    check_restore_keys({"a", "b-a1"}, {"a", "b-a1", "extra"}, "c1")


def test_a_restore_scope_missing_episodes_refuses_the_whole_restore() -> None:
    """Missing episodes are InvalidCheckpointError naming their capture keys, sorted, and the counts."""
    scope = {EpisodeId("a"), EpisodeId("b", 2), EpisodeId("c")}
    with pytest.raises(InvalidCheckpointError) as info:
        check_restore_scope(scope, [resources_record("a"), resources_record("b", 1)], "c7")
    assert info.value.detail == "checkpoint c7 lacks 2 of the 3 requested episodes: b-a2, c"


def test_restore_keys_missing_name_at_most_ten() -> None:
    """By capture key: with nothing found, all are counted and the first ten named."""
    scope = {f"k{i:02d}" for i in range(11)}
    with pytest.raises(InvalidCheckpointError) as info:
        check_restore_keys(scope, set(), "old")
    named = ", ".join(f"k{i:02d}" for i in range(10))
    assert info.value.detail == f"checkpoint old lacks 11 of the 11 requested episodes: {named}"
