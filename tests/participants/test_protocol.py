"""The wire format: ids, capture keys, validation messages, error bodies."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import MalformedRequest, ProtocolRefusal
from ckpt_events.participants.protocol import (
    MAX_ATTEMPT,
    CommitRequest,
    EpisodeId,
    ForgetRequest,
    PrepareReport,
    PrepareRequest,
    RestoreRequest,
    RetireRequest,
    WorkStart,
    decode,
    encode,
    error_body,
)


@pytest.mark.parametrize(
    ("rollout_id", "attempt", "key"), [("r1", 0, "r1"), ("r1", 3, "r1-a3"), ("a.b_c-d", 12, "a.b_c-d-a12")]
)
def test_capture_keys_invert(rollout_id, attempt, key):
    """capture_key is rollout_id for attempt 0, else <rollout_id>-a<attempt>, and it inverts."""
    episode = EpisodeId(rollout_id, attempt)
    assert episode.capture_key == key
    assert EpisodeId.from_capture_key(key) == episode
    assert episode.next() == EpisodeId(rollout_id, attempt + 1)


@pytest.mark.parametrize("rollout_id", ["r-a1", "x-a10", "", "-r", "a/b", "a" * 129, "r b"])
def test_bad_rollout_ids_are_refused(rollout_id):
    """Rollout ids follow the safe pattern, 1-128 chars, and never end like a capture key."""
    with pytest.raises(MalformedRequest) as info:
        decode(msgspec.json.encode({"rollout_id": rollout_id}), EpisodeId)
    assert "rollout_id" in info.value.detail


def test_request_defaults_and_required_fields():
    """Commit defaults to all episodes without stop; restore requires episode_ids."""
    commit = decode(b'{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/d"}', CommitRequest)
    assert commit.episode_ids is None and commit.stop is False
    with pytest.raises(MalformedRequest, match="episode_ids"):
        decode(b'{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/d"}', RestoreRequest)
    with pytest.raises(MalformedRequest, match=r"rollout_ids\[1\]"):
        decode(b'{"checkpoint_id":"c","deadline_ts":1,"rollout_ids":["ok","bad-a2"]}', ForgetRequest)


def test_a_restore_of_an_episode_at_the_last_attempt_is_refused():
    """An episode at MAX_ATTEMPT cannot continue as attempt + 1 (no call could name it): its
    restore is malformed, naming the field; built in code, an InvalidValueError."""
    body = {"checkpoint_id": "c", "deadline_ts": 1, "checkpoint_dir": "/d"}
    last = [{"rollout_id": "ok"}, {"rollout_id": "r", "attempt": MAX_ATTEMPT}]
    with pytest.raises(MalformedRequest, match=r"at `\$\.episode_ids\[1\]\.attempt`"):
        decode(msgspec.json.encode({**body, "episode_ids": last}), RestoreRequest)
    with pytest.raises(InvalidValueError, match="last there is"):
        RestoreRequest(
            checkpoint_id="c", deadline_ts=1, checkpoint_dir="/d", episode_ids=[EpisodeId("r", MAX_ATTEMPT)]
        )
    below = decode(
        msgspec.json.encode({**body, "episode_ids": [{"rollout_id": "r", "attempt": MAX_ATTEMPT - 1}]}),
        RestoreRequest,
    )
    assert below.episode_ids[0].next().attempt == MAX_ATTEMPT


def test_protocol_refusal_carries_code_status_and_body():
    """A ProtocolRefusal knows its HTTP status and renders the protocol error body."""
    error = ProtocolRefusal("invalid_checkpoint_state", "digest mismatch")
    assert error.status == 422
    assert msgspec.json.decode(encode(error_body(error))) == {
        "error": {"code": "invalid_checkpoint_state", "detail": "digest mismatch"}
    }
    assert ProtocolRefusal("unauthorized", "x").status == 401
    with pytest.raises(ValueError, match="unknown error code"):
        ProtocolRefusal("nope", "x")


def test_replies_reject_unknown_fields():
    """Replies are as strict as requests."""
    with pytest.raises(MalformedRequest, match="unknown field"):
        decode(b'{"ready":true,"surprise":1}', PrepareReport)


@pytest.mark.parametrize("value", ["c1\n", "c1\r", "c1\n\n", "\nc1"])
def test_ids_with_a_line_break_are_refused(value):
    """A checkpoint or rollout id ending in a newline is refused: ``$`` alone would let one through
    into file names, manifests and log lines."""
    body = {"checkpoint_id": value, "deadline_ts": 1}
    with pytest.raises(MalformedRequest, match="checkpoint_id"):
        decode(msgspec.json.encode(body), PrepareRequest)
    with pytest.raises(MalformedRequest, match="rollout_id"):
        decode(msgspec.json.encode({"rollout_id": value}), EpisodeId)
    with pytest.raises(MalformedRequest, match="rollout_id"):
        decode(msgspec.json.encode({"rollout_id": value}), WorkStart)


def test_a_bad_rollout_id_in_a_list_of_episodes_names_its_place():
    """A rollout id ending in -a<N> inside ``episode_ids`` is located at its episode, not at a
    top-level ``$.rollout_id`` the body does not have."""
    body = {
        "checkpoint_id": "c",
        "deadline_ts": 1,
        "episode_ids": [{"rollout_id": "ok"}, {"rollout_id": "bad-a2"}],
    }
    with pytest.raises(MalformedRequest) as info:
        decode(msgspec.json.encode(body), RetireRequest)
    assert info.value.detail == "rollout_id 'bad-a2' must not end in -a<N> - at `$.episode_ids[1]`"
