"""Restore under a corruption matrix: every case is 422 ``invalid_checkpoint_state``, installs
nothing, never blocks, never leaks a descriptor, and never reads past its bound."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from ckpt_events.participants import create_app
from ckpt_events.participants.server.store import MANIFEST_NAME, participant_dir
from tests.participants.helpers import ROOT, TOKEN, control, error_code, running, status

ROLLOUTS = ("r1", "r2", "r3")
SCOPE = [{"rollout_id": r} for r in ROLLOUTS]


def _app(**options: object):
    return create_app("resources", instance="res-0", token=TOKEN, checkpoint_root=ROOT, **options)


async def _commit(root: Path, rollouts: tuple[str, ...] = ROLLOUTS) -> Path:
    """A real checkpoint of ``rollouts`` under ``root``; returns the participant's directory."""
    async with running(_app()) as client:
        for rollout in rollouts:
            assert (
                await client.post("/work/start", json={"rollout_id": rollout, "steps": 3})
            ).status_code == 200
        assert (await control(client, "prepare")).status_code == 200
        reply = await control(client, "commit", checkpoint_dir=str(root))
        assert reply.status_code == 200, reply.text
    return participant_dir(root, "resources", "res-0")


def _paths(directory: Path) -> tuple[Path, Path]:
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    return directory / MANIFEST_NAME, directory / manifest["records_file"]


def _rewrite(directory: Path, lines: list[bytes]) -> None:
    """Replace the records with ``lines`` and recompute the manifest's digest and count (a 'rehash')."""
    manifest_path, records = _paths(directory)
    data = b"".join(line + b"\n" for line in lines)
    records.write_bytes(data)
    manifest = json.loads(manifest_path.read_text())
    manifest.update(
        records_sha256=hashlib.sha256(data).hexdigest(), record_count=len(lines), records_file="records.jsonl"
    )
    records.rename(directory / "records.jsonl")
    manifest_path.write_text(json.dumps(manifest))


def _lines(directory: Path) -> list[bytes]:
    return _paths(directory)[1].read_bytes().splitlines()


def truncate(d: Path) -> None:
    records = _paths(d)[1]
    records.write_bytes(records.read_bytes()[:-7])


def flip(d: Path) -> None:
    records = _paths(d)[1]
    data = bytearray(records.read_bytes())
    data[len(data) // 2] ^= 0x01
    records.write_bytes(bytes(data))


def swap(d: Path) -> None:
    lines = _lines(d)
    _paths(d)[1].write_bytes(b"".join(x + b"\n" for x in [lines[1], lines[0], *lines[2:]]))


def drop_rehashed(d: Path) -> None:
    _rewrite(d, _lines(d)[:-1])


def duplicate_rehashed(d: Path) -> None:
    lines = _lines(d)
    _rewrite(d, [*lines, lines[0]])


def empty_rehashed(d: Path) -> None:
    _rewrite(d, [])


def fifo_manifest(d: Path) -> None:
    (d / MANIFEST_NAME).unlink()
    os.mkfifo(d / MANIFEST_NAME)


def fifo_records(d: Path) -> None:
    records = _paths(d)[1]
    records.unlink()
    os.mkfifo(records)


def directory_manifest(d: Path) -> None:
    (d / MANIFEST_NAME).unlink()
    (d / MANIFEST_NAME).mkdir()


def symlink_manifest(d: Path) -> None:
    (d / "elsewhere.json").write_bytes((d / MANIFEST_NAME).read_bytes())
    (d / MANIFEST_NAME).unlink()
    (d / MANIFEST_NAME).symlink_to(d / "elsewhere.json")


def oversize_manifest(d: Path) -> None:
    os.truncate(d / MANIFEST_NAME, 1 << 30)  # sparse: 1 GiB that would have to be read


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncate": (truncate, "digest"),
    "flip": (flip, "digest"),
    "swap": (swap, "digest"),
    "drop+rehash": (drop_rehashed, "lacks 1 of the 3 requested episodes: r3"),
    "duplicate+rehash": (duplicate_rehashed, "repeats episode"),
    "empty+rehash": (empty_rehashed, "lacks 3 of the 3"),
    "fifo manifest": (fifo_manifest, "not a regular file"),
    "fifo records": (fifo_records, "not a regular file"),
    "directory manifest": (directory_manifest, "not a regular file"),
    "symlink manifest": (symlink_manifest, "cannot read"),
    "oversize manifest": (oversize_manifest, "bound"),
}


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("committed")
    anyio.run(_commit, root)
    return root


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
async def test_every_corruption_refuses_and_installs_nothing(committed, tmp_path, case):
    """Each corruption: 422 invalid_checkpoint_state naming the problem, quickly, nothing installed."""
    corrupt, expected = CORRUPTIONS[case]
    shutil.copytree(committed, tmp_path / "c", symlinks=True)
    corrupt(participant_dir(tmp_path / "c", "resources", "res-0"))
    async with running(_app()) as client:
        with anyio.fail_after(5):
            reply = await control(
                client, "restore", "rs1", checkpoint_dir=str(tmp_path / "c"), episode_ids=SCOPE
            )
            assert error_code(reply) == (422, "invalid_checkpoint_state"), reply.text
            assert expected in reply.json()["error"]["detail"]
            now = await status(client)
        assert now["phase"] == "idle" and now["episodes"] == 0


async def test_an_older_consistent_pair_is_refused(tmp_path):
    """An older checkpoint (one episode) put in place of the newer one lacks what was asked: 422."""
    newer = await _commit(tmp_path / "new")
    older = await _commit(tmp_path / "old", ("r1",))
    shutil.rmtree(newer)
    shutil.copytree(older, newer)
    async with running(_app()) as client:
        reply = await control(
            client, "restore", "rs1", checkpoint_dir=str(tmp_path / "new"), episode_ids=SCOPE
        )
        assert error_code(reply) == (422, "invalid_checkpoint_state") and "r2, r3" in reply.text
        assert (await status(client))["episodes"] == 0


async def test_an_episode_never_committed_is_refused(committed):
    """A scope naming an episode the checkpoint does not hold refuses the whole restore."""
    async with running(_app()) as client:
        scope = [*SCOPE, {"rollout_id": "r9"}]
        reply = await control(client, "restore", "rs1", checkpoint_dir=str(committed), episode_ids=scope)
        assert error_code(reply) == (422, "invalid_checkpoint_state") and "r9" in reply.text
        assert (await status(client))["episodes"] == 0
        exact = await control(client, "restore", "rs2", checkpoint_dir=str(committed), episode_ids=SCOPE[:2])
        assert exact.status_code == 200 and exact.json()["restored"] == ["r1-a1", "r2-a1"]


async def test_a_records_file_past_its_bound_is_not_read(committed, tmp_path):
    """1 GiB appended (sparse) to the records: refused from its size, without reading it."""
    shutil.copytree(committed, tmp_path / "c")
    records = _paths(participant_dir(tmp_path / "c", "resources", "res-0"))[1]
    os.truncate(records, 1 << 30)
    async with running(_app(max_records_bytes=1 << 20)) as client:
        with anyio.fail_after(5):
            reply = await control(
                client, "restore", "rs1", checkpoint_dir=str(tmp_path / "c"), episode_ids=SCOPE
            )
        assert error_code(reply) == (422, "invalid_checkpoint_state") and "1048576-byte bound" in reply.text


@pytest.mark.slow
async def test_refused_restores_leak_no_descriptors(committed, tmp_path):
    """200 restores refused on a directory and on a FIFO leave the open descriptor count unchanged."""
    shutil.copytree(committed, tmp_path / "dir")
    directory_manifest(participant_dir(tmp_path / "dir", "resources", "res-0"))
    shutil.copytree(committed, tmp_path / "fifo")
    fifo_records(participant_dir(tmp_path / "fifo", "resources", "res-0"))
    async with running(_app()) as client:
        await control(client, "restore", "warm", checkpoint_dir=str(tmp_path / "dir"), episode_ids=SCOPE)
        before = len(os.listdir("/proc/self/fd"))
        for i in range(200):
            where = tmp_path / ("dir" if i % 2 else "fifo")
            reply = await control(client, "restore", f"rs{i}", checkpoint_dir=str(where), episode_ids=SCOPE)
            assert reply.status_code == 422
        assert len(os.listdir("/proc/self/fd")) == before
