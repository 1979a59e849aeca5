"""Reading a participant's checkpoint back: every byte verified before anything is returned.

Only regular files are opened (``store_files.open_regular``: no symlink, FIFO or device), in
a directory walked from the root without following a symlink (``store_files.open_dir``: a
checkpoint outside the root is never read), the manifest and the records under a size bound,
and the records are streamed: hashed, split and decoded as they arrive. Anything that does
not check is ``InvalidCheckpointError``. These functions block: call them in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import operator
import os
import re
from collections.abc import Callable, Iterable
from typing import Final, Generic, NamedTuple

import msgspec

from ckpt_events.participants.errors import InvalidCheckpointError, shown
from ckpt_events.participants.protocol import EpisodeId, Manifest, RecordsPart
from ckpt_events.participants.server.store import (
    MANIFEST_NAME,
    RECORDS_FILE,
    SCHEMA_VERSION,
    R,
    decode_manifest,
    participant_beneath,
    parts_digest,
)
from ckpt_events.participants.server.store_files import (
    MANIFEST_MAX_BYTES,
    RECORDS_MAX_BYTES,
    Beneath,
    open_regular,
    opened_dir,
    read_bounded,
    read_chunks,
)
from ckpt_events.vocab import SAFE_NAME

__all__ = ["ALL", "ReadResult", "Share", "files_of", "read_checkpoint", "read_manifest", "read_part"]

_SHA256: Final = re.compile(r"[0-9a-f]{64}")
#: No writer counts records or numbers workers past a signed 64-bit int; a larger one in a
#: manifest is corrupt, and would not even fit the frames that carry a part to a worker.
_INT_MAX: Final = 2**63 - 1


class ReadResult(NamedTuple, Generic[R]):
    manifest: Manifest
    records: list[R]
    bytes: int


class Share(NamedTuple):
    """Which records of a file a reader keeps: those at positions ``p`` with ``p % modulus ==
    residue`` (``Share(1, 0)``: all). Several workers reading one file each keep their share."""

    modulus: int = 1
    residue: int = 0


ALL: Final = Share()


def read_manifest(checkpoint_dir: str | os.PathLike[str], *, kind: str, instance: str) -> Manifest:
    """This participant's manifest, checked (its records are not read here)."""
    where = participant_beneath(checkpoint_dir, kind, instance)
    manifest_path = where.path / MANIFEST_NAME
    try:
        with opened_dir(where) as dfd:
            try:
                raw = read_bounded(MANIFEST_NAME, MANIFEST_MAX_BYTES, dir_fd=dfd)
            except FileNotFoundError:
                missing = f"{manifest_path} is missing (the commit never finished)"
                raise InvalidCheckpointError(missing) from None
    except FileNotFoundError:
        # No directory at all: nothing was ever committed here, by this participant or perhaps
        # anyone (a wrong checkpoint_dir), which "never finished" would misstate.
        raise InvalidCheckpointError(
            f"{where.path} does not exist: no checkpoint of {kind} {instance} was committed there "
            "(check checkpoint_dir)"
        ) from None
    except OSError as exc:
        raise InvalidCheckpointError(_cannot_read(manifest_path, exc)) from None
    _check_version(raw, manifest_path)
    try:
        manifest = decode_manifest(raw)
    except msgspec.MsgspecError as exc:
        raise InvalidCheckpointError(f"{manifest_path} is not a valid manifest: {exc}") from None
    _check_manifest(manifest, kind, instance)
    return manifest


class _Versioned(msgspec.Struct):
    """Only a manifest's ``schema_version``, every other field ignored."""

    schema_version: int | None = None


def _check_version(raw: bytes, manifest_path: os.PathLike[str]) -> None:
    """Judge the format version before the fields: a manifest of another format would otherwise
    be refused for a field this version does not know, which blames the file, not the version."""
    try:
        version = msgspec.json.decode(raw, type=_Versioned).schema_version
    except msgspec.MsgspecError:
        return  # not even that: the full decode says what is wrong
    if version is not None and version != SCHEMA_VERSION:
        raise InvalidCheckpointError(_version_problem(manifest_path, version))


def _version_problem(manifest_path: os.PathLike[str] | str, version: int) -> str:
    if version > SCHEMA_VERSION:
        return (
            f"{manifest_path} is schema_version {version}, written by a newer ckpt-events than this "
            f"participant's (it reads {SCHEMA_VERSION}): restore it with that version or later"
        )
    return (
        f"{manifest_path} is schema_version {version}, which no ckpt-events writes (this participant "
        f"reads {SCHEMA_VERSION}): it is corrupt or not a ckpt-events manifest"
    )


def files_of(manifest: Manifest) -> list[RecordsPart]:
    """The records files to read, as parts (a single-file manifest is one part, worker 0)."""
    if manifest.parts:
        return list(manifest.parts)
    return [RecordsPart(0, manifest.records_file, manifest.records_sha256, manifest.record_count)]


def read_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    kind: str,
    instance: str,
    record_type: type[R],
    max_records_bytes: int = RECORDS_MAX_BYTES,
    pause: Callable[[int], None] | None = None,
) -> ReadResult[R]:
    """Read and verify this participant's checkpoint; nothing is returned unless all of it checks.

    Only regular files are read, never more than their bound (the records file is streamed).
    A multi-part checkpoint is read part after part; an episode in two parts does not check.
    """
    manifest = read_manifest(checkpoint_dir, kind=kind, instance=instance)
    directory = participant_beneath(checkpoint_dir, kind, instance)
    records: list[R] = []
    seen: set[EpisodeId] = set()
    size = 0
    for part in files_of(manifest):
        got, part_size = read_part(
            directory,
            part,
            kind=kind,
            record_type=record_type,
            max_records_bytes=max_records_bytes,
            seen=seen,
            pause=pause,
        )
        records += got
        size += part_size
    return ReadResult(manifest, records, size)


def read_part(
    directory: str | os.PathLike[str],
    part: RecordsPart,
    *,
    kind: str,
    record_type: type[R],
    max_records_bytes: int = RECORDS_MAX_BYTES,
    share: Share = ALL,
    seen: set[EpisodeId] | None = None,
    pause: Callable[[int], None] | None = None,
) -> tuple[list[R], int]:
    """The records of ``share`` of one records file in the participant's ``directory`` (a
    ``Beneath``, walked from its root; a plain path is its own root): the whole file is hashed
    and counted, only the share is decoded. ``seen`` (episodes read before, from other parts)
    grows by what this part holds; a repeat does not check. ``pause(records)``, if given, is
    called after each chunk's records (``FaultPlan.read_pause``: a slow read)."""
    try:
        with opened_dir(Beneath.of(directory)) as dfd:
            fd = open_regular(part.records_file, max_records_bytes, dir_fd=dfd)
    except FileNotFoundError:
        raise InvalidCheckpointError(f"records file {part.records_file} is missing") from None
    except OSError as exc:
        raise InvalidCheckpointError(_cannot_read(part.records_file, exc)) from None
    chunks = read_chunks(fd, part.records_file, max_records_bytes)
    with contextlib.closing(chunks):
        try:
            return _decode_records(
                chunks, part, kind, record_type, pause, share, set() if seen is None else seen
            )
        except OSError as exc:
            raise InvalidCheckpointError(f"cannot read {part.records_file}: {exc.strerror}") from None


def _cannot_read(path: str | os.PathLike[str], exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        # O_NOFOLLOW's refusal reads "Too many levels of symbolic links": a loop, which it is not.
        return (
            f"cannot read {path}: it is a symlink, and the store never follows one "
            "(put the file itself in the checkpoint)"
        )
    return f"cannot read {path}: {exc.strerror}"


def _decode_records(
    chunks: Iterable[bytes],
    part: RecordsPart,
    kind: str,
    record_type: type[R],
    pause: Callable[[int], None] | None,
    share: Share,
    seen: set[EpisodeId],
) -> tuple[list[R], int]:
    """Hash, split and decode the records as they stream in; the digest is judged first, then
    the first bad record (decoding stops there, hashing goes on), then the count."""
    digest = hashlib.sha256()
    decoder = msgspec.json.Decoder(record_type)
    records: list[R] = []
    problem: str | None = None
    size = 0
    lines_seen = 0
    tail = b""
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        if problem is not None:
            continue
        *lines, tail = (tail + chunk).split(b"\n")
        first = lines_seen
        lines_seen += len(lines)
        if lines_seen > part.record_count:
            problem = f"records file has more than the {part.record_count} records the manifest says"
        else:
            start = (share.residue - first) % share.modulus
            if share.modulus > 1:
                lines = lines[start :: share.modulus]
            # each kept line's 1-based number in the file, to name a bad one where it is
            numbers = range(first + start + 1, lines_seen + 1, share.modulus)
            problem = _add_records(decoder, lines, numbers, records, seen, kind, part.records_file)
        if pause is not None:
            pause(len(lines))  # a slow-restore fault only
        if problem is not None:
            tail = b""
    if digest.hexdigest() != part.records_sha256:
        raise InvalidCheckpointError(f"records file {part.records_file} does not match its SHA-256 digest")
    if problem is not None:
        raise InvalidCheckpointError(problem)
    if tail:
        raise InvalidCheckpointError(f"records file {part.records_file} is truncated")
    if lines_seen != part.record_count:
        raise InvalidCheckpointError(
            f"records file has {lines_seen} records, the manifest says {part.record_count}"
        )
    return records, size


def _add_records(
    decoder: msgspec.json.Decoder[R],
    lines: list[bytes],
    numbers: range,
    records: list[R],
    seen: set[EpisodeId],
    kind: str,
    records_file: str,
) -> str | None:
    """Decode a chunk's whole lines (``numbers``: their line numbers in ``records_file``) into
    ``records``; returns what is wrong with the first bad one, named by its line and file.

    The lines decode one by one in C (``map``), with no Python frame per record; only when
    something is wrong (a line that does not decode, a repeated episode) are they gone
    through again one at a time, to name the first bad record exactly.
    """
    try:
        batch = list(map(decoder.decode, lines))
    except msgspec.MsgspecError:
        pass
    else:
        ids = set(map(_episode_id, batch))
        if len(ids) == len(batch) and seen.isdisjoint(ids):
            seen |= ids
            records += batch
            return None
    for number, line in zip(numbers, lines, strict=True):
        problem = _add_record(decoder, line, f"line {number} of {records_file}", records, seen, kind)
        if problem is not None:
            return problem
    return None


_episode_id: Final = operator.attrgetter("episode_id")


def _add_record(
    decoder: msgspec.json.Decoder[R],
    line: bytes,
    where: str,
    records: list[R],
    seen: set[EpisodeId],
    kind: str,
) -> str | None:
    """Decode one line (``where``: its line and file) into ``records``; returns what is wrong
    with it, if anything."""
    try:
        record = decoder.decode(line)
    except msgspec.MsgspecError as exc:
        return f"{where} is not a valid {kind} record: {exc}"
    if record.episode_id in seen:
        return f"{where} repeats episode {record.episode_id.capture_key}"
    seen.add(record.episode_id)
    records.append(record)
    return None


def _check_manifest(manifest: Manifest, kind: str, instance: str) -> None:
    if manifest.schema_version != SCHEMA_VERSION:
        raise InvalidCheckpointError(_version_problem(MANIFEST_NAME, manifest.schema_version))
    if (manifest.kind, manifest.instance) != (kind, instance):
        raise InvalidCheckpointError(
            f"manifest belongs to {manifest.kind}/{manifest.instance}, not {kind}/{instance}"
        )
    if SAFE_NAME.fullmatch(manifest.checkpoint_id) is None:
        raise InvalidCheckpointError(
            f"manifest checkpoint_id {shown(manifest.checkpoint_id)} is not a safe name"
        )
    if manifest.parts:
        if manifest.records_file:
            raise InvalidCheckpointError("a manifest with parts names no records_file of its own")
        if manifest.records_sha256 != parts_digest(manifest.parts):
            raise InvalidCheckpointError("manifest records_sha256 is not the digest of its parts' digests")
        if manifest.record_count != sum(p.record_count for p in manifest.parts):
            raise InvalidCheckpointError("manifest record_count is not the sum of its parts' counts")
    if manifest.record_count > _INT_MAX:
        raise InvalidCheckpointError(_out_of_range("record_count", manifest.record_count))
    for part in files_of(manifest):
        _check_part(part)


def _check_part(part: RecordsPart) -> None:
    name = RECORDS_FILE.fullmatch(part.records_file)
    if name is None:
        raise InvalidCheckpointError(
            f"manifest records_file {shown(part.records_file)} is not a records file name"
        )
    if _SHA256.fullmatch(part.records_sha256) is None:
        raise InvalidCheckpointError("manifest records_sha256 is not a SHA-256 hex digest")
    if name.group(1) is not None and name.group(1)[1:] != part.records_sha256:
        raise InvalidCheckpointError(
            f"records file {part.records_file} is not named after the manifest's digest"
        )
    if part.record_count < 0:
        raise InvalidCheckpointError("manifest record_count is negative")
    if part.worker < 0:
        raise InvalidCheckpointError("manifest part worker is negative")
    for what, value in (("record_count", part.record_count), ("part worker", part.worker)):
        if value > _INT_MAX:
            raise InvalidCheckpointError(_out_of_range(what, value))


def _out_of_range(what: str, value: int) -> str:
    return f"manifest {what} {shown(value)} is past any a writer makes (2**63 - 1): the manifest is corrupt"
