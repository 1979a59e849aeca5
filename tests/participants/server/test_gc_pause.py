"""gc_paused keeps the collector off for a block (nesting and threads), freeze, the off switch."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_events import Bus
from ckpt_events.participants import create_app
from ckpt_events.participants.server import gc_pause
from ckpt_events.participants.server.gc_pause import freeze, gc_paused
from tests.participants.helpers import TOKEN, control, running


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on at the start, and as it was at the end (whatever a test did)."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_on_after(collector_on: None) -> None:
    """Inside the block the collector is disabled; afterwards it is enabled again."""
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_blocks_keep_it_off_until_the_outermost_ends(collector_on: None) -> None:
    """The inner block's end does not turn the collector back on; the outer one's does."""
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_still_restores_the_collector(collector_on: None) -> None:
    """A block left by an exception turns the collector back on and lets the exception go."""
    with pytest.raises(RuntimeError, match="boom"), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_off_before_stays_off(collector_on: None) -> None:
    """The prior state is restored: a collector disabled by the caller is not enabled."""
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_concurrent_blocks_in_threads_keep_it_off_until_the_last_ends(collector_on: None) -> None:
    """Two threads' overlapping blocks: the first to end leaves it off, the last turns it on."""
    entered, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with gc_paused():
            entered.set()
            release.wait(5)
        seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with gc_paused():
        thread.start()
        assert entered.wait(5)
    assert not gc.isenabled()  # this block ended, the other thread's has not
    release.set()
    thread.join(5)
    assert seen == [True] and gc.isenabled()


def test_disabled_gc_paused_and_freeze_do_nothing(
    collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ENABLED = False the block leaves the collector on and freeze moves nothing."""
    monkeypatch.setattr(gc_pause, "ENABLED", False)
    before = gc.get_freeze_count()
    with gc_paused():
        assert gc.isenabled()
    freeze()
    assert gc.get_freeze_count() == before


def test_freeze_moves_live_objects_to_the_permanent_generation() -> None:
    """freeze() puts what is alive now, including objects made just before, in the permanent generation."""
    before = gc.get_freeze_count()
    kept = [[i] for i in range(100)]
    freeze()
    try:
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()  # else the test process's whole heap stayed frozen for the rest of the suite


@pytest.mark.anyio
async def test_a_restored_participant_that_ended_is_freed_not_kept_frozen(tmp_path: Path) -> None:
    """Each restore froze the whole heap, the app serving it included: a participant ended
    after its restore (a test's app, the demo's replaced participants) stayed in memory for
    the process's life (60 of 60 apps after 60 restores, ~1,400 objects and ~180 kB each).
    Its lifespan's end puts what it froze back in the collector's reach."""
    async with running(_participant(tmp_path)) as client:
        for i in range(3):
            assert (
                await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 5})
            ).status_code == 200
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
    episodes = [{"rollout_id": f"r{i}", "attempt": 0} for i in range(3)]
    apps: list[weakref.ref[Any]] = []
    try:
        for i in range(3):
            app = _participant(tmp_path)
            apps.append(weakref.ref(app))
            async with running(app) as client:
                reply = await control(
                    client, "restore", f"c{i + 2}", checkpoint_dir=str(tmp_path), episode_ids=episodes
                )
                assert reply.status_code == 200, reply.text
            del app, client
        gc.collect()
        assert [ref() for ref in apps] == [None, None, None]
    finally:
        gc.unfreeze()  # nothing of this test kept out of the collector's reach for the suite


def _participant(root: Path) -> Any:
    return create_app("environment", instance="env-thaw", token=TOKEN, bus=Bus(), checkpoint_root=root)
