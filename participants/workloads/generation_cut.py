"""The generation-cut round between the model participant and an inference worker.

At admission close the model sends the inventory of its in-flight generation calls to
``POST /ng-control/v1/generation-cut``; the worker stages each call's prefix and answers a
receipt with one ack per call: ``durable_prefix`` (with its evidence) or ``durable_failure``
(with none). The receipt must cover every ticket exactly once with matching identity.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Final, Literal

import msgspec

from ckpt_events.vocab import Disposition

__all__ = [
    "CUT_PATH",
    "ActivePrefix",
    "Continuation",
    "CutAck",
    "CutInventory",
    "CutReceipt",
    "GenerateRequest",
    "inventory_digest",
    "receipt_problem",
]

CUT_PATH: Final = "/ng-control/v1/generation-cut"


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ActivePrefix(_Body):
    ticket_id: int
    rollout_id: str
    attempt: int
    model_call_id: str
    admitted_at: float


class CutInventory(_Body):
    checkpoint_id: str
    server_name: str
    active_prefixes: list[ActivePrefix]
    inventory_digest: str


class CutAck(_Body):
    """One call's outcome; ``durable_prefix`` carries the evidence, ``durable_failure`` none."""

    ticket_id: int
    disposition: Disposition
    cut_kind: Literal["active_prefix", "terminal_completion"] = "active_prefix"
    frozen_buffer_id: str | None = None
    staging_keys: list[str] = msgspec.field(default_factory=list)
    prefix_token_count: int | None = None
    prefix_digest: str | None = None
    effective_output_limit: Annotated[int, msgspec.Meta(ge=1)] | None = None


class CutReceipt(_Body):
    checkpoint_id: str
    cut_id: str
    inventory_digest: str
    inventory: list[ActivePrefix]
    backend_snapshot_id: str
    prefixes: list[CutAck]


class Continuation(_Body, gc=False):
    """Where a cut call continues after a restore: its staged prefix on the worker."""

    staging_key: str
    prefix_token_count: int
    prefix_digest: str


class GenerateRequest(_Body):
    """``POST /generate``: stream ``max_tokens`` tokens for ``prompt``, optionally from a prefix."""

    ticket_id: int
    rollout_id: str
    model_call_id: str
    prompt: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 16
    resume_from: Continuation | None = None


def inventory_digest(checkpoint_id: str, server_name: str, prefixes: list[ActivePrefix]) -> str:
    """SHA-256 of compact JSON with sorted keys over the inventory's first three fields."""
    payload = {
        "active_prefixes": [msgspec.to_builtins(p) for p in prefixes],
        "checkpoint_id": checkpoint_id,
        "server_name": server_name,
    }
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


def receipt_problem(inventory: CutInventory, receipt: CutReceipt) -> str | None:
    """Why ``receipt`` does not answer ``inventory`` (None if it does)."""
    if receipt.checkpoint_id != inventory.checkpoint_id:
        return "receipt is for another checkpoint"
    if receipt.inventory_digest != inventory.inventory_digest:
        return "receipt inventory digest does not match"
    tickets = [p.ticket_id for p in inventory.active_prefixes]
    acked = [a.ticket_id for a in receipt.prefixes]
    if sorted(acked) != sorted(tickets) or len(set(acked)) != len(acked):
        return "receipt does not cover every ticket exactly once"
    for ack in receipt.prefixes:
        evidence = (
            ack.frozen_buffer_id,
            ack.prefix_token_count,
            ack.prefix_digest,
            ack.effective_output_limit,
        )
        if ack.disposition is Disposition.DURABLE_PREFIX:
            if (
                None in evidence
                or not ack.staging_keys
                or len(set(ack.staging_keys)) != len(ack.staging_keys)
            ):
                return f"ticket {ack.ticket_id}: durable_prefix without its evidence"
        elif any(v is not None for v in evidence) or ack.staging_keys:
            return f"ticket {ack.ticket_id}: durable_failure must carry no evidence"
    return None
