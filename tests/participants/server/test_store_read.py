"""Reading a checkpoint back: the manifest's checks, parts, shares, and every record verified."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId, RecordsPart
from ckpt_events.participants.server.store import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    prepare_directory,
    publish_parts,
    write_checkpoint,
    write_part,
)
from ckpt_events.participants.server.store_read import (
    ALL,
    ReadResult,
    Share,
    files_of,
    read_checkpoint,
    read_manifest,
    read_part,
)
from ckpt_events.participants.workloads import ResourcesRecord
from tests.participants.helpers import resources_record

KIND, INSTANCE = "resources", "res-0"


def _line(rollout_id: str, attempt: int = 0) -> bytes:
    return msgspec.json.encode(resources_record(rollout_id, attempt))


def _dir(root: Path) -> Path:
    return root / "gym" / KIND / INSTANCE


def _plant(root: Path, content: bytes, count: int, **manifest: Any) -> Path:
    """A records file ``records.jsonl`` holding ``content`` and a manifest of its digest (or of
    what ``manifest`` overrides): a checkpoint no writer would make, to reach each check."""
    directory = _dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "records.jsonl").write_bytes(content)
    fields: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "instance": INSTANCE,
        "checkpoint_id": "c1",
        "records_file": "records.jsonl",
        "records_sha256": hashlib.sha256(content).hexdigest(),
        "record_count": count,
        **manifest,
    }
    (directory / MANIFEST_NAME).write_bytes(msgspec.json.encode(fields))
    return directory


def _read(root: Path, **options: Any) -> ReadResult[ResourcesRecord]:
    return read_checkpoint(root, kind=KIND, instance=INSTANCE, record_type=ResourcesRecord, **options)


def _refusal(root: Path, **options: Any) -> str:
    with pytest.raises(InvalidCheckpointError) as info:
        _read(root, **options)
    return info.value.detail


def _keys(records: list[ResourcesRecord]) -> list[str]:
    return [r.episode_id.capture_key for r in records]


def _multi_part(root: Path, groups: list[list[bytes]]) -> Path:
    """A published multi-worker checkpoint: one part per group of lines, worker i the i-th."""
    where = prepare_directory(root, kind=KIND, instance=INSTANCE)
    parts = []
    for worker, lines in enumerate(groups):
        written = write_part(where, lines)
        parts.append(RecordsPart(worker, written.records_file, written.records_sha256, written.record_count))
    publish_parts(where, kind=KIND, instance=INSTANCE, checkpoint_id="c1", parts=parts)
    return where.path


def test_read_manifest_returns_the_written_manifest(tmp_path: Path) -> None:
    """The manifest a writer published comes back equal, and files_of names its one file as worker 0."""
    written = write_checkpoint(
        tmp_path, kind=KIND, instance=INSTANCE, checkpoint_id="c1", lines=[_line("a"), _line("b")]
    )
    manifest = read_manifest(tmp_path, kind=KIND, instance=INSTANCE)
    assert manifest == written.manifest
    assert files_of(manifest) == [
        RecordsPart(0, manifest.records_file, manifest.records_sha256, 2),
    ]


def test_read_checkpoint_returns_records_manifest_and_size(tmp_path: Path) -> None:
    """All records in file order, the manifest, and the bytes read (the file's size)."""
    directory = _plant(tmp_path, _line("a") + b"\n" + _line("b", 2) + b"\n", 2)
    result = _read(tmp_path)
    assert _keys(result.records) == ["a", "b-a2"]
    assert result.manifest.checkpoint_id == "c1"
    assert result.bytes == (directory / "records.jsonl").stat().st_size


def test_a_missing_or_unreadable_manifest_is_refused(tmp_path: Path) -> None:
    """No directory: nothing committed there; a directory without its manifest: 'the commit never
    finished'; a manifest that does not decode: not a valid manifest."""
    path = _dir(tmp_path) / MANIFEST_NAME
    assert _refusal(tmp_path / "typo") == (
        f"{_dir(tmp_path / 'typo')} does not exist: no checkpoint of {KIND} {INSTANCE} was committed "
        "there (check checkpoint_dir)"
    )
    _dir(tmp_path).mkdir(parents=True)
    assert _refusal(tmp_path) == f"{path} is missing (the commit never finished)"
    path.write_bytes(b'{"schema_version": 1}')
    assert _refusal(tmp_path).startswith(f"{path} is not a valid manifest: ")
    path.write_bytes(b"x" * (64 * 1024 + 1))
    assert _refusal(tmp_path) == f"{MANIFEST_NAME} is {64 * 1024 + 1} bytes, over the 65536-byte bound"


@pytest.mark.parametrize(
    ("override", "detail"),
    [
        ({"kind": "agent"}, "manifest belongs to agent/res-0, not resources/res-0"),
        ({"instance": "res-1"}, "manifest belongs to resources/res-1, not resources/res-0"),
        ({"checkpoint_id": "../c1"}, "manifest checkpoint_id '../c1' is not a safe name"),
        (
            {"records_file": "../records.jsonl"},
            "manifest records_file '../records.jsonl' is not a records file name",
        ),
        ({"records_sha256": "ABC"}, "manifest records_sha256 is not a SHA-256 hex digest"),
        (
            {"records_file": f"records-{'0' * 64}.jsonl"},
            f"records file records-{'0' * 64}.jsonl is not named after the manifest's digest",
        ),
        ({"record_count": -1}, "manifest record_count is negative"),
        (
            {"record_count": 2**63},
            f"manifest record_count {2**63} is past any a writer makes (2**63 - 1): the manifest is corrupt",
        ),
    ],
)
def test_each_manifest_check_names_what_is_wrong(
    tmp_path: Path, override: dict[str, Any], detail: str
) -> None:
    """A manifest failing one check is refused with that check's message, records unread."""
    _plant(tmp_path, _line("a") + b"\n", 1, **override)
    with pytest.raises(InvalidCheckpointError) as info:
        read_manifest(tmp_path, kind=KIND, instance=INSTANCE)
    assert info.value.detail == detail


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ({"schema_version": 2}, "written by a newer ckpt-events than this participant's (it reads 1): "),
        # a newer format's own field is not what is wrong: the version is
        ({"schema_version": 2, "compression": "zstd"}, "written by a newer ckpt-events"),
        ({"schema_version": 0}, "which no ckpt-events writes (this participant reads 1): "),
    ],
)
def test_a_manifest_of_another_format_version_is_named_as_such(
    tmp_path: Path, override: dict[str, Any], said: str
) -> None:
    """A manifest of another schema_version is refused for its version (newer: with which
    ckpt-events restores it), even when it also carries a field this version does not know."""
    _plant(tmp_path, _line("a") + b"\n", 1, **override)
    path = _dir(tmp_path) / MANIFEST_NAME
    version = override["schema_version"]
    detail = _refusal(tmp_path)
    assert detail.startswith(f"{path} is schema_version {version}, "), detail
    assert said in detail
    if version > SCHEMA_VERSION:
        assert detail.endswith("restore it with that version or later")


def test_a_symlinked_manifest_or_records_file_is_named_a_symlink(tmp_path: Path) -> None:
    """A file replaced by a symlink (here to a copy outside the root) is refused as a symlink,
    not with O_NOFOLLOW's "Too many levels of symbolic links", which reads as a loop."""
    directory = _plant(tmp_path / "root", _line("a") + b"\n", 1)
    rule = "it is a symlink, and the store never follows one (put the file itself in the checkpoint)"
    for name, shown_as in (
        ("records.jsonl", "records.jsonl"),
        (MANIFEST_NAME, str(directory / MANIFEST_NAME)),
    ):
        outside = tmp_path / f"outside-{name}"
        (directory / name).rename(outside)
        (directory / name).symlink_to(outside)
        assert _refusal(tmp_path / "root") == f"cannot read {shown_as}: {rule}"
        (directory / name).unlink()
        outside.rename(directory / name)
    assert _keys(_read(tmp_path / "root").records) == ["a"]


def test_a_records_file_is_verified_before_anything_is_returned(tmp_path: Path) -> None:
    """Digest first, then the first bad record, then a missing final newline, then the count."""
    good = _line("a") + b"\n" + _line("b") + b"\n"
    _plant(tmp_path, good, 2, records_sha256="0" * 64)
    assert _refusal(tmp_path) == "records file records.jsonl does not match its SHA-256 digest"
    _plant(tmp_path, _line("a") + b"\n{not json}\n", 2)
    assert _refusal(tmp_path).startswith("line 2 of records.jsonl is not a valid resources record: ")
    _plant(tmp_path, good[:-1], 2)
    assert _refusal(tmp_path) == "records file records.jsonl is truncated"
    _plant(tmp_path, good, 3)
    assert _refusal(tmp_path) == "records file has 2 records, the manifest says 3"
    _plant(tmp_path, good, 1)
    assert _refusal(tmp_path) == "records file has more than the 1 records the manifest says"


def test_a_repeated_episode_is_refused_by_its_number(tmp_path: Path) -> None:
    """The same episode twice in one file: the second occurrence is named, by number and key."""
    _plant(tmp_path, b"".join(_line(r) + b"\n" for r in ("a", "b", "a")), 3)
    assert _refusal(tmp_path) == "line 3 of records.jsonl repeats episode a"


def test_a_missing_records_file_and_the_size_bound(tmp_path: Path) -> None:
    """A manifest naming an absent file is refused; so is a file over max_records_bytes."""
    directory = _plant(tmp_path, _line("a") + b"\n", 1)
    size = (directory / "records.jsonl").stat().st_size
    assert _refusal(tmp_path, max_records_bytes=size - 1) == (
        f"records.jsonl is {size} bytes, over the {size - 1}-byte bound"
    )
    assert _read(tmp_path, max_records_bytes=size).records[0].episode_id == EpisodeId("a")
    (directory / "records.jsonl").unlink()
    assert _refusal(tmp_path) == "records file records.jsonl is missing"


def test_pause_is_called_with_each_chunks_record_count(tmp_path: Path) -> None:
    """The slow-read hook sees the records of each chunk (one small chunk here: all three)."""
    _plant(tmp_path, b"".join(_line(r) + b"\n" for r in ("a", "b", "c")), 3)
    seen: list[int] = []
    assert len(_read(tmp_path, pause=seen.append).records) == 3
    assert seen == [3]


def test_a_multi_part_checkpoint_is_read_part_after_part(tmp_path: Path) -> None:
    """files_of lists the parts in worker order; read_checkpoint concatenates their records."""
    _multi_part(tmp_path, [[_line("a"), _line("b")], [_line("c")]])
    manifest = read_manifest(tmp_path, kind=KIND, instance=INSTANCE)
    assert [(p.worker, p.record_count) for p in files_of(manifest)] == [(0, 2), (1, 1)]
    result = _read(tmp_path)
    assert _keys(result.records) == ["a", "b", "c"]
    assert result.manifest.record_count == 3


def test_an_episode_in_two_parts_does_not_check(tmp_path: Path) -> None:
    """A part repeating an episode of an earlier part is refused, named by its line in that part's file."""
    _multi_part(tmp_path, [[_line("a"), _line("b")], [_line("c"), _line("b")]])
    second = files_of(read_manifest(tmp_path, kind=KIND, instance=INSTANCE))[1].records_file
    assert _refusal(tmp_path) == f"line 2 of {second} repeats episode b"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"records_file": "records.jsonl"}, "a manifest with parts names no records_file of its own"),
        ({"records_sha256": "0" * 64}, "manifest records_sha256 is not the digest of its parts' digests"),
        ({"record_count": 5}, "manifest record_count is not the sum of its parts' counts"),
    ],
)
def test_a_multi_part_manifest_must_agree_with_its_parts(
    tmp_path: Path, change: dict[str, Any], detail: str
) -> None:
    """A parts manifest with its own file, a wrong digest of digests or a wrong sum is refused."""
    directory = _multi_part(tmp_path, [[_line("a")], [_line("b")]])
    path = directory / MANIFEST_NAME
    manifest = msgspec.json.decode(path.read_bytes())
    path.unlink()  # published create-only: replaced here to plant the bad one
    path.write_bytes(msgspec.json.encode({**manifest, **change}))
    assert _refusal(tmp_path) == detail


def test_a_negative_part_worker_is_refused(tmp_path: Path) -> None:
    """A part whose worker index is negative is refused when the manifest is checked."""
    directory = _multi_part(tmp_path, [[_line("a")]])
    path = directory / MANIFEST_NAME
    manifest = msgspec.json.decode(path.read_bytes())
    manifest["parts"][0]["worker"] = -1
    path.unlink()
    path.write_bytes(msgspec.json.encode(manifest))
    assert _refusal(tmp_path) == "manifest part worker is negative"


def test_shares_split_one_file_among_readers(tmp_path: Path) -> None:
    """Share(3, r) keeps positions p with p % 3 == r; the shares partition the file; ALL keeps all."""
    rollouts = [f"r{i}" for i in range(7)]
    directory = _plant(tmp_path, b"".join(_line(r) + b"\n" for r in rollouts), 7)
    manifest = read_manifest(tmp_path, kind=KIND, instance=INSTANCE)
    (part,) = files_of(manifest)
    got = {}
    for residue in range(3):
        records, size = read_part(
            directory, part, kind=KIND, record_type=ResourcesRecord, share=Share(3, residue)
        )
        got[residue] = _keys(records)
        assert size == (directory / "records.jsonl").stat().st_size  # the whole file is hashed
    assert got == {0: ["r0", "r3", "r6"], 1: ["r1", "r4"], 2: ["r2", "r5"]}
    assert ALL == Share(1, 0)
    assert _keys(read_part(directory, part, kind=KIND, record_type=ResourcesRecord)[0]) == rollouts


def test_read_part_grows_seen_and_refuses_a_repeat(tmp_path: Path) -> None:
    """seen gains the part's episodes; an episode already in seen is a repeat."""
    directory = _plant(tmp_path, _line("a") + b"\n" + _line("b") + b"\n", 2)
    (part,) = files_of(read_manifest(tmp_path, kind=KIND, instance=INSTANCE))
    seen: set[EpisodeId] = set()
    read_part(directory, part, kind=KIND, record_type=ResourcesRecord, seen=seen)
    assert seen == {EpisodeId("a"), EpisodeId("b")}
    with pytest.raises(InvalidCheckpointError) as info:
        read_part(directory, part, kind=KIND, record_type=ResourcesRecord, seen={EpisodeId("b")})
    assert info.value.detail == "line 2 of records.jsonl repeats episode b"


def test_a_bad_line_in_a_share_is_named_by_its_line_in_the_file(tmp_path: Path) -> None:
    """Share(2, 1) keeps lines 2 and 4; a bad 4th line is 'line 4', not the share's 2nd record."""
    good = b"".join(_line(r) + b"\n" for r in ("a", "b", "c"))
    directory = _plant(tmp_path, good + b"{not json}\n", 4)
    (part,) = files_of(read_manifest(tmp_path, kind=KIND, instance=INSTANCE))
    with pytest.raises(InvalidCheckpointError) as info:
        read_part(directory, part, kind=KIND, record_type=ResourcesRecord, share=Share(2, 1))
    assert info.value.detail.startswith("line 4 of records.jsonl is not a valid resources record: ")
    directory = _plant(tmp_path, good + _line("d") + b"\n", 4)
    (part,) = files_of(read_manifest(tmp_path, kind=KIND, instance=INSTANCE))
    with pytest.raises(InvalidCheckpointError) as info:
        read_part(
            directory, part, kind=KIND, record_type=ResourcesRecord, share=Share(2, 1), seen={EpisodeId("d")}
        )
    assert info.value.detail == "line 4 of records.jsonl repeats episode d"
