"""``demo --instances 2 --processes --otlp-endpoint``: eight participant processes and the controller
give a real collector (rotel) one trace per checkpoint, holding every participant's operations
under the controller's spans, and one trace for the restore (``bench --only fleet_trace`` runs
the same at 4, 16 and 64 participants)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks.rotel_spans import ReceivedSpan, received_spans, settled_text
from ckpt_events.participants.cli.demo.plan import fleet_members
from ckpt_events.participants.cli.demo.runner import _check_members
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.controller.coordinator import Coordinator, Member
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.vocab import (
    COLLECTION_SPANS,
    CONTROLLER_INSTANCE,
    COORDINATE_SPANS,
    OPERATION_SPANS,
    STAGE_SPANS,
    Attr,
    CollectionAction,
    Kind,
    Operation,
)
from tests.sinks.otlp.test_collector import collector

__all__ = ["collector"]

CHECKPOINT = COLLECTION_SPANS[CollectionAction.CHECKPOINT]
RESTORE = COLLECTION_SPANS[CollectionAction.RESTORE]
PREPARE, COMMIT = OPERATION_SPANS[Operation.PREPARE], OPERATION_SPANS[Operation.COMMIT]


def _one(spans: list[ReceivedSpan], name: str, instance: str) -> ReceivedSpan:
    """The one span ``name`` of ``instance`` among ``spans`` (fails naming what it found)."""
    found = [s for s in spans if s.name == name and s.attributes.get(Attr.INSTANCE) == instance]
    assert len(found) == 1, (name, instance, len(found))
    return found[0]


@pytest.mark.collector
@pytest.mark.e2e
@pytest.mark.slow
def test_every_checkpoint_is_one_trace_holding_every_participant_under_the_controller(
    collector: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both checkpoints: one trace id each, every one of the 8 participants' prepare under its
    kind's stage span and commit under ``coordinate.commit``; the restore: one trace, every
    restored participant's restore under ``coordinate.restore``. The first fleet is killed with
    SIGKILL after the last checkpoint: its participants' spans got out before."""
    endpoint, out = collector
    argv = ["demo", "--processes", "--instances", "2", "--checkpoints", "2", "--otlp-endpoint", endpoint]
    argv += ["--rollouts", "80", "--concurrency", "8", "--workdir", str(tmp_path / "work")]
    code = main(argv)
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    members = fleet_members(2)
    # Everything was sent before main() returned; the collector prints each request as it decodes it.
    spans = received_spans(settled_text(out))

    roots = [s for s in spans if s.name == CHECKPOINT]
    assert len(roots) == 2, [s.attributes.get(Attr.ID) for s in roots]
    for root in roots:
        checkpoint_id = root.attributes[Attr.ID]
        carrying = {
            s.trace_id for s in spans if s.attributes.get(Attr.ID) == checkpoint_id and s.name != RESTORE
        }
        assert carrying == {root.trace_id}, checkpoint_id
        trace = [s for s in spans if s.trace_id == root.trace_id]
        by_id = {s.span_id: s for s in trace}
        commit = _one(trace, COORDINATE_SPANS[Operation.COMMIT], "coordination")
        for kind, instance in members:
            prepare = _one(trace, PREPARE, instance)
            stage = by_id[prepare.parent_id]
            assert stage.name == STAGE_SPANS[kind], (instance, stage.name)
            assert by_id[stage.parent_id].name == COORDINATE_SPANS[Operation.PREPARE]
            assert _one(trace, COMMIT, instance).parent_id == commit.span_id, instance

    [restore] = [s for s in spans if s.name == RESTORE]
    trace = [s for s in spans if s.trace_id == restore.trace_id]
    coordinate = _one(trace, COORDINATE_SPANS[Operation.RESTORE], "coordination")
    assert coordinate.parent_id == restore.span_id
    for _, instance in members:
        restored = _one(trace, OPERATION_SPANS[Operation.RESTORE], instance)
        assert restored.parent_id == coordinate.span_id, instance
        assert restored.attributes[Attr.ID] == coordinate.attributes[Attr.ID]


async def test_a_started_server_that_discovery_does_not_find_fails_the_run() -> None:
    """A server whose port another program took first (it failed to bind; that program answers 404)
    is dropped by discovery as no participant: the demo refuses to go on without it (before, a
    fleet ran without resources-0 and every check passed)."""
    tel = Telemetry(Bus(), kind=Kind.CONTROLLER, instance=CONTROLLER_INSTANCE)
    started = {instance: f"http://127.0.0.1:{9000 + i}" for i, (_, instance) in enumerate(fleet_members(1))}
    members = [
        Member(instance, Kind(kind), instance, started[instance]) for kind, instance in fleet_members(1)
    ]
    async with Coordinator(members[:-1], token="t", telemetry=tel) as without:
        with pytest.raises(DemoFailed, match=r"resources-0 is not found at http://127\.0\.0\.1:9003"):
            _check_members(without, started)
    async with Coordinator(members, token="t", telemetry=tel) as whole:
        _check_members(whole, started)
