"""A run directory belongs to one run: its lock keeps a second fleet out, and another run's
checkpoints are neither pruned nor restored.

The attack of issue 29: two fleets sharing one run directory; fleet X's prune deleted fleet Y's
published checkpoint, Y's ``LATEST`` pointed at X's, and Y's restart would have restored X's state.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest

from ckpt_events.participants.controller.run_directory import CollectionManifest, RunDir
from ckpt_events.participants.errors import (
    CheckpointWriteError,
    ForeignCheckpoint,
    InvalidCheckpointError,
    RunDirectoryInUse,
)
from ckpt_events.testing import capture_events
from tests.participants.controller.test_collection import collection, run_and


def _manifest(checkpoint_id: str, run_id: str, created_at: float) -> CollectionManifest:
    return CollectionManifest(
        checkpoint_id=checkpoint_id, run_id=run_id, created_at=created_at, steps=5, continued=[], restarted=[]
    )


async def test_a_second_fleet_is_kept_out_while_the_first_runs(tmp_path: Path) -> None:
    """The attack, at once: while Y runs, X's checkpoints are refused in one line (cause and fix),
    and Y's published checkpoint and LATEST stay Y's."""
    refused: list[RunDirectoryInUse] = []

    async with capture_events() as (bus, _):
        async with (
            collection(bus, tmp_path, rollouts=4, steps=10) as (y, _),
            collection(bus, tmp_path, rollouts=2, steps=3) as (x, _),
        ):

            async def y_publishes_then_x_tries() -> str:
                checkpoint_id = await y.checkpoint()
                for attempt in (x.checkpoint, x.checkpoint, x.checkpoint, x.run):
                    with pytest.raises(RunDirectoryInUse) as info:
                        await attempt()
                    refused.append(info.value)
                return checkpoint_id

            summary, y_id = await run_and(y, y_publishes_then_x_tries)
            assert summary.completed == 4 and x.checkpoints == [] and x.progress()["pending"] == 2
            # Y is done: the directory is free again, and X (the same run, by name) may go on.
            assert await x.checkpoint()
    message = str(refused[0])
    assert "\n" not in message and "in use by another fleet" in message
    assert "give this fleet its own run directory" in message and f"pid {os.getpid()}" in refused[0].holder
    assert (tmp_path / y_id / "collection.json").is_file()


def test_the_lock_is_held_by_a_live_process_only(tmp_path: Path) -> None:
    """A fleet in another process holds the directory; once that process is killed, it is free."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from ckpt_events.participants.controller.run_directory import RunDir\n"
            "with RunDir(sys.argv[1], run_id='other').claim():\n"
            "    print('held', flush=True)\n"
            "    time.sleep(60)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirectoryInUse) as info, RunDir(tmp_path).claim():
            pass
        assert f"run 'other', pid {holder.pid}" in str(info.value)
    finally:
        holder.kill()
        holder.communicate()
    mine = RunDir(tmp_path)
    with mine.claim(), mine.claim():  # re-entrant for its holder; anyone else is kept out
        with pytest.raises(RunDirectoryInUse), RunDir(tmp_path).claim():
            pass
    with RunDir(tmp_path).claim():
        pass


def test_prune_touches_only_this_runs_checkpoints(tmp_path: Path) -> None:
    """Run x's three publishes keep its two newest and never delete run y's checkpoint."""
    RunDir(tmp_path, run_id="y").publish(_manifest("y-1", "y", 1.0))
    x = RunDir(tmp_path, run_id="x")
    for i in range(2, 5):
        x.publish(_manifest(f"x-{i}", "x", float(i)))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["x-3", "x-4", "y-1"]
    assert x.latest() == "x-4"
    with pytest.raises(ForeignCheckpoint, match="belongs to run 'y', not 'x'"):
        x.read("y-1")
    assert x.read("y-1", run_id="y").checkpoint_id == "y-1"


async def test_a_restore_refuses_another_runs_checkpoint(tmp_path: Path) -> None:
    """Y's restart finds run x's checkpoint as LATEST: refused before any participant is called;
    restored only when named with its run (``from_run``)."""
    async with capture_events() as (bus, _):
        async with collection(bus, tmp_path, run_id="x") as (x, _):
            _, checkpoint_id = await run_and(x, lambda: x.checkpoint(stop=True))
        async with collection(bus, tmp_path, run_id="y") as (y, _):
            with pytest.raises(ForeignCheckpoint) as info:
                await y.run()
            assert info.value.run_id == "x" and info.value.checkpoint_id == checkpoint_id
            assert "belongs to run 'x', not 'y'" in str(info.value)
            assert y.restored_from is None and y.progress()["pending"] == 6  # nothing dispatched
            for member in y.coordinator.members:
                assert (await y.coordinator.control.status(member.url)).phase.value == "idle"
            # A checkpoint of this run is not published over run x's either.
            with pytest.raises(ForeignCheckpoint, match="of run 'x', and this is run 'y'"):
                await y.checkpoint()
            assert (tmp_path / "LATEST").read_text().strip() == checkpoint_id
            await y.restore(checkpoint_id, from_run="x")
            assert y.restored_from == checkpoint_id
            # Restored on purpose: this run now continues run x's and may publish over it.
            assert await y.checkpoint()


def test_a_symlinked_checkpoint_directory_is_never_followed(tmp_path: Path) -> None:
    """``<run>/<id>`` planted as a symlink: never read, never pruned through, never written into."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    RunDir(outside, run_id="r").publish(_manifest("c-1", "r", 1.0))
    run.mkdir()
    (run / "c-1").symlink_to(outside / "c-1", target_is_directory=True)
    mine = RunDir(run, run_id="r")
    with pytest.raises(InvalidCheckpointError, match="symlink"):
        mine.read("c-1")
    for i in range(2, 6):
        mine.publish(_manifest(f"c-{i}", "r", float(i)))
    assert (outside / "c-1" / "collection.json").is_file()
    with pytest.raises(InvalidCheckpointError, match="symlink"):
        mine.publish(_manifest("c-1", "r", 9.0))
    assert msgspec.json.decode((outside / "c-1" / "collection.json").read_bytes())["created_at"] == 1.0


def test_a_checkpoint_never_published_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    """A restore of a checkpoint whose commit failed (its directory holds some participants'
    records, no ``collection.json``) raised ``FileNotFoundError: ... 'collection.json'``, and of
    an id never taken ``FileNotFoundError: ... 'nonexistent'``: no run directory, no cause, no
    fix. Each is an ``InvalidCheckpointError`` saying why and naming the published one."""
    run = RunDir(tmp_path, run_id="r")
    with pytest.raises(InvalidCheckpointError) as info:
        run.read("c-1")
    assert str(info.value) == (
        f"no checkpoint c-1 in {tmp_path} (never taken, or removed: aborted, or pruned past the newest 2): "
        "restore a published one (none yet)"
    )
    run.publish(_manifest("c-2", "r", 2.0))
    (tmp_path / "c-3" / "gym" / "model").mkdir(parents=True)  # c-3's commit failed on another member
    with pytest.raises(InvalidCheckpointError) as info:
        run.read("c-3")
    assert str(info.value) == (
        f"checkpoint c-3 in {tmp_path} was never published (no collection.json: its commit or "
        "publish failed, or it is still being taken): restore a published one (the latest is c-2)"
    )


def test_discard_removes_an_unpublished_checkpoint_only(tmp_path: Path) -> None:
    """An aborted checkpoint's records go; a published one (this run's or another's), a symlink
    and an id never taken are left as they are."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    mine = RunDir(run, run_id="r")
    mine.publish(_manifest("c-1", "r", 1.0))
    RunDir(run, run_id="y").publish(_manifest("y-1", "y", 2.0))
    (run / "c-2" / "gym" / "model").mkdir(parents=True)  # c-2's commit failed on another member
    (outside / "c-3" / "gym").mkdir(parents=True)
    (run / "c-3").symlink_to(outside / "c-3", target_is_directory=True)
    assert [mine.discard(c) for c in ("c-1", "y-1", "c-2", "c-3", "c-4")] == [
        False,
        False,
        True,
        False,
        False,
    ]
    assert sorted(p.name for p in run.iterdir() if p.is_dir() and not p.is_symlink()) == ["c-1", "y-1"]
    assert (outside / "c-3" / "gym").is_dir()


#: Publishes c-1, then c-2 in a process whose files may not grow past 8 bytes (RLIMIT_FSIZE,
#: SIGXFSZ ignored: a full disk's stand-in that needs no privilege); prints c-2's error.
_PUBLISH_ON_A_FULL_DISK: Final = """
import resource, signal, sys

from ckpt_events.participants.controller.run_directory import CollectionManifest, RunDir
from ckpt_events.participants.errors import CheckpointWriteError

run = RunDir(sys.argv[1], run_id="r")
for checkpoint_id, created_at in (("c-1", 1.0), ("c-2", 2.0)):
    if checkpoint_id == "c-2":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8, resource.RLIM_INFINITY))
    manifest = CollectionManifest(
        checkpoint_id=checkpoint_id, run_id="r", created_at=created_at, steps=5, continued=[], restarted=[]
    )
    try:
        run.publish(manifest)
    except CheckpointWriteError as exc:
        print(type(exc).__name__, exc.published, exc, sep=": ")
"""


def test_a_publish_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """``collection.json`` failing to write (a full disk) raised a bare ``OSError: [Errno 27] File
    too large``, naming neither the file nor the checkpoint. Now it is one line saying which file,
    that nothing was published and which checkpoint is still the latest; no temp file is left."""
    done = subprocess.run(
        [sys.executable, "-c", _PUBLISH_ON_A_FULL_DISK, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == (
        f"CheckpointWriteError: False: cannot publish checkpoint c-2: writing {tmp_path}/c-2/collection.json "
        f"failed: File too large; nothing was published (the latest is still c-1): free space in {tmp_path}, "
        "or make it writable\n"
    )
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "LATEST",
        "LOCK",
        "c-1/collection.json",
    ]
    with pytest.raises(InvalidCheckpointError, match="never published"):
        RunDir(tmp_path, run_id="r").read("c-2")


def test_a_latest_that_cannot_be_written_unpublishes_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``collection.json`` written, then ``LATEST`` failing (a full disk) left the checkpoint half
    published: ``LATEST`` named the one before, yet ``read`` restored it by id, ``discard`` kept it
    and ``prune`` counted it as one of the newest two. Now its ``collection.json`` is removed and
    the error says so in one line. (An injected ENOSPC at ``os.replace`` of ``LATEST``: no
    unprivileged way fills a disk after one file and before a smaller one.)"""
    run = RunDir(tmp_path, run_id="r")
    run.publish(_manifest("c-1", "r", 1.0))
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if dst == "LATEST":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(CheckpointWriteError) as info:
        run.publish(_manifest("c-2", "r", 2.0))
    monkeypatch.undo()
    assert info.value.published is False
    assert str(info.value) == (
        f"cannot publish checkpoint c-2: writing {tmp_path}/LATEST failed: No space left on device; "
        f"nothing was published (the latest is still c-1): free space in {tmp_path}, or make it writable"
    )
    assert run.latest() == "c-1" and not (tmp_path / "c-2" / "collection.json").exists()
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temp file left
    with pytest.raises(InvalidCheckpointError, match="never published"):
        run.read("c-2")
    assert run.discard("c-2") is True
