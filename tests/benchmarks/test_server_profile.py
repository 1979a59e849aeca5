"""server_profile: the parts of a loaded server's CPU per request, timed inside real servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks import rotel, server_app, server_profile
from ckpt_events.testing import MemorySink


def _shape(events: list[object]) -> list[tuple[object, ...]]:
    """What a sink is told, without ids and clock readings."""
    fields = ("operation", "step", "checkpoint_id", "outcome", "records", "bytes")
    return [(type(e).__name__, *(getattr(e, f, None) for f in fields)) for e in events]


async def test_the_timed_handler_makes_the_calls_the_suites_handler_makes() -> None:
    """The profile's sections time the very request the server suite measures: the same
    events, in the same order, with the same attributes."""
    told = []
    for instrument in (server_app._ours, server_profile._sectioned):
        sink = MemorySink()
        async with Bus() as bus:
            bus.subscribe(sink)
            instrument(Telemetry(bus, kind="resources", instance="resources-0"))(b"x" * 2048)
            await bus.flush()
        told.append(_shape(sink.events))
    assert told[0] == told[1]
    assert len(told[0]) == 6  # an operation and two steps, each started and finished


def test_each_part_is_measured_and_a_missing_collector_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real servers under load: the uninstrumented one has no telemetry parts, the one
    with a sink has its calls and its delivery task timed; the parts fit inside the server's
    CPU. Without rotel, the variants that need it are named with why."""
    monkeypatch.setenv(rotel.ENV_BINARY, str(tmp_path / "no-rotel-agent"))
    result = server_profile.run(requests=640, slices=2, variants=("uninstrumented", "null", "all"))
    assert result["skipped"] == {"all": rotel.why_missing()}
    parts = result["parts"]
    assert set(parts) == {"uninstrumented", "null"}
    assert result["answered"] == {"uninstrumented": 640, "null": 640}
    names = server_profile.PARTS
    bare, ours = (
        dict(zip(names, parts["uninstrumented"], strict=True)),
        dict(zip(names, parts["null"], strict=True)),
    )
    delivery, calls = "sinks' delivery tasks", "handler: telemetry calls, in all"
    assert bare[delivery] == 0 and bare[calls] == 0
    assert ours[delivery] > 0 and ours[calls] > 0
    for part in (bare, ours):
        # Nested clocks of one kind (wall time inside the server); the app's wall time against
        # /proc's CPU is no invariant: on a busy machine the first outgrew the second.
        assert 0 < part["handler: the unit of work"] < part["app: FastAPI, the route, the handler"]
        assert part["server CPU (/proc)"] > 0
    sections = [ours[f"call: {name}"] for name in server_profile.SECTIONS]
    assert all(s > 0 for s in sections) and sum(sections) == pytest.approx(ours[calls])
    header, rows = server_profile._table(result)
    assert header == ["us per request", "uninstrumented", "null"] and len(rows) == len(names)
