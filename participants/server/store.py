"""The on-disk checkpoint of one participant: a records file, then a create-only manifest.

Layout: ``<checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl`` and ``manifest.json``.
A commit that crashes at any point leaves either no manifest or a complete, verifiable one:
records go to a temp file (fsync), are renamed after their digest, and the manifest is
hard-linked into place last, so it is never replaced; the directory is fsynced after each.
Reading verifies everything before the caller installs anything. A checkpoint that cannot be
written or does not verify raises ``InvalidCheckpointError`` (the control plane answers
``invalid_checkpoint_state``, 422); a write stopped by resume raises ``WriteStopped`` (answered
``stale_checkpoint``, 409). These functions block: call them in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Generic, NamedTuple, Protocol, TypeVar

import msgspec

from ckpt_events import SAFE_NAME
from participants.errors import InvalidCheckpointError, WriteStopped
from participants.protocol import EpisodeId, Manifest

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "ReadResult",
    "WriteResult",
    "WriteStop",
    "participant_dir",
    "read_checkpoint",
    "write_checkpoint",
]

SCHEMA_VERSION: Final = 1
MANIFEST_NAME: Final = "manifest.json"
_RECORDS_FILE: Final = re.compile(r"records(-[0-9a-f]{64})?\.jsonl")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_manifest_encoder: Final = msgspec.json.Encoder(order="sorted")


class _Record(Protocol):
    episode_id: EpisodeId


R = TypeVar("R", bound=_Record)


class WriteStop:
    """Set by resume (or lease expiry): once set, no manifest is published by the writer.

    The writer checks it and links the manifest while holding the same lock ``stop()`` takes,
    so after ``stop()`` returns a manifest either exists already or never will.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped


class WriteResult(NamedTuple):
    manifest: Manifest
    bytes: int
    path: Path


class ReadResult(NamedTuple, Generic[R]):
    manifest: Manifest
    records: list[R]
    bytes: int


def participant_dir(checkpoint_dir: str | os.PathLike[str], kind: str, instance: str) -> Path:
    """``<checkpoint_dir>/gym/<kind>/<instance>``; an unsafe part is an ``InvalidCheckpointError``."""
    base = Path(checkpoint_dir)
    if "\x00" in str(base) or ".." in base.parts:
        raise InvalidCheckpointError(f"checkpoint_dir {str(checkpoint_dir)!r} has an unsafe path part")
    for what, part in (("kind", kind), ("instance", instance)):
        if SAFE_NAME.fullmatch(part) is None or part in (".", ".."):
            raise InvalidCheckpointError(f"{what} {part!r} is not a safe path part")
    return base / "gym" / kind / instance


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    kind: str,
    instance: str,
    checkpoint_id: str,
    lines: Iterable[bytes],
    stop: WriteStop | None = None,
) -> WriteResult:
    """Write ``lines`` (one JSON record each, no newline) and then the manifest.

    Committing the same content again returns the existing manifest; different content under
    an existing manifest is ``InvalidCheckpointError`` and this writer's records are deleted.
    A set ``stop`` raises ``WriteStopped`` and publishes nothing.
    """
    if SAFE_NAME.fullmatch(checkpoint_id) is None:
        raise InvalidCheckpointError(f"checkpoint_id {checkpoint_id!r} is not a safe name")
    directory = participant_dir(checkpoint_dir, kind, instance)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidCheckpointError(f"cannot create {directory}: {exc.strerror}") from None
    digest = hashlib.sha256()
    count = size = 0
    temp = directory / f".records.jsonl.{secrets.token_hex(8)}"
    try:
        with open(temp, "xb") as f:
            for line in lines:
                data = line + b"\n"
                digest.update(data)
                f.write(data)
                count += 1
                size += len(data)
            f.flush()
            os.fsync(f.fileno())
        sha = digest.hexdigest()
        records = directory / f"records-{sha}.jsonl"
        # Same content gives the same name: replacing it changes nothing a reader could see.
        os.replace(temp, records)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise InvalidCheckpointError(f"cannot write records in {directory}: {exc.strerror}") from None
    _fsync_dir(directory)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        kind=kind,
        instance=instance,
        checkpoint_id=checkpoint_id,
        records_file=records.name,
        records_sha256=sha,
        record_count=count,
    )
    _publish(directory, manifest, records, stop)
    return WriteResult(manifest, size, directory / MANIFEST_NAME)


def _publish(directory: Path, manifest: Manifest, records: Path, stop: WriteStop | None) -> None:
    content = _manifest_encoder.encode(manifest)
    target = directory / MANIFEST_NAME
    temp = directory / f".manifest.json.{secrets.token_hex(8)}"
    with open(temp, "xb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    lock = stop._lock if stop is not None else contextlib.nullcontext()
    try:
        with lock:
            if stop is not None and stop.stopped:
                _unlink_unless_published(records, target)
                raise WriteStopped(
                    f"checkpoint {manifest.checkpoint_id} was resumed: its manifest is not published"
                )
            try:
                os.link(temp, target)
            except FileExistsError:
                existing = target.read_bytes()
                if existing != content:
                    _unlink_unless_published(records, target)
                    raise InvalidCheckpointError(
                        f"{target} already holds a different manifest: it is never replaced"
                    ) from None
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()
    _fsync_dir(directory)


def _unlink_unless_published(records: Path, manifest_path: Path) -> None:
    """Delete a losing writer's records, unless a published manifest names the same file."""
    with contextlib.suppress(OSError, msgspec.DecodeError):
        if msgspec.json.decode(manifest_path.read_bytes(), type=Manifest).records_file == records.name:
            return
    with contextlib.suppress(OSError):
        records.unlink()


def read_checkpoint(
    checkpoint_dir: str | os.PathLike[str], *, kind: str, instance: str, record_type: type[R]
) -> ReadResult[R]:
    """Read and verify this participant's checkpoint; nothing is returned unless all of it checks."""
    directory = participant_dir(checkpoint_dir, kind, instance)
    manifest_path = directory / MANIFEST_NAME
    try:
        raw = _read_regular(manifest_path)
    except FileNotFoundError:
        raise InvalidCheckpointError(f"{manifest_path} is missing (the commit never finished)") from None
    except OSError as exc:
        raise InvalidCheckpointError(f"cannot read {manifest_path}: {exc.strerror}") from None
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except msgspec.MsgspecError as exc:
        raise InvalidCheckpointError(f"{manifest_path} is not a valid manifest: {exc}") from None
    _check_manifest(manifest, kind, instance)
    records_path = directory / manifest.records_file
    try:
        data = _read_regular(records_path)
    except FileNotFoundError:
        raise InvalidCheckpointError(f"records file {manifest.records_file} is missing") from None
    except OSError as exc:
        raise InvalidCheckpointError(f"cannot read {manifest.records_file}: {exc.strerror}") from None
    if hashlib.sha256(data).hexdigest() != manifest.records_sha256:
        raise InvalidCheckpointError(
            f"records file {manifest.records_file} does not match its SHA-256 digest"
        )
    if data and not data.endswith(b"\n"):
        raise InvalidCheckpointError(f"records file {manifest.records_file} is truncated")
    lines = data.splitlines()
    if len(lines) != manifest.record_count:
        raise InvalidCheckpointError(
            f"records file has {len(lines)} records, the manifest says {manifest.record_count}"
        )
    decoder = msgspec.json.Decoder(record_type)
    records: list[R] = []
    seen: set[EpisodeId] = set()
    for number, line in enumerate(lines, 1):
        try:
            record = decoder.decode(line)
        except msgspec.MsgspecError as exc:
            raise InvalidCheckpointError(f"record {number} is not a valid {kind} record: {exc}") from None
        if record.episode_id in seen:
            raise InvalidCheckpointError(f"record {number} repeats episode {record.episode_id.capture_key}")
        seen.add(record.episode_id)
        records.append(record)
    return ReadResult(manifest, records, len(data))


def _check_manifest(manifest: Manifest, kind: str, instance: str) -> None:
    if manifest.schema_version != SCHEMA_VERSION:
        raise InvalidCheckpointError(
            f"manifest schema_version {manifest.schema_version} is not {SCHEMA_VERSION}"
        )
    if (manifest.kind, manifest.instance) != (kind, instance):
        raise InvalidCheckpointError(
            f"manifest belongs to {manifest.kind}/{manifest.instance}, not {kind}/{instance}"
        )
    if SAFE_NAME.fullmatch(manifest.checkpoint_id) is None:
        raise InvalidCheckpointError(f"manifest checkpoint_id {manifest.checkpoint_id!r} is not a safe name")
    name = _RECORDS_FILE.fullmatch(manifest.records_file)
    if name is None:
        raise InvalidCheckpointError(
            f"manifest records_file {manifest.records_file!r} is not a records file name"
        )
    if _SHA256.fullmatch(manifest.records_sha256) is None:
        raise InvalidCheckpointError("manifest records_sha256 is not a SHA-256 hex digest")
    if name.group(1) is not None and name.group(1)[1:] != manifest.records_sha256:
        raise InvalidCheckpointError(
            f"records file {manifest.records_file} is not named after the manifest's digest"
        )
    if manifest.record_count < 0:
        raise InvalidCheckpointError("manifest record_count is negative")


def _read_regular(path: Path) -> bytes:
    """Read a regular file without following a symlink in its last part."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidCheckpointError(f"{path.name} is not a regular file")
        return f.read()
