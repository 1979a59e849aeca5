"""The reply cache a retry is answered from, and the store's errors as protocol refusals."""

from __future__ import annotations

import pytest

from ckpt_events.participants.errors import (
    CheckpointStoreError,
    CheckpointWriteError,
    InvalidCheckpointError,
    ProtocolRefusal,
    WriteStopped,
)
from ckpt_events.participants.protocol import (
    CommitReply,
    Manifest,
    PrepareReply,
    PrepareReport,
    RestoreReply,
)
from ckpt_events.participants.server.replies import RESUMED_KEPT, ReplyCache, store_refusals
from ckpt_events.vocab import ErrorCode, Phase


def _commit(checkpoint_id: str) -> CommitReply:
    manifest = Manifest(
        schema_version=1,
        kind="resources",
        instance="res-0",
        checkpoint_id=checkpoint_id,
        records_file="records.jsonl",
        records_sha256="0" * 64,
        record_count=0,
    )
    return CommitReply(phase=Phase.COMMITTED, manifest=manifest, episode_ids=[])


def test_resumed_ids_keep_the_newest_in_order() -> None:
    """Past RESUMED_KEPT ids the oldest go first; remembering one again makes it the newest."""
    cache = ReplyCache()
    for i in range(RESUMED_KEPT):
        cache.remember_resumed(f"c{i}")
    cache.remember_resumed("c0")  # c0 is now the newest: c1 goes next
    cache.remember_resumed("extra")
    assert len(cache.resumed) == RESUMED_KEPT == 64
    assert "c1" not in cache.resumed and "c0" in cache.resumed
    assert list(cache.resumed)[:2] == ["c2", "c3"] and list(cache.resumed)[-2:] == ["c0", "extra"]


def test_drop_forgets_every_reply_of_one_checkpoint_only() -> None:
    """drop(id) empties that id's prepare, commit and restore replies and leaves the others."""
    cache = ReplyCache()
    args = ("cp", frozenset({"a"}))
    for cid in ("c1", "c2"):
        cache.prepare[cid] = PrepareReply(phase=Phase.PREPARED, report=PrepareReport(ready=True))
        cache.commit[cid] = (_commit(cid), args)
        cache.restore[cid] = (RestoreReply(phase=Phase.RESTORED, restored=["a"]), args)
    cache.drop("c1")
    cache.drop("never-seen")
    assert list(cache.prepare) == list(cache.commit) == list(cache.restore) == ["c2"]
    assert cache.commit["c2"][0].manifest.checkpoint_id == "c2"


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (WriteStopped("resumed mid-write"), ErrorCode.STALE_CHECKPOINT, 409),
        (
            CheckpointWriteError("disk full; manifest absent", published=False),
            ErrorCode.CHECKPOINT_ERROR,
            409,
        ),
        (InvalidCheckpointError("records file is truncated"), ErrorCode.INVALID_CHECKPOINT_STATE, 422),
        (CheckpointStoreError("any other store error"), ErrorCode.INVALID_CHECKPOINT_STATE, 422),
    ],
)
def test_store_errors_become_their_protocol_codes(
    error: CheckpointStoreError, code: ErrorCode, status: int
) -> None:
    """Each store error is a ProtocolRefusal with its code, status and detail, chained to it."""
    with pytest.raises(ProtocolRefusal) as info, store_refusals():
        raise error
    assert info.value.code is code and info.value.status == status
    assert info.value.detail == error.detail and info.value.__cause__ is error


def test_other_errors_pass_through_store_refusals() -> None:
    """Only the store's errors are translated: an OSError leaves the block as it is."""
    with pytest.raises(OSError, match="not a store error"), store_refusals():
        raise OSError("not a store error")
    with store_refusals():
        value = 1  # a clean block raises nothing
    assert value == 1
