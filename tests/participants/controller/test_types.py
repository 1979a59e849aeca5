"""What the controller records and decides on (``participants.controller.types``): members in stage
order, failure records on a span, a prepare's result."""

from __future__ import annotations

from ckpt_events.participants.controller.types import (
    Member,
    MemberFailure,
    PrepareResult,
    failures_value,
    read_failures,
)
from ckpt_events.participants.protocol import EpisodeId, PrepareReply, PrepareReport
from ckpt_events.vocab import Phase


def test_failure_records_are_bounded_and_tolerate_foreign_values() -> None:
    """At most 16 members are recorded on a span; a value that is not a record reads as none."""
    members = [Member(name=f"a-{i:02}", kind="agent", instance=f"a-{i:02}", url="u") for i in range(40)]
    value = failures_value(members, {m.name: "unreachable at u: ConnectError" for m in members})
    recorded = read_failures(value)
    assert len(recorded) == 16
    assert recorded[0] == MemberFailure("agent", "a-00", "unreachable at u: ConnectError")
    assert read_failures("not json") == read_failures(3) == read_failures('{"kind": 1}') == []


def test_members_sort_by_stage_then_kind_then_name() -> None:
    """The prepare order: environment, model, agent, resources; a user's kind by its place; names last."""
    members = [
        Member("resources-0", "resources", "resources-0", "u"),
        Member("agent-1", "agent", "agent-1", "u"),
        Member("model-0", "model", "model-0", "u"),
        Member("agent-0", "agent", "agent-0", "u"),
        Member("environment-0", "environment", "environment-0", "u"),
    ]
    ordered = [m.name for m in sorted(members, key=Member.sort_key)]
    assert ordered == ["environment-0", "model-0", "agent-0", "agent-1", "resources-0"]


def test_a_prepare_result_sums_blockers_and_leaves_restarts_out_of_what_continues() -> None:
    """Blockers by member (only those with some), their full count, and the episodes a commit may
    continue: those no member restarted."""

    def reply(blockers: list[str], count: int, restarts: list[str]) -> PrepareReply:
        report = PrepareReport(ready=not blockers, blockers=blockers, blocker_count=count, restarts=restarts)
        return PrepareReply(phase=Phase.PREPARING, report=report)

    result = PrepareResult(
        "c1",
        False,
        "agent",
        {"agent-0": reply(["r1"], 150, ["r2-a1"]), "model-0": reply([], 0, ["r3"])},
    )
    assert result.blockers() == {"agent-0": ["r1"]}
    assert result.blocker_count() == 150
    assert result.restarts() == {"r2-a1", "r3"}
    episodes = [EpisodeId("r1"), EpisodeId("r2", 1), EpisodeId("r3"), EpisodeId("r3", 1)]
    assert result.continued(episodes) == [EpisodeId("r1"), EpisodeId("r3", 1)]
