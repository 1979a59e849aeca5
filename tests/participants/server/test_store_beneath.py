"""Nothing outside the root: a symlink below ``checkpoint_dir`` is never followed out.

The attack of issue 29: ``root/x/gym -> /elsewhere`` made a commit write its manifest and records
outside the participant's root, and a restore read them back. Every directory of the layout is
now walked from the root one component at a time without following a symlink, for commits and
restores, one-process and multi-worker, and for the sweep of a crashed commit's leftovers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.store import MANIFEST_NAME, participant_dir, write_checkpoint
from ckpt_events.participants.server.store_files import Beneath, resolve_under
from ckpt_events.participants.server.store_read import read_checkpoint
from ckpt_events.participants.workloads import ResourcesRecord
from tests.participants.helpers import TOKEN, control, error_code, resources_record, running

pytestmark = pytest.mark.anyio

#: Where each attack plants its symlink, below ``root/x``: the layout's three directories.
PLANTS = ["gym", "gym/resources", "gym/resources/res-0"]


def _record(rollout_id: str) -> bytes:
    return msgspec.json.encode(resources_record(rollout_id))


def _plant(root: Path, elsewhere: Path, below: str) -> None:
    """``root/x/<below>`` is a symlink to ``elsewhere`` (its parents real directories)."""
    link = root / "x" / below
    link.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere, target_is_directory=True)


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _app(root: Path, **options: Any) -> Any:
    return create_app("resources", instance="res-0", token=TOKEN, checkpoint_root=root, **options)


def _workers_app(root: Path, bus: Bus, factory: Any) -> Any:
    """A two-worker environment participant, its workers tasks in this process."""
    return create_app(
        "environment",
        instance="env-0",
        token=TOKEN,
        bus=bus,
        checkpoint_root=root,
        workers=2,
        worker_factory=factory,
    )


@pytest.mark.parametrize("below", PLANTS)
async def test_a_commit_through_a_symlink_below_the_root_writes_nothing_outside(tmp_path, below):
    """The attack: commit answers 422 naming the symlink, and nothing lands outside the root."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    _plant(root, elsewhere, below)
    async with running(_app(root)) as client:
        assert (await client.post("/work/start", json={"rollout_id": "r1", "steps": 3})).status_code == 200
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        committed = await control(client, "commit", checkpoint_dir="x")
        assert error_code(committed) == (422, "invalid_checkpoint_state"), committed.text
        assert "symlink" in committed.json()["error"]["detail"]
        assert (await control(client, "resume")).status_code == 200
    assert _files(elsewhere) == []


@pytest.mark.parametrize("below", PLANTS)
async def test_a_restore_through_a_symlink_below_the_root_reads_nothing_outside(tmp_path, below):
    """A valid checkpoint outside the root, reached by a symlink below it, is refused (422)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    write_checkpoint(outside, kind="resources", instance="res-0", checkpoint_id="c1", lines=[_record("r1")])
    _plant(root, outside / below, below)
    async with running(_app(root)) as client:
        restored = await control(
            client, "restore", "c2", checkpoint_dir="x", episode_ids=[{"rollout_id": "r1"}]
        )
        assert error_code(restored) == (422, "invalid_checkpoint_state"), restored.text
        assert "symlink" in restored.json()["error"]["detail"]
        assert (await client.get("/work/r1-a1")).status_code == 404  # nothing installed


async def test_the_sweep_never_deletes_through_a_symlink(tmp_path):
    """A crashed commit's leftovers are swept only inside the root: files outside survive."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    _plant(root, elsewhere, "gym/resources/res-0")
    bait = [f"records-{'0' * 64}.jsonl", ".records.jsonl.0123456789abcdef"]
    for name in bait:
        (elsewhere / name).write_bytes(b"precious\n")
    with pytest.raises(InvalidCheckpointError, match="symlink"):
        write_checkpoint(
            resolve_under(root, "x"), kind="resources", instance="res-0", checkpoint_id="c1", lines=[]
        )
    assert _files(elsewhere) == sorted(bait)


async def test_a_multi_worker_commit_and_restore_through_a_symlink_are_refused(tmp_path):
    """The workers write and read their parts by the same walk: nothing outside the root."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    _plant(root, elsewhere, "gym")
    bus = Bus()

    def factory_on(on: Bus) -> Any:
        # Each app's workers emit on that app's own bus (the first one is closed with its app).
        def factory(index: int) -> Any:
            return make_workload("environment", Telemetry(on, kind="environment", instance="env-0"))

        return factory

    app = _workers_app(root, bus, factory_on(bus))
    async with running(app) as client:
        for i in range(4):
            started = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 4})
            assert started.status_code == 200, started.text
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        committed = await control(client, "commit", checkpoint_dir="x")
        assert error_code(committed) == (422, "invalid_checkpoint_state"), committed.text
        assert (await control(client, "resume")).status_code == 200
        # A real checkpoint inside the root, then its directory swapped for a link out.
        assert (await control(client, "prepare", "c2")).json()["phase"] == "prepared"
        good = await control(client, "commit", "c2", checkpoint_dir="y")
        assert good.status_code == 200, good.text
        assert (await control(client, "resume", "c2")).status_code == 200
    assert _files(elsewhere) == []
    os.rename(root / "y" / "gym", elsewhere / "gym")
    (root / "y" / "gym").symlink_to(elsewhere / "gym", target_is_directory=True)
    fresh_bus = Bus()
    async with running(_workers_app(root, fresh_bus, factory_on(fresh_bus))) as fresh:
        episodes = [{"rollout_id": f"r{i}"} for i in range(4)]
        restored = await control(fresh, "restore", "c3", checkpoint_dir="y", episode_ids=episodes)
        assert error_code(restored) == (422, "invalid_checkpoint_state"), restored.text
        assert "symlink" in restored.json()["error"]["detail"]


def test_an_absolute_checkpoint_dir_is_walked_below_the_root_too(tmp_path):
    """An absolute ``checkpoint_dir`` under the root is walked from the root: a link in it is refused."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    _plant(root, elsewhere, "gym")
    under = resolve_under(root, str(root / "x"))
    assert under == resolve_under(root, "x")
    with pytest.raises(InvalidCheckpointError, match="symlink"):
        write_checkpoint(under, kind="resources", instance="res-0", checkpoint_id="c1", lines=[])
    with pytest.raises(InvalidCheckpointError, match="outside"):
        resolve_under(root, str(elsewhere))
    assert _files(elsewhere) == []


def test_a_symlinked_manifest_is_never_written_through(tmp_path):
    """``manifest.json`` planted as a symlink to a file outside: the commit refuses, the file is intact."""
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"{}")
    directory = participant_dir(tmp_path / "root", "resources", "res-0")
    directory.mkdir(parents=True)
    (directory / MANIFEST_NAME).symlink_to(outside)
    with pytest.raises(InvalidCheckpointError):
        write_checkpoint(
            tmp_path / "root", kind="resources", instance="res-0", checkpoint_id="c1", lines=[_record("r1")]
        )
    assert outside.read_bytes() == b"{}"
    with pytest.raises(InvalidCheckpointError):
        read_checkpoint(tmp_path / "root", kind="resources", instance="res-0", record_type=ResourcesRecord)


def test_a_beneath_never_holds_a_name_that_walks_up(tmp_path):
    """'..', '.', '' and names with a slash are refused however a ``Beneath`` is built (a worker's
    frame too): a '..' would leave the root without any symlink."""
    for parts in [("..",), ("x", "..", "y"), (".",), ("",), ("a/b",)]:
        with pytest.raises(InvalidCheckpointError, match="not a directory name"):
            Beneath(tmp_path, parts)
        with pytest.raises(InvalidCheckpointError, match="not a directory name"):
            Beneath.from_wire([str(tmp_path), *parts])
    assert Beneath.from_wire(resolve_under(tmp_path, "a/b").wire()) == Beneath(tmp_path.resolve(), ("a", "b"))
