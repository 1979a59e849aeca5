"""The store: records then a create-only manifest; every corruption installs nothing."""

from __future__ import annotations

import json
import os

import msgspec
import pytest

from ckpt_events.participants import create_app
from ckpt_events.participants.errors import (
    CheckpointWriteError,
    InvalidCheckpointError,
    ProtocolRefusal,
    WriteStopped,
)
from ckpt_events.participants.server.store import (
    MANIFEST_NAME,
    WriteStop,
    participant_dir,
    prepare_directory,
    withdraw,
    write_checkpoint,
)
from ckpt_events.participants.server.store_read import read_checkpoint
from ckpt_events.participants.workloads import ResourcesRecord
from tests.participants.helpers import ROOT, TOKEN, control, error_code, resources_record, running


def record(rollout_id: str, boundary: int = 1) -> bytes:
    return msgspec.json.encode(resources_record(rollout_id, boundary=boundary))


def write(root, checkpoint_id="c1", rollouts=("a", "b"), instance="res-0", stop=None):
    return write_checkpoint(
        root,
        kind="resources",
        instance=instance,
        checkpoint_id=checkpoint_id,
        lines=[record(r) for r in rollouts],
        stop=stop,
    )


def read(root, instance="res-0"):
    return read_checkpoint(root, kind="resources", instance=instance, record_type=ResourcesRecord)


def invalid(root, instance="res-0") -> str:
    with pytest.raises(InvalidCheckpointError) as info:
        read(root, instance)
    return info.value.detail


def test_write_then_read_round_trips(tmp_path):
    """The manifest names the records file after its digest; reading gives the records back."""
    result = write(tmp_path)
    directory = tmp_path / "gym" / "resources" / "res-0"
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    assert manifest == {
        "checkpoint_id": "c1",
        "instance": "res-0",
        "kind": "resources",
        "record_count": 2,
        "records_file": f"records-{manifest['records_sha256']}.jsonl",
        "records_sha256": manifest["records_sha256"],
        "schema_version": 1,
    }
    assert sorted(p.name for p in directory.iterdir()) == sorted([MANIFEST_NAME, manifest["records_file"]])
    back = read(tmp_path)
    assert [r.episode_id.rollout_id for r in back.records] == ["a", "b"]
    assert back.bytes == result.bytes == (directory / manifest["records_file"]).stat().st_size


def test_an_empty_checkpoint_is_valid(tmp_path):
    """A participant with nothing to export still writes a verifiable, empty checkpoint."""
    write(tmp_path, rollouts=())
    assert read(tmp_path).records == []


def test_manifest_is_create_only(tmp_path):
    """Same content again returns the manifest; different content fails and drops the loser's records."""
    first = write(tmp_path)
    assert write(tmp_path).manifest == first.manifest
    with pytest.raises(InvalidCheckpointError, match="never replaced"):
        write(tmp_path, rollouts=("a", "b", "c"))
    directory = participant_dir(tmp_path, "resources", "res-0")
    assert sorted(p.name for p in directory.iterdir()) == sorted([MANIFEST_NAME, first.manifest.records_file])
    assert read(tmp_path).manifest == first.manifest


def test_a_stopped_writer_publishes_no_manifest(tmp_path):
    """Once resume stopped the writer, no manifest appears (and its records are removed)."""
    stop = WriteStop()
    stop.stop()
    with pytest.raises(WriteStopped, match="not published"):
        write(tmp_path, stop=stop)
    directory = participant_dir(tmp_path, "resources", "res-0")
    assert list(directory.iterdir()) == []


def test_withdraw_takes_back_only_the_manifest_this_writer_linked(tmp_path):
    """A refused commit's manifest is withdrawn with its records (no restore can take it); a
    second identical write did not link, and a different manifest standing there is not ours."""
    first = write(tmp_path)
    assert first.linked and not write(tmp_path).linked  # the identical manifest was there
    directory = participant_dir(tmp_path, "resources", "res-0")
    assert withdraw(tmp_path, first.manifest) is None
    assert list(directory.iterdir()) == []
    assert "manifest.json is missing" in invalid(tmp_path)
    assert withdraw(tmp_path, first.manifest) is None  # gone already: nothing to do
    other = write(tmp_path, rollouts=("a",))
    assert withdraw(tmp_path, first.manifest) is None
    assert read(tmp_path).manifest == other.manifest


def _records_path(root):
    directory = participant_dir(root, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    return directory / manifest["records_file"]


def test_a_flipped_byte_is_refused(tmp_path):
    """One changed byte in the records no longer matches the digest."""
    write(tmp_path)
    path = _records_path(tmp_path)
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))
    assert "digest" in invalid(tmp_path)


def test_a_dropped_line_is_refused(tmp_path):
    """A records file missing a line fails the digest and the count."""
    write(tmp_path)
    path = _records_path(tmp_path)
    path.write_bytes(path.read_bytes().splitlines(keepends=True)[0])
    assert "digest" in invalid(tmp_path)


def test_a_count_mismatch_is_refused_even_with_a_matching_digest(tmp_path):
    """A manifest whose count disagrees with the records is refused."""
    write(tmp_path)
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["record_count"] = 3
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "records" in invalid(tmp_path)


def test_a_truncated_or_missing_file_is_refused(tmp_path):
    """A truncated manifest, a missing manifest and a missing records file are all refused."""
    write(tmp_path)
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest_bytes = (directory / MANIFEST_NAME).read_bytes()
    (directory / MANIFEST_NAME).write_bytes(manifest_bytes[:20])
    assert "not a valid manifest" in invalid(tmp_path)
    (directory / MANIFEST_NAME).write_bytes(manifest_bytes)
    _records_path(tmp_path).unlink()
    assert "missing" in invalid(tmp_path)
    (directory / MANIFEST_NAME).unlink()
    assert "missing" in invalid(tmp_path)


def test_a_swapped_manifest_is_refused(tmp_path):
    """Another instance's manifest (and records) copied in is refused by kind/instance."""
    write(tmp_path, instance="res-1", rollouts=("x",))
    write(tmp_path, instance="res-0")
    other = participant_dir(tmp_path, "resources", "res-1")
    mine = participant_dir(tmp_path, "resources", "res-0")
    for path in other.iterdir():
        (mine / path.name).write_bytes(path.read_bytes())
    assert "res-1" in invalid(tmp_path)


def test_records_from_another_checkpoint_are_refused(tmp_path):
    """A records file swapped in from another checkpoint does not match this manifest."""
    write(tmp_path / "one", rollouts=("a",))
    write(tmp_path / "two", rollouts=("a", "b"))
    ours, theirs = _records_path(tmp_path / "two"), _records_path(tmp_path / "one")
    ours.write_bytes(theirs.read_bytes())
    assert "digest" in invalid(tmp_path / "two")


def test_a_records_file_not_named_after_its_digest_is_refused(tmp_path):
    """Renaming another digest's records file into place is refused by name."""
    write(tmp_path)
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["records_file"] = "records-" + "0" * 64 + ".jsonl"
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "named after" in invalid(tmp_path)


@pytest.mark.parametrize(
    "records_file", ["../../../etc/passwd", "records-x.jsonl", "/abs/records.jsonl", "r.txt"]
)
def test_an_unsafe_records_file_name_is_refused(tmp_path, records_file):
    """records_file must be a bare records file name: no path traversal."""
    write(tmp_path)
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["records_file"] = records_file
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "records_file" in invalid(tmp_path)


@pytest.mark.parametrize(
    ("kind", "instance", "checkpoint_dir"),
    [
        ("resources", "..", None),
        ("resources", "a/b", None),
        ("../x", "r", None),
        ("resources", "r", "x/../y"),
    ],
)
def test_unsafe_path_parts_are_refused(tmp_path, kind, instance, checkpoint_dir):
    """kind, instance and the checkpoint directory cannot walk out of the layout."""
    root = tmp_path if checkpoint_dir is None else str(tmp_path) + "/" + checkpoint_dir
    with pytest.raises(InvalidCheckpointError):
        participant_dir(root, kind, instance)


def test_a_symlinked_records_file_is_refused(tmp_path):
    """The records file is opened without following a symlink."""
    write(tmp_path)
    path = _records_path(tmp_path)
    target = tmp_path / "elsewhere.jsonl"
    os.replace(path, target)
    path.symlink_to(target)
    assert "cannot read" in invalid(tmp_path)


def test_bad_records_and_duplicate_ids_are_refused(tmp_path):
    """Lines that are not records of this kind, or repeat an episode, are refused."""
    for lines, why in [([b'{"nope": 1}'], "not a valid"), ([record("a"), record("a")], "repeats")]:
        root = tmp_path / why.replace(" ", "_")
        write_checkpoint(root, kind="resources", instance="res-0", checkpoint_id="c1", lines=lines)
        assert why in invalid(root)


def test_a_wrong_schema_version_is_refused(tmp_path):
    """schema_version must be 1."""
    write(tmp_path)
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["schema_version"] = 2
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "schema_version" in invalid(tmp_path)


async def test_a_corrupt_store_is_its_own_error_and_answered_422(tmp_path):
    """Corrupt records raise the store's own InvalidCheckpointError; a restore answers 422."""
    async with running(
        create_app("resources", instance="res-0", token=TOKEN, checkpoint_root=ROOT)
    ) as client:
        reply = await client.post("/work/start", json={"rollout_id": "r1", "steps": 3})
        assert reply.status_code == 200, reply.text
        assert (await control(client, "prepare")).status_code == 200
        committed = await control(client, "commit", checkpoint_dir=str(tmp_path))
        assert committed.status_code == 200, committed.text
        assert (await control(client, "resume")).status_code == 200
    records = participant_dir(tmp_path, "resources", "res-0") / committed.json()["manifest"]["records_file"]
    records.write_bytes(records.read_bytes().replace(b'"counter":0', b'"counter":7'))
    with pytest.raises(InvalidCheckpointError) as info:
        read(tmp_path)
    assert not isinstance(info.value, ProtocolRefusal)
    async with running(create_app("resources", instance="res-0", token=TOKEN, checkpoint_root=ROOT)) as fresh:
        restored = await control(
            fresh, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=[{"rollout_id": "r1"}]
        )
    assert error_code(restored) == (422, "invalid_checkpoint_state")
    assert "SHA-256" in restored.json()["error"]["detail"]


def test_a_bad_record_deep_in_a_large_file_is_named_by_its_number(tmp_path):
    """Records decode a chunk at a time; a problem in a later chunk still names its record."""
    lines = [record(f"r{i:05d}") for i in range(30_000)]
    assert sum(len(line) + 1 for line in lines) > 3 * (1 << 20)  # several read chunks
    root = tmp_path / "good"
    write_checkpoint(root, kind="resources", instance="res-0", checkpoint_id="c1", lines=lines)
    assert [r.episode_id.rollout_id for r in read(root).records] == [f"r{i:05d}" for i in range(30_000)]
    for number, bad, why in [
        (25_000, record("r00001"), "repeats episode r00001"),
        (20_001, b'{"nope": 1}', "is not a valid resources record"),
    ]:
        root = tmp_path / str(number)
        changed = [*lines[: number - 1], bad, *lines[number:]]
        written = write_checkpoint(
            root, kind="resources", instance="res-0", checkpoint_id="c1", lines=changed
        )
        assert invalid(root).startswith(f"line {number} of {written.manifest.records_file} {why}")


def test_more_records_than_the_manifest_says_is_refused_at_the_first_extra(tmp_path):
    """A manifest that counts fewer records than a large file holds is refused (digest intact)."""
    write(tmp_path, rollouts=[f"r{i:05d}" for i in range(20_000)])
    directory = participant_dir(tmp_path, "resources", "res-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["record_count"] = 15_000
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert invalid(tmp_path) == "records file has more than the 15000 records the manifest says"


def test_a_checkpoint_dir_under_a_file_says_which_file(tmp_path):
    """A commit whose checkpoint folder lies under a file fails naming that file (it said
    "cannot create .../gym/resources/resources-0: File exists")."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CheckpointWriteError) as info:
        prepare_directory(tmp_path / "afile" / "ck", kind="resources", instance="resources-0")
    assert f"{tmp_path / 'afile'} is a file, not a folder; no checkpoint was published" in str(info.value)
