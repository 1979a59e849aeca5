"""What the control plane keeps to answer a retry, and how it answers the store's errors.

A retry of prepare, commit or restore with the same checkpoint id gets the same reply again
(``ReplyCache``); a commit or restore retried with other arguments is a conflict, so their
arguments are kept with the reply. The store raises its own errors; ``store_refusals`` turns
them into the protocol's: ``InvalidCheckpointError`` is ``invalid_checkpoint_state`` (422),
``WriteStopped`` is ``stale_checkpoint`` (409), ``CheckpointWriteError`` (an I/O error; its
detail says whether the manifest exists) is ``checkpoint_error`` (409).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from ckpt_events.participants.errors import (
    CheckpointStoreError,
    CheckpointWriteError,
    ProtocolRefusal,
    WriteStopped,
)
from ckpt_events.participants.protocol import CommitReply, PrepareReply, RestoreReply
from ckpt_events.vocab import ErrorCode

__all__ = ["RESUMED_KEPT", "ReplayArgs", "ReplyCache", "store_refusals"]

#: What a replayed commit or restore must repeat: the directory and the capture keys in scope
#: (a set: equal whatever the order, and no sort of tens of thousands of keys per request).
ReplayArgs = tuple[str, frozenset[str] | None]


#: How many resumed checkpoint ids are remembered (and refused as ``stale_checkpoint``).
RESUMED_KEPT: Final = 64


class ReplyCache:
    """The replies a retry of the same checkpoint id gets again, with the arguments they answered,
    and the ids resumed lately (the newest ``RESUMED_KEPT``)."""

    def __init__(self) -> None:
        self.resumed: OrderedDict[str, None] = OrderedDict()
        self.prepare: dict[str, PrepareReply] = {}
        self.commit: dict[str, tuple[CommitReply, ReplayArgs]] = {}
        self.restore: dict[str, tuple[RestoreReply, ReplayArgs]] = {}

    def remember_resumed(self, checkpoint_id: str) -> None:
        self.resumed[checkpoint_id] = None
        self.resumed.move_to_end(checkpoint_id)
        while len(self.resumed) > RESUMED_KEPT:
            self.resumed.popitem(last=False)

    def drop(self, checkpoint_id: str) -> None:
        """Forget every reply of ``checkpoint_id`` (it was resumed)."""
        for cache in (self.prepare, self.commit, self.restore):
            cache.pop(checkpoint_id, None)


@contextmanager
def store_refusals() -> Iterator[None]:
    """Answer the store's errors with their protocol codes."""
    try:
        yield
    except CheckpointStoreError as exc:
        if isinstance(exc, WriteStopped):
            code = ErrorCode.STALE_CHECKPOINT
        elif isinstance(exc, CheckpointWriteError):
            code = ErrorCode.CHECKPOINT_ERROR
        else:
            code = ErrorCode.INVALID_CHECKPOINT_STATE
        raise ProtocolRefusal(code, exc.detail) from exc
