"""The harness's order of participant kinds, and the default place of a kind it does not name."""

from __future__ import annotations

from ckpt_events.participants.kinds import (
    PREPARE_ORDER,
    RESUME_ORDER,
    RETIRE_GROUPS,
    prepare_order,
    resume_order,
    retire_groups,
    stage_index,
)


def test_the_original_systems_orders() -> None:
    """Prepare, resume and retire orders are the protocol's (SPEC section 1)."""
    assert PREPARE_ORDER == ("environment", "model", "agent", "resources")
    assert RESUME_ORDER == tuple(reversed(PREPARE_ORDER))
    assert RETIRE_GROUPS == (("environment",), ("agent",), ("model", "resources"))
    assert prepare_order() == PREPARE_ORDER and resume_order() == RESUME_ORDER
    assert retire_groups() == RETIRE_GROUPS


def test_a_kind_the_rules_do_not_name_prepares_last_resumes_first_and_retires_last() -> None:
    """Unknown kinds follow the named ones (sorted by name), resume before them, and retire in
    the last group; the controller and the named kinds in the input change nothing."""
    kinds = ["model", "judge", "controller", "auditor", "judge"]
    assert prepare_order(kinds) == (*PREPARE_ORDER, "auditor", "judge")
    assert resume_order(kinds) == ("judge", "auditor", *RESUME_ORDER)
    assert retire_groups(kinds) == (("environment",), ("agent",), ("model", "resources", "auditor", "judge"))
    assert [stage_index(k) for k in ("environment", "resources", "judge")] == [0, 3, 4]
