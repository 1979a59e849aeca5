"""The generation-cut round (``participants.workloads.generation_cut``): the inventory's digest, and
a receipt checked against the inventory it answers."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from ckpt_events.participants.workloads.generation_cut import (
    ActivePrefix,
    CutAck,
    CutInventory,
    CutReceipt,
    inventory_digest,
    receipt_problem,
)
from ckpt_events.vocab import Disposition

PREFIXES = [
    ActivePrefix(ticket_id=1, rollout_id="r1", attempt=0, model_call_id="m1", admitted_at=1.5),
    ActivePrefix(ticket_id=2, rollout_id="r2", attempt=1, model_call_id="m2", admitted_at=2.5),
]
DIGEST = inventory_digest("c1", "inference-0", PREFIXES)
INVENTORY = CutInventory(
    checkpoint_id="c1", server_name="inference-0", active_prefixes=PREFIXES, inventory_digest=DIGEST
)
DURABLE = CutAck(
    ticket_id=1,
    disposition=Disposition.DURABLE_PREFIX,
    frozen_buffer_id="b1",
    staging_keys=["k1"],
    prefix_token_count=5,
    prefix_digest="d" * 64,
    effective_output_limit=16,
)
FAILED = CutAck(ticket_id=2, disposition=Disposition.DURABLE_FAILURE)


def _receipt(**changes: object) -> CutReceipt:
    receipt = CutReceipt(
        checkpoint_id="c1",
        cut_id="cut-1",
        inventory_digest=DIGEST,
        inventory=PREFIXES,
        backend_snapshot_id="s1",
        prefixes=[DURABLE, FAILED],
    )
    return msgspec.structs.replace(receipt, **changes)


def test_the_inventory_digest_is_sha256_of_its_sorted_compact_json() -> None:
    """Anyone can recompute it; another server name gives another digest."""
    payload = {
        "active_prefixes": [msgspec.to_builtins(p) for p in PREFIXES],
        "checkpoint_id": "c1",
        "server_name": "inference-0",
    }
    assert DIGEST == hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()
    assert inventory_digest("c1", "inference-1", PREFIXES) != DIGEST


def test_a_receipt_that_answers_the_inventory_has_no_problem() -> None:
    """Every ticket once, with its evidence when durable and none when it failed."""
    assert receipt_problem(INVENTORY, _receipt()) is None


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"checkpoint_id": "c2"}, "receipt is for another checkpoint"),
        ({"inventory_digest": "0" * 64}, "receipt inventory digest does not match"),
        ({"prefixes": [DURABLE]}, "receipt does not cover every ticket exactly once"),
        ({"prefixes": [DURABLE, DURABLE, FAILED]}, "receipt does not cover every ticket exactly once"),
        (
            {"prefixes": [msgspec.structs.replace(DURABLE, prefix_digest=None), FAILED]},
            "ticket 1: durable_prefix without its evidence",
        ),
        (
            {"prefixes": [msgspec.structs.replace(DURABLE, staging_keys=["k", "k"]), FAILED]},
            "ticket 1: durable_prefix without its evidence",
        ),
        (
            {"prefixes": [DURABLE, msgspec.structs.replace(FAILED, staging_keys=["k"])]},
            "ticket 2: durable_failure must carry no evidence",
        ),
    ],
)
def test_a_receipt_that_does_not_answer_says_why(changes: dict[str, object], problem: str) -> None:
    """Another checkpoint or digest, a ticket missing or twice, evidence missing or where none belongs."""
    assert receipt_problem(INVENTORY, _receipt(**changes)) == problem
