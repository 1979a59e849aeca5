"""``sinks.aconfigure``: ``configure`` for a caller on the event loop, with a real export process.

``configure(export_process=True)`` held the loop while the child started (a Python interpreter
importing and building the sinks: 0.2-0.3 s measured, a 1 ms ticker's worst gap as long);
``aconfigure`` waits for it in a worker thread.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ckpt_events import Bus, ConfigurationError, OperationFinished, Telemetry
from ckpt_events.sinks import aconfigure, configure, read_events
from ckpt_events.sinks._configure import _planned
from tests.loop_gaps import ticking
from tests.processes import alive

pytestmark = pytest.mark.anyio


def _export_children() -> list[int]:
    """This process's live export children, whichever of its threads started them."""
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_text()
        except OSError:
            continue
        if alive(pid) and "sinks._export.child" in cmdline:
            found.append(pid)
    return found


async def test_the_loop_runs_while_the_export_process_starts(tmp_path: Path) -> None:
    """A 1 ms ticker keeps ticking through ``aconfigure(export_process=True)``: its worst gap is
    a small part of the start (``configure`` on the loop: a gap as long as the whole start), and
    the child gets every event, as with ``configure``."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        async with ticking() as gaps:
            started = time.monotonic()
            configured = await aconfigure(bus, jsonl_path=log, export_process=True)
            took = time.monotonic() - started
        async with configured:
            assert configured.export_process is not None
            assert [sub.name for sub in configured.subscriptions] == ["export-process"]
            tel = Telemetry(bus, kind="resources", instance="resources-0")
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set(records=3)
    assert took > 0.05 and len(gaps) >= 10, (took, len(gaps))
    assert max(gaps) < took / 2, (max(gaps), took)
    finished = [e for _, e in read_events(log) if isinstance(e, OperationFinished)]
    assert [(e.checkpoint_id, e.records) for e in finished] == [("c1", 3)]
    assert not _export_children()


async def test_cancelled_while_the_child_starts_leaves_no_child_and_no_sink(tmp_path: Path) -> None:
    """Cancelled 20 ms into the start: the child is ended and reaped, nothing is subscribed, and
    the JSON-lines file can be configured again at once."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        with anyio.move_on_after(0.02) as scope:
            await aconfigure(bus, jsonl_path=log, export_process=True)
        assert scope.cancelled_caught
        assert bus.stats().sinks == ()
        assert not _export_children()
        async with configure(bus, jsonl_path=log) as again:
            assert [sub.name for sub in again.subscriptions] == ["jsonl"]


def test_configure_aconfigure_and_their_plan_take_the_same_parameters() -> None:
    """The three spell out the same parameters, kinds, defaults and annotations (explicit for
    help() and completion): one added to ``configure`` alone would be missing from ``aconfigure``
    without a word (its default passed on), as mypy checks only the names forwarded."""
    wanted = inspect.signature(configure).parameters
    assert inspect.signature(aconfigure).parameters == wanted
    assert inspect.signature(_planned).parameters == wanted
    assert len(wanted) == 15  # bus and 14 keywords


async def test_the_same_errors_as_configure(tmp_path: Path) -> None:
    """A setting the child refuses is its one-line ``ConfigurationError``, no child left; an
    in-process part with ``export_process`` is refused before anything starts; without an export
    process it is ``configure``."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=r"OTEL_TRACES_EXPORTER.*'bogus'") as caught:
            await aconfigure(bus, export_process=True, environ={"OTEL_TRACES_EXPORTER": "bogus"})
        assert "\n" not in str(caught.value)
        with pytest.raises(ConfigurationError, match="export_process cannot take metric_readers"):
            await aconfigure(bus, export_process=True, metric_readers=[InMemoryMetricReader()])
        assert bus.stats().sinks == () and not _export_children()
        async with await aconfigure(bus, jsonl_path=tmp_path / "e.jsonl") as configured:
            assert configured.export_process is None
            assert [sub.name for sub in configured.subscriptions] == ["jsonl"]


async def test_a_place_claimed_while_the_child_started_is_refused_and_the_child_ended(
    tmp_path: Path,
) -> None:
    """Two ``aconfigure`` of one bus to one file at once: one gets it, the other's
    ``ConfigurationError`` (every event written twice) comes once its child is up, and that
    child is ended."""
    log = tmp_path / "events.jsonl"
    results: list[object] = []

    async def one() -> None:
        try:
            results.append(await aconfigure(bus, jsonl_path=log, export_process=True))
        except ConfigurationError as exc:
            results.append(exc)

    async with Bus() as bus:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        errors = [r for r in results if isinstance(r, ConfigurationError)]
        kept = [r for r in results if not isinstance(r, ConfigurationError)]
        assert len(errors) == 1 and len(kept) == 1, results
        assert [s.name for s in bus.stats().sinks] == ["export-process"]
        await kept[0].aclose()  # type: ignore[attr-defined]
    assert not _export_children()
