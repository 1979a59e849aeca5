"""Fault injection at every step of a commit: a crash and an I/O error (ENOSPC, EIO) at each.

The store names its steps (``store.COMMIT_STEPS``) and calls its ``on_step(name)`` hook before
each (a ``FaultPlan``'s, through ``create_app``); these tests pass a hook that fails at exactly one
step, for every step in turn.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import msgspec
import pytest

from ckpt_events.participants import create_app
from ckpt_events.participants.errors import CheckpointWriteError
from ckpt_events.participants.faults import FaultPlan
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.server import store_files
from ckpt_events.participants.server.store import (
    COMMIT_STEPS,
    MANIFEST_NAME,
    participant_dir,
    write_checkpoint,
)
from ckpt_events.participants.server.store_read import read_checkpoint
from ckpt_events.participants.workloads import ResourcesRecord
from tests.participants.helpers import ROOT, TOKEN, control, error_code, running

LINES = [
    msgspec.json.encode(
        ResourcesRecord(
            episode_id=EpisodeId(rollout), boundary=1, steps=3, session_id=rollout, counter=1, document=["x"]
        )
    )
    for rollout in ("r1", "r2")
]
FAULTS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


class _Injected:
    """An ``on_step`` hook that raises ``error`` at ``at`` (both may be changed between commits),
    and records the steps seen."""

    def __init__(self, at: str | None = None, error: BaseException | None = None) -> None:
        self.at = at
        self.error = error
        self.seen: list[str] = []

    def __call__(self, name: str) -> None:
        self.seen.append(name)
        if name == self.at and self.error is not None:
            raise self.error


def _temps(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return sorted(
        p.name for p in directory.iterdir() if p.name.startswith((".records.jsonl.", ".manifest.json."))
    )


def _records_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("records-*.jsonl")) if directory.exists() else []


def _verify(root: Path) -> list[str]:
    result = read_checkpoint(root, kind="resources", instance="res-0", record_type=ResourcesRecord)
    return sorted(r.episode_id.capture_key for r in result.records)


def test_the_steps_are_enumerated_not_sampled(tmp_path):
    """A plain commit passes through exactly COMMIT_STEPS, in order: the matrix below covers all."""
    hook = _Injected()
    write_checkpoint(
        tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES, on_step=hook
    )
    assert tuple(hook.seen) == COMMIT_STEPS and len(COMMIT_STEPS) == 11


@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_a_crash_at_any_step_leaves_no_partial_checkpoint_and_is_swept(tmp_path, step):
    """After a crash the manifest is absent or complete; the next commit sweeps every leftover."""
    crash = _Injected(step, RuntimeError(f"crash at {step}"))
    with pytest.raises(RuntimeError):
        write_checkpoint(
            tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES, on_step=crash
        )
    directory = participant_dir(tmp_path, "resources", "res-0")
    if (directory / MANIFEST_NAME).exists():
        assert _verify(tmp_path) == ["r1", "r2"]
    write_checkpoint(tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES)
    assert _temps(directory) == [] and len(_records_files(directory)) == 1
    assert _verify(tmp_path) == ["r1", "r2"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("step", COMMIT_STEPS)
async def test_an_io_error_at_any_step_is_a_json_409_that_tells_the_truth(tmp_path, step, fault):
    """ENOSPC/EIO at each step: 409 checkpoint_error, existence told truly, no temp files, retry works."""
    hook = _Injected()
    app = create_app(
        "resources", instance="res-0", token=TOKEN, checkpoint_root=ROOT, faults=FaultPlan(on_step=hook)
    )
    directory = participant_dir(tmp_path, "resources", "res-0")
    async with running(app) as client:
        for rollout in ("r1", "r2"):
            assert (
                await client.post("/work/start", json={"rollout_id": rollout, "steps": 3})
            ).status_code == 200
        assert (await control(client, "prepare")).status_code == 200
        hook.at = step
        hook.error = OSError(FAULTS[fault], os.strerror(FAULTS[fault]))
        reply = await control(client, "commit", checkpoint_dir=str(tmp_path))
        assert reply.headers["content-type"] == "application/json"
        assert error_code(reply) == (409, "checkpoint_error"), reply.text
        detail = reply.json()["error"]["detail"]
        assert os.strerror(FAULTS[fault]) in detail
        exists = (directory / MANIFEST_NAME).exists()
        assert ("no checkpoint was published" in detail) is not exists
        assert _temps(directory) == []
        assert _records_files(directory) == []  # nothing half-installed stays behind
        assert (await client.get("/ng-control/v1/checkpoint/status")).json()["phase"] == "prepared"
        hook.at = None  # the disk works again
        retry = await control(client, "commit", checkpoint_dir=str(tmp_path))
        assert retry.status_code == 200, retry.text
        assert _verify(tmp_path) == ["r1", "r2"] and _temps(directory) == []


def test_a_manifest_that_could_not_be_made_durable_is_taken_back(tmp_path):
    """An error at the last fsync removes the just-linked manifest: the detail says none exists."""
    hook = _Injected("fsync_dir_manifest", OSError(errno.EIO, "I/O error"))
    with pytest.raises(CheckpointWriteError) as info:
        write_checkpoint(
            tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES, on_step=hook
        )
    directory = participant_dir(tmp_path, "resources", "res-0")
    assert info.value.published is False and not (directory / MANIFEST_NAME).exists()
    assert _records_files(directory) == [] and _temps(directory) == []


def test_an_identical_earlier_manifest_is_reported_as_published(tmp_path):
    """A repeat of a published commit failing at its last step says the checkpoint exists (it does)."""
    write_checkpoint(tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES)
    hook = _Injected("fsync_dir_manifest", OSError(errno.ENOSPC, "No space"))
    with pytest.raises(CheckpointWriteError) as info:
        write_checkpoint(
            tmp_path, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES, on_step=hook
        )
    assert info.value.published is True and "is published" in info.value.detail
    assert _verify(tmp_path) == ["r1", "r2"]


def test_created_parent_directories_are_fsynced(tmp_path, monkeypatch):
    """Every directory the commit creates has its parent fsynced (so the path survives a crash)."""
    synced: list[Path] = []
    real = os.fsync
    # Below the root the store fsyncs by descriptor (see store_files.open_dir): name each one.
    monkeypatch.setattr(
        store_files.os,
        "fsync",
        lambda fd: (synced.append(Path(os.readlink(f"/proc/self/fd/{fd}"))), real(fd)),
    )
    base = tmp_path / "a" / "b"
    write_checkpoint(base, kind="resources", instance="res-0", checkpoint_id="c1", lines=LINES)
    created = [
        tmp_path / "a",
        base,
        base / "gym",
        base / "gym" / "resources",
        base / "gym" / "resources" / "res-0",
    ]
    assert all(path.parent in synced for path in created)
