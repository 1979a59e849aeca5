"""Closed vocabularies and the names built from them."""

from __future__ import annotations

import pytest

from ckpt_events import (
    PREPARE_ORDER,
    RESUME_ORDER,
    RETIRE_GROUPS,
    ErrorCode,
    Kind,
    Operation,
    Step,
    UnknownNameError,
    attr,
    coerce,
    span_name,
)


def test_error_codes_carry_their_http_status() -> None:
    """Every code maps to the protocol's status."""
    statuses = {code.value: code.http_status for code in ErrorCode}
    assert statuses == {
        "checkpoint_error": 409,
        "stale_checkpoint": 409,
        "checkpoint_conflict": 409,
        "invalid_phase": 409,
        "deadline_exceeded": 409,
        "stale_attempt": 409,
        "admission_closed": 409,
        "restart_in_scope": 409,
        "rollout_id_required": 400,
        "unauthorized": 401,
        "invalid_checkpoint_state": 422,
        "checkpoint_coordinator_unavailable": 503,
    }


def test_orders_and_step_parents() -> None:
    """Prepare, resume and retire orders, and each step's operation, are the protocol's."""
    assert [k.value for k in PREPARE_ORDER] == ["environment", "model", "agent", "resources"]
    assert RESUME_ORDER == tuple(reversed(PREPARE_ORDER))
    assert [[k.value for k in g] for g in RETIRE_GROUPS] == [
        ["environment"],
        ["agent"],
        ["model", "resources"],
    ]
    assert {s.value: s.parent.value for s in Step} == {
        "wait_ready": "prepare",
        "generation_cut": "prepare",
        "export": "commit",
        "write": "commit",
        "read": "restore",
        "install": "restore",
    }


def test_names_built_in_one_place() -> None:
    """Attribute keys and span names have the contract prefixes."""
    assert attr("records") == "nemo.gym.checkpoint.records"
    assert span_name("coordinate", "prepare", "model") == "gym.checkpoint.coordinate.prepare.model"


def test_coerce_accepts_members_and_values_only() -> None:
    """coerce() takes the member or its value, and names the valid values otherwise."""
    assert coerce(Operation, "commit") is Operation.COMMIT
    assert coerce(Kind, Kind.MODEL) is Kind.MODEL
    with pytest.raises(UnknownNameError, match="environment, model, agent, resources, controller"):
        coerce(Kind, "judge")
    with pytest.raises(UnknownNameError):
        coerce(Kind, {"model"})


def test_the_instrument_table_names_every_metric_constant_once() -> None:
    """INSTRUMENTS and OPEN_WORK_INSTRUMENTS hold each METRIC_* name exactly once between them,
    with a kind, a unit and a description."""
    import ckpt_events
    from ckpt_events import INSTRUMENTS, OPEN_WORK_INSTRUMENTS, InstrumentKind

    table = INSTRUMENTS + OPEN_WORK_INSTRUMENTS
    constants = {getattr(ckpt_events, n) for n in ckpt_events.__all__ if n.startswith("METRIC_")}
    names = [i.name for i in table]
    assert sorted(names) == sorted(constants)
    assert all(isinstance(i.kind, InstrumentKind) and i.unit and i.description for i in table)
