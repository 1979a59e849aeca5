"""Events built by hand that JSON cannot hold, handed to the JSON-lines sink among good ones: a
trace id past 128 bits, a ``str`` subclass msgspec refuses. One such event failed its whole batch
(the good events beside it lost with it: 100 of 101 here); now it alone is left out and counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import OperationFinished
from ckpt_events.sinks import JsonLinesSink, read_events


class _Text(str):
    """A ``str`` subclass, which msgspec refuses to encode."""


def _event(index: int, **fields: object) -> OperationFinished:
    given: dict[str, object] = {
        "kind": "resources",
        "instance": "r0",
        "trace_id": index + 1,
        "span_id": index + 1,
        "start_ns": 1_000,
        "end_ns": 2_000,
        "operation": "commit",
        "checkpoint_id": f"c{index}",
    }
    return OperationFinished(**{**given, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("max_bytes", [None, 1 << 20], ids=["plain", "rotating"])
@pytest.mark.parametrize(
    "bad",
    [{"trace_id": 1 << 200}, {"span_id": -1}, {"instance": _Text("r0")}],
    ids=["trace-id-past-128-bits", "negative-span-id", "str-subclass"],
)
def test_an_unencodable_event_is_left_out_alone(
    tmp_path: Path, bad: dict[str, object], max_bytes: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """100 good events and one unencodable in the middle of a batch: the 100 are written and read
    back, the bad one counted in ``stats().unencodable`` and said once."""
    path = tmp_path / "events.jsonl"
    batch = [_event(i) for i in range(100)]
    batch.insert(50, _event(999, **bad))
    sink = JsonLinesSink(path, max_bytes=max_bytes)
    try:
        sink.handle(batch)
        sink.handle([_event(1_000, **bad)])
    finally:
        sink.close()
    read = [event for _, event in read_events(path)]
    ids = [e.checkpoint_id for e in read if isinstance(e, OperationFinished)]
    assert ids == [f"c{i}" for i in range(100)]
    stats = sink.stats()
    assert (stats.events, stats.unencodable, stats.failed) == (100, 2, 0)
    said = [r.getMessage() for r in caplog.records if "could not be written as JSON" in r.getMessage()]
    assert len(said) == 1 and "stats().unencodable" in said[0]
