"""``demo --processes --otlp-endpoint`` to a real collector (rotel): the published checkpoint's
trace is whole there, though the servers that made it are killed with SIGKILL right after."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks.rotel_spans import received_spans
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.workloads.registry import KINDS
from tests.sinks.otlp.test_collector import _wait_for, collector

__all__ = ["collector"]

pytestmark = [pytest.mark.collector, pytest.mark.e2e, pytest.mark.slow]

ID: str = "nemo.gym.checkpoint.id"
INSTANCE: str = "nemo.gym.checkpoint.instance"


def test_the_published_checkpoints_participant_spans_reach_the_collector_before_the_crash(
    collector: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every participant's prepare and commit spans of the published checkpoint, with their steps,
    are at the collector in the checkpoint's one trace (before: prepare 0, commit 0, write 0 of 4:
    they waited out the export linger and died with the SIGKILL that followed the checkpoint)."""
    endpoint, out = collector
    argv = ["demo", "--processes", "--rollouts", "60", "--concurrency", "8", "--otlp-endpoint", endpoint,
            "--workdir", str(tmp_path / "work")]  # fmt: skip
    code = main(argv)
    printed = capsys.readouterr()
    text = _wait_for(out, ["gym.checkpoint.collection.restore"])
    spans = received_spans(text)
    published = [
        s for s in spans if s.name == "gym.checkpoint.collection.checkpoint" and s.attributes.get(
            "nemo.gym.checkpoint.published") == "Bool(true)"
    ]  # fmt: skip
    assert len(published) == 1, (code, printed.err[-2000:])
    checkpoint_id, trace_id = published[0].attributes[ID], published[0].trace_id
    instances = [instance for _, instance in KINDS.members()]
    found = {
        (s.attributes[INSTANCE], s.name)
        for s in spans
        if s.attributes.get(ID) == checkpoint_id and INSTANCE in s.attributes and s.trace_id == trace_id
    }
    wanted = {(i, f"gym.checkpoint.{op}") for i in instances for op in ("prepare", "commit")}
    assert wanted <= found, sorted(wanted - found)
    # The steps went with their operations: one write per participant, in the same trace.
    writes = [s for s in spans if s.name == "gym.checkpoint.write" and s.trace_id == trace_id]
    assert len(writes) == len(instances)
    assert code == 0, printed.err[-2000:]
