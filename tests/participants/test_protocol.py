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
    Manifest,
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


#: Ids ending in ``-a`` and digits that ``capture_key`` never writes: a UUID whose last group is
#: ``a`` and 11 digits (one uuid4 in ~2,800: it has a leading zero or is above MAX_ATTEMPT), a
#: leading zero, attempt 0 (written as the bare id), an attempt past the last.
UNWRITTEN_SUFFIXES = [
    "4f1c2d3e-1ad2-421e-afa9-a04299078061",
    "db943e46-1ad2-421e-afa9-a28498242491",
    "r-a01",
    "r-a0",
    f"r-a{MAX_ATTEMPT + 1}",
    "r-a12345678901",
]


@pytest.mark.parametrize("rollout_id", UNWRITTEN_SUFFIXES)
@pytest.mark.parametrize("attempt", [0, 1, 12, MAX_ATTEMPT])
def test_ids_ending_in_a_suffix_capture_key_never_writes_are_accepted(rollout_id, attempt):
    """A rollout id ending in -a<digits> that no capture key ends in (a UUID's ``a`` and 11
    digits) is accepted, on the wire and in code, and its capture keys invert."""
    episode = decode(msgspec.json.encode({"rollout_id": rollout_id, "attempt": attempt}), EpisodeId)
    assert episode == EpisodeId(rollout_id, attempt)
    assert EpisodeId.from_capture_key(episode.capture_key) == episode
    forget = msgspec.json.encode({"checkpoint_id": "c", "deadline_ts": 1, "rollout_ids": [rollout_id]})
    assert decode(forget, ForgetRequest).rollout_ids == [rollout_id]


def test_capture_keys_never_collide():
    """No two episodes share a capture key, and each key inverts, among ids built to be close:
    bare stems, stems with every written and unwritten suffix, at attempts around the edges."""
    suffixes = ["", "-a", "-a0", "-a01", "-a1", "-a10", f"-a{MAX_ATTEMPT}", f"-a{MAX_ATTEMPT + 1}", "-a1-a2"]
    ids = [stem + suffix for stem in ("r", "r-a", "r-a01", "r-a1000001") for suffix in suffixes]
    keys: dict[str, EpisodeId] = {}
    for rollout_id in ids:
        for attempt in (0, 1, 2, 10, 1000, MAX_ATTEMPT):
            try:
                episode = EpisodeId(rollout_id, attempt)
            except InvalidValueError:
                continue
            assert keys.setdefault(episode.capture_key, episode) == episode, episode.capture_key
            assert EpisodeId.from_capture_key(episode.capture_key) == episode
    assert len(keys) > 100


@pytest.mark.parametrize(
    "rollout_id", ["r-a1", "x-a10", f"r-a{MAX_ATTEMPT}", "", "-r", "a/b", "a" * 129, "r b"]
)
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


def test_replies_ignore_unknown_fields_requests_refuse_them():
    """A reply from a newer participant decodes (its new field ignored); a request does not."""
    assert decode(b'{"ready":true,"surprise":1}', PrepareReport) == PrepareReport(ready=True)
    with pytest.raises(MalformedRequest, match="unknown field `surprise`"):
        decode(b'{"checkpoint_id":"c1","deadline_ts":1,"surprise":1}', PrepareRequest)


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
    assert info.value.detail == (
        "rollout_id 'bad-a2' must not end in -a<N> (N in 1..1000000, the capture key suffix of"
        " attempt N): choose another ending, such as _a<N> - at `$.episode_ids[1]`"
    )


def test_a_manifest_with_a_newer_field_decodes():
    """``manifest.json`` of the same ``schema_version`` with a field added by a newer writer is read
    (a rolled-back participant restores it); a change of meaning bumps the version instead."""
    raw = (
        b'{"schema_version":1,"kind":"agent","instance":"a0","checkpoint_id":"c1","records_file":"r",'
        b'"records_sha256":"d","record_count":2,"compression":"none"}'
    )
    assert decode(raw, Manifest).record_count == 2
