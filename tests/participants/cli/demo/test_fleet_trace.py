"""``demo --instances 2 --processes --otlp-endpoint``: eight participant processes and the controller
give a real collector (rotel) one trace per checkpoint, holding every participant's operations
under the controller's spans, and one trace for the restore (``bench --only fleet_trace`` runs
the same at 4, 16 and 64 participants); the last checkpoint's trace is whole there, though the
servers that made it are killed with SIGKILL right after. One run, read by both tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ckpt_events.benchmarks.load import stop_process
from ckpt_events.benchmarks.rotel import agent_binary
from ckpt_events.benchmarks.rotel_spans import ReceivedSpan, received_spans, settled_text
from ckpt_events.participants.cli.demo.plan import fleet_members
from ckpt_events.vocab import (
    COLLECTION_SPANS,
    COORDINATE_SPANS,
    OPERATION_SPANS,
    STAGE_SPANS,
    Attr,
    CollectionAction,
    Operation,
)
from tests.sinks.otlp.test_collector import _start

CHECKPOINT = COLLECTION_SPANS[CollectionAction.CHECKPOINT]
RESTORE = COLLECTION_SPANS[CollectionAction.RESTORE]
PREPARE, COMMIT = OPERATION_SPANS[Operation.PREPARE], OPERATION_SPANS[Operation.COMMIT]
WRITE = "gym.checkpoint.write"


def _one(spans: list[ReceivedSpan], name: str, instance: str) -> ReceivedSpan:
    """The one span ``name`` of ``instance`` among ``spans`` (fails naming what it found)."""
    found = [s for s in spans if s.name == name and s.attributes.get(Attr.INSTANCE) == instance]
    assert len(found) == 1, (name, instance, len(found))
    return found[0]


@dataclass(frozen=True)
class FleetRun:
    """A finished ``demo --processes --instances 2 --checkpoints 2 --otlp-endpoint`` process."""

    code: int
    err: str
    spans: list[ReceivedSpan]


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    """The demo run as its own process, exporting to a collector of its own (each demo starts ten
    server processes twice: one run serves every test here)."""
    binary = agent_binary()
    if binary is None:
        pytest.skip("the rotel-agent binary (package rotel) is not installed")
    tmp_path = tmp_path_factory.mktemp("fleet-trace")
    out = tmp_path / "collector.out"
    endpoint, collector = _start(binary, tmp_path, out)
    try:
        argv = ["demo", "--processes", "--instances", "2", "--checkpoints", "2", "--otlp-endpoint", endpoint]
        argv += ["--rollouts", "80", "--concurrency", "8", "--workdir", str(tmp_path / "work")]
        run = subprocess.run(
            [sys.executable, "-m", "ckpt_events.participants.cli", *argv],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        # Everything was sent before the demo exited; the collector prints each request as it decodes it.
        yield FleetRun(run.returncode, run.stderr, received_spans(settled_text(out)))
    finally:
        stop_process(collector)


@pytest.mark.collector
@pytest.mark.e2e
@pytest.mark.slow
def test_every_checkpoint_is_one_trace_holding_every_participant_under_the_controller(
    fleet_run: FleetRun,
) -> None:
    """Both checkpoints: one trace id each, every one of the 8 participants' prepare under its
    kind's stage span and commit under ``coordinate.commit``; the restore: one trace, every
    restored participant's restore under ``coordinate.restore``. The first fleet is killed with
    SIGKILL after the last checkpoint: its participants' spans got out before."""
    assert fleet_run.code == 0, fleet_run.err[-2000:]
    spans = fleet_run.spans
    members = fleet_members(2)

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


@pytest.mark.collector
@pytest.mark.e2e
@pytest.mark.slow
def test_the_published_checkpoints_participant_spans_reach_the_collector_before_the_crash(
    fleet_run: FleetRun,
) -> None:
    """Every participant's prepare and commit spans of each published checkpoint, with their steps,
    are at the collector in the checkpoint's one trace, the last one's too though SIGKILL follows
    it (before: prepare 0, commit 0, write 0 of 4: they waited out the export linger and died)."""
    spans = fleet_run.spans
    published = [
        s for s in spans if s.name == CHECKPOINT and s.attributes.get(Attr.PUBLISHED) == "Bool(true)"
    ]
    assert len(published) == 2, (fleet_run.code, fleet_run.err[-2000:])
    instances = [instance for _, instance in fleet_members(2)]
    for checkpoint in published:
        checkpoint_id, trace_id = checkpoint.attributes[Attr.ID], checkpoint.trace_id
        found = {
            (s.attributes[Attr.INSTANCE], s.name)
            for s in spans
            if s.attributes.get(Attr.ID) == checkpoint_id
            and Attr.INSTANCE in s.attributes
            and s.trace_id == trace_id
        }
        wanted = {(i, OPERATION_SPANS[op]) for i in instances for op in (Operation.PREPARE, Operation.COMMIT)}
        assert wanted <= found, (checkpoint_id, sorted(wanted - found))
        # The steps went with their operations: one write per participant, in the same trace.
        writes = [s for s in spans if s.name == WRITE and s.trace_id == trace_id]
        assert len(writes) == len(instances), checkpoint_id
    assert fleet_run.code == 0, fleet_run.err[-2000:]
