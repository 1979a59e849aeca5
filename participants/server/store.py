"""The on-disk checkpoint of one participant: records file(s), then a create-only manifest.

Layout: ``<checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl`` and ``manifest.json``.
A participant with several workers writes one records file per worker, each by its worker in
parallel (``write_part``), and the main process publishes one manifest listing them
(``prepare_directory`` first, ``publish_parts`` last).
A commit that crashes at any point leaves either no manifest or a complete, verifiable one:
records go to a temp file (fsync), are renamed after their digest, and the manifest is
hard-linked into place last, so it is never replaced; the directory is fsynced after each.
Nothing outside the root: the directory is walked from the root without following a symlink
(``store_files.open_dir``) and every file in it is created, renamed, linked, read and deleted
relative to that directory's descriptor, so a symlink planted below the root is refused
(``InvalidCheckpointError``) before anything is written, swept or read through it.
Reading verifies everything before the caller installs anything. A checkpoint that cannot be
written or does not verify raises ``InvalidCheckpointError`` (the control plane answers
``invalid_checkpoint_state``, 422); a write stopped by resume raises ``WriteStopped`` (answered
``stale_checkpoint``, 409); a manifest linked by a commit then refused is taken back
(``withdraw``). These functions block: call them in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple, Protocol, TypeVar

import msgspec

from ckpt_events.participants.errors import (
    CheckpointStoreError,
    CheckpointWriteError,
    InvalidCheckpointError,
    WriteStopped,
    shown,
)
from ckpt_events.participants.faults import StepHook, no_step
from ckpt_events.participants.protocol import EpisodeId, Manifest, RecordsPart
from ckpt_events.participants.server.store_files import (
    MANIFEST_MAX_BYTES,
    Beneath,
    open_dir,
    opened_dir,
    read_bounded,
)
from ckpt_events.vocab import SAFE_NAME

__all__ = [
    "COMMIT_STEPS",
    "R",
    "MANIFEST_NAME",
    "RECORDS_FILE",
    "SCHEMA_VERSION",
    "WriteResult",
    "WriteStop",
    "PartWritten",
    "decode_manifest",
    "discard_parts",
    "named_files",
    "parts_digest",
    "participant_beneath",
    "participant_dir",
    "prepare_directory",
    "publish_parts",
    "sweep_parts",
    "withdraw",
    "write_checkpoint",
    "write_part",
]

SCHEMA_VERSION: Final = 1
MANIFEST_NAME: Final = "manifest.json"
RECORDS_FILE: Final = re.compile(r"records(-[0-9a-f]{64})?\.jsonl")
_manifest_encoder: Final = msgspec.json.Encoder(order="sorted")
_TEMP_PREFIXES: Final = (".records.jsonl.", ".manifest.json.")
#: Create-only, never through a symlink (``O_EXCL`` refuses one already), closed on exec.
_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Every step of a commit that touches the disk, in order (each may fail; ``on_step`` is called
#: with each name before it is taken).
COMMIT_STEPS: Final = (
    "make_dirs",
    "open_records",
    "write_records",
    "fsync_records",
    "rename_records",
    "fsync_dir_records",
    "open_manifest",
    "write_manifest",
    "fsync_manifest",
    "link_manifest",
    "fsync_dir_manifest",
)


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
        #: What happened to the checkpoint, as ``checkpoint <id> <cause>`` says it.
        self.cause = "was resumed"
        self._advice: Callable[[], str] | None = None

    def stop(
        self, cause: str = "was resumed", advice: Callable[[], str] | None = None, *, blocking: bool = True
    ) -> bool:
        """Stop the writer; ``cause`` and ``advice`` (called when a refusal is worded, so what
        it measures is as of then) say why, the first stop's win. Whether it took effect:
        with ``blocking`` false, ``False`` at once (nothing changed) while the writer holds the
        lock, linking the manifest; call it again off the event loop."""
        if not self._lock.acquire(blocking=blocking):
            return False
        try:
            if not self._stopped:
                self.cause = cause
                self._advice = advice
            self._stopped = True
        finally:
            self._lock.release()
        return True

    @property
    def stopped(self) -> bool:
        return self._stopped

    def advice(self) -> str:
        """``; `` and what the stop's advice says now, or nothing (a resume needs none)."""
        return "" if self._advice is None else f"; {self._advice()}"


class WriteResult(NamedTuple):
    manifest: Manifest
    bytes: int
    path: Path
    #: Whether this writer linked the manifest (``False``: an identical one was there already),
    #: so that a commit refused after all takes back only its own (``withdraw``).
    linked: bool = False


def participant_dir(checkpoint_dir: str | os.PathLike[str], kind: str, instance: str) -> Path:
    """``<checkpoint_dir>/gym/<kind>/<instance>``; an unsafe part is an ``InvalidCheckpointError``."""
    base = Path(checkpoint_dir)
    if "\x00" in str(base) or ".." in base.parts:
        raise InvalidCheckpointError(f"checkpoint_dir {shown(str(checkpoint_dir))} has an unsafe path part")
    for what, part in (("kind", kind), ("instance", instance)):
        if SAFE_NAME.fullmatch(part) is None or part in (".", ".."):
            raise InvalidCheckpointError(f"{what} {shown(part)} is not a safe path part")
    return base / "gym" / kind / instance


def participant_beneath(checkpoint_dir: str | os.PathLike[str], kind: str, instance: str) -> Beneath:
    """``participant_dir`` as a ``Beneath``: below ``checkpoint_dir``'s root (``checkpoint_dir``
    itself, unless it is a ``Beneath`` already), walked without following a symlink."""
    participant_dir(checkpoint_dir, kind, instance)  # the same checks of every part
    return Beneath.of(checkpoint_dir).child("gym", kind, instance)


def write_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    kind: str,
    instance: str,
    checkpoint_id: str,
    lines: Iterable[bytes],
    stop: WriteStop | None = None,
    on_step: StepHook = no_step,
) -> WriteResult:
    """Write ``lines`` (one JSON record each, no newline) and then the manifest (``on_step``
    is called before each of ``COMMIT_STEPS``).

    Committing the same content again returns the existing manifest; different content under
    an existing manifest is ``InvalidCheckpointError`` and this writer's records are deleted.
    A set ``stop`` raises ``WriteStopped`` and publishes nothing. An I/O error raises
    ``CheckpointWriteError`` whose ``published`` says whether the manifest exists; this
    writer's temp files are gone either way, and a crashed writer's are swept here.
    """
    _check_checkpoint_id(checkpoint_id)
    where = participant_beneath(checkpoint_dir, kind, instance)
    dfd = _prepare(where, on_step)
    try:
        records, sha, count, size = _write_records(dfd, where, lines, on_step)
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            kind=kind,
            instance=instance,
            checkpoint_id=checkpoint_id,
            records_file=records,
            records_sha256=sha,
            record_count=count,
        )
        linked = _publish(dfd, where, manifest, [records], stop, on_step)
    finally:
        os.close(dfd)
    return WriteResult(manifest, size, where.path / MANIFEST_NAME, linked)


def _check_checkpoint_id(checkpoint_id: str) -> None:
    if SAFE_NAME.fullmatch(checkpoint_id) is None:
        raise InvalidCheckpointError(f"checkpoint_id {shown(checkpoint_id)} is not a safe name")


def prepare_directory(
    checkpoint_dir: str | os.PathLike[str], *, kind: str, instance: str, on_step: StepHook = no_step
) -> Beneath:
    """The participant's directory, created (durably) and swept of what a crashed commit left."""
    where = participant_beneath(checkpoint_dir, kind, instance)
    os.close(_prepare(where, on_step))
    return where


def _prepare(where: Beneath, on_step: StepHook) -> int:
    """``where``'s descriptor, the directory created (durably) and swept; the caller closes it."""
    try:
        on_step("make_dirs")
        dfd = open_dir(where, create=True)
    except OSError as exc:
        raise CheckpointWriteError(
            f"cannot create {where}: {exc.strerror}; no checkpoint was published", published=False
        ) from None
    _sweep(dfd)
    return dfd


class PartWritten(NamedTuple):
    """What one worker's ``write_part`` wrote: its records file (renamed after its digest)."""

    records_file: str
    records_sha256: str
    record_count: int
    bytes: int


def write_part(
    directory: str | os.PathLike[str],
    lines: Iterable[bytes],
    *,
    place_by: float | None = None,
    on_step: StepHook = no_step,
) -> PartWritten:
    """One worker's records file in ``directory`` (made by ``prepare_directory``); no manifest.

    Never sweeps: the other workers are writing theirs beside it. ``CheckpointWriteError``
    (nothing of this part left behind) if the disk fails, or if the file would be placed after
    ``place_by`` (a ``time.time()``: the main process no longer waits for it, so nobody would
    name or delete it); ``InvalidCheckpointError`` if the walk to ``directory`` meets a symlink.
    """
    where = Beneath.of(directory)
    _check_in_time(where, place_by)
    with _opened_for_write(where) as dfd:
        records, sha, count, size = _write_records(dfd, where, lines, on_step, place_by)
    return PartWritten(records, sha, count, size)


def _check_in_time(where: Beneath, place_by: float | None) -> None:
    if place_by is not None and time.time() > place_by:
        raise CheckpointWriteError(
            f"the commit stopped waiting for this part of {where} {time.time() - place_by:.1f} s ago: "
            "not placed, no checkpoint names it",
            published=False,
        )


@contextlib.contextmanager
def _opened_for_write(where: Beneath) -> Iterator[int]:
    """``opened_dir(where)``, an ``OSError`` on the way there a ``CheckpointWriteError``."""
    try:
        dfd = open_dir(where)
    except OSError as exc:
        raise CheckpointWriteError(
            f"cannot open {where}: {exc.strerror}; no checkpoint was published", published=False
        ) from None
    try:
        yield dfd
    finally:
        os.close(dfd)


def parts_digest(parts: Iterable[RecordsPart]) -> str:
    """The manifest's ``records_sha256`` of a multi-part checkpoint: its parts' digests, hashed."""
    return hashlib.sha256("\n".join(p.records_sha256 for p in parts).encode()).hexdigest()


def publish_parts(
    directory: str | os.PathLike[str],
    *,
    kind: str,
    instance: str,
    checkpoint_id: str,
    parts: list[RecordsPart],
    stop: WriteStop | None = None,
    on_step: StepHook = no_step,
) -> WriteResult:
    """Publish the manifest of a multi-worker checkpoint whose ``parts`` are written already.

    As ``write_checkpoint``'s last step: create-only, never after ``stop``, and what it cannot
    publish it deletes (the parts too, unless a published manifest names them).
    """
    where = Beneath.of(directory)
    files = [p.records_file for p in parts]
    try:
        _check_checkpoint_id(checkpoint_id)
        for part in parts:
            if RECORDS_FILE.fullmatch(part.records_file) is None:
                raise InvalidCheckpointError(f"{shown(part.records_file)} is not a records file name")
    except InvalidCheckpointError:
        discard_parts(where, [f for f in files if RECORDS_FILE.fullmatch(f) is not None])
        raise
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        kind=kind,
        instance=instance,
        checkpoint_id=checkpoint_id,
        records_file="",
        records_sha256=parts_digest(parts),
        record_count=sum(p.record_count for p in parts),
        parts=parts,
    )
    with _opened_for_write(where) as dfd:
        size = 0
        with contextlib.suppress(OSError):
            size = sum(os.stat(f, dir_fd=dfd, follow_symlinks=False).st_size for f in set(files))
        linked = _publish(dfd, where, manifest, files, stop, on_step)
    return WriteResult(manifest, size, where.path / MANIFEST_NAME, linked)


def discard_parts(directory: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Delete the parts a failed multi-worker commit wrote, except those a manifest names (a
    directory that cannot be reached, or only through a symlink, holds none of ours)."""
    with contextlib.suppress(OSError, InvalidCheckpointError), opened_dir(Beneath.of(directory)) as dfd:
        _unlink_unless_published(dfd, list(names))


def sweep_parts(directory: str | os.PathLike[str]) -> None:
    """Delete the records no manifest names (and temp files) in ``directory``, as the next
    commit there would: once a server's workers have stopped, the parts a worker placed after
    its commit was aborted (nobody named them to delete them). A directory that cannot be
    reached, or only through a symlink, is left alone."""
    with contextlib.suppress(OSError, InvalidCheckpointError), opened_dir(Beneath.of(directory)) as dfd:
        _sweep(dfd)


def named_files(manifest: Manifest) -> set[str]:
    """The records files ``manifest`` names (one, or its parts')."""
    if manifest.parts:
        return {p.records_file for p in manifest.parts}
    return {manifest.records_file}


def _sweep(dfd: int) -> None:
    """Delete what a crashed commit left in the directory ``dfd``: temp files, and records no
    manifest names (by name in that directory only: never through a symlink)."""
    named: set[str] | None = set()
    try:
        named = named_files(decode_manifest(read_bounded(MANIFEST_NAME, MANIFEST_MAX_BYTES, dir_fd=dfd)))
    except FileNotFoundError:
        pass
    except (OSError, CheckpointStoreError, msgspec.MsgspecError):
        named = None  # an unreadable manifest: keep every records file, the reader will judge
    with contextlib.suppress(OSError), os.scandir(dfd) as entries:
        for entry in entries:
            orphan = entry.name.startswith(_TEMP_PREFIXES) or (
                named is not None
                and RECORDS_FILE.fullmatch(entry.name) is not None
                and entry.name not in named
            )
            if orphan and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=dfd)


def _create(dfd: int, name: str) -> BinaryIO:
    """A new file ``name`` in the directory ``dfd``, opened for writing (never an existing one)."""
    return os.fdopen(os.open(name, _CREATE_FLAGS, 0o666, dir_fd=dfd), "wb")


def _write_records(
    dfd: int, where: Beneath, lines: Iterable[bytes], on_step: StepHook, place_by: float | None = None
) -> tuple[str, str, int, int]:
    """The records file written in the directory ``dfd``: its name, digest, count and size
    (renamed into place only until ``place_by``, if given)."""
    digest = hashlib.sha256()
    count = 0
    size = 0
    temp = f".records.jsonl.{secrets.token_hex(8)}"
    records: str | None = None
    try:
        on_step("open_records")
        with _create(dfd, temp) as f:
            on_step("write_records")
            for line in lines:
                data = line + b"\n"
                digest.update(data)
                f.write(data)
                count += 1
                size += len(data)
            f.flush()
            on_step("fsync_records")
            os.fsync(f.fileno())
        sha = digest.hexdigest()
        try:
            # A worker stopped (SIGSTOP, swapped out) past its commit's wait places nothing.
            _check_in_time(where, place_by)
        except CheckpointWriteError:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dfd)
            raise
        # Same content gives the same name: replacing it changes nothing a reader could see.
        on_step("rename_records")
        os.replace(temp, f"records-{sha}.jsonl", src_dir_fd=dfd, dst_dir_fd=dfd)
        records = f"records-{sha}.jsonl"
        on_step("fsync_dir_records")
        os.fsync(dfd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
        if records is not None:
            _unlink_unless_published(dfd, [records])
        raise CheckpointWriteError(
            f"cannot write records in {where}: {exc.strerror}; no checkpoint was published",
            published=False,
        ) from None
    return records, sha, count, size


def _publish(
    dfd: int,
    where: Beneath,
    manifest: Manifest,
    records: list[str],
    stop: WriteStop | None,
    on_step: StepHook,
) -> bool:
    """Link the manifest into the directory ``dfd`` (create-only), unless ``stop`` is set;
    whether this call linked it (``False``: the identical manifest was there already)."""
    content = _manifest_encoder.encode(manifest)
    target = where.path / MANIFEST_NAME
    temp = f".manifest.json.{secrets.token_hex(8)}"
    linked = False
    existed = False
    try:
        on_step("open_manifest")
        with _create(dfd, temp) as f:
            on_step("write_manifest")
            f.write(content)
            f.flush()
            on_step("fsync_manifest")
            os.fsync(f.fileno())
        lock = stop._lock if stop is not None else contextlib.nullcontext()
        with lock:
            if stop is not None and stop.stopped:
                _unlink_unless_published(dfd, records)
                raise WriteStopped(
                    f"checkpoint {manifest.checkpoint_id} {stop.cause}: its manifest is not "
                    f"published{stop.advice()}"
                )
            try:
                on_step("link_manifest")
                os.link(temp, MANIFEST_NAME, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                linked = True
            except FileExistsError:
                try:
                    if _existing_manifest(dfd, target) != content:
                        raise InvalidCheckpointError(
                            f"{target} already holds a different manifest: it is never replaced"
                        ) from None
                except InvalidCheckpointError:
                    _unlink_unless_published(dfd, records)
                    raise
                existed = True
        on_step("fsync_dir_manifest")
        os.fsync(dfd)
    except OSError as exc:
        raise _write_failed(dfd, where, records, linked=linked, existed=existed, exc=exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
    return linked


def withdraw(directory: str | os.PathLike[str], manifest: Manifest) -> str | None:
    """Take back ``manifest``, which this participant linked for a commit that was then refused
    (its lease ran out, or it was resumed, before the answer): unlinked in one step, so a reader
    finds the whole manifest or none, then the records it names. ``None`` once it is gone (or
    was never there, or another manifest stands there: never ours to remove); else why it stays
    published (an ``OSError``'s message), which the refusal must say."""
    content = _manifest_encoder.encode(manifest)
    where = participant_beneath(directory, manifest.kind, manifest.instance)
    try:
        with opened_dir(where) as dfd:
            try:
                if read_bounded(MANIFEST_NAME, MANIFEST_MAX_BYTES, dir_fd=dfd) != content:
                    return None
            except FileNotFoundError:
                return None
            os.unlink(MANIFEST_NAME, dir_fd=dfd)
            with contextlib.suppress(OSError):
                os.fsync(dfd)
            _unlink_unless_published(dfd, sorted(named_files(manifest)))
    except (OSError, CheckpointStoreError) as exc:
        return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return None


def _existing_manifest(dfd: int, target: Path) -> bytes:
    """The manifest already in place; a symlink there (or anything but a regular file) is
    ``InvalidCheckpointError``: it is never written through, nor replaced."""
    try:
        return read_bounded(MANIFEST_NAME, MANIFEST_MAX_BYTES, dir_fd=dfd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InvalidCheckpointError(
            f"{target} is a symlink: the store never writes through one (remove it)"
        ) from None


def _write_failed(
    dfd: int, where: Beneath, records: list[str], *, linked: bool, existed: bool, exc: OSError
) -> CheckpointWriteError:
    """Undo what this writer published, and say truthfully whether a checkpoint exists now."""
    why = f"cannot publish the manifest in {where}: {exc.strerror}"
    if existed:
        return CheckpointWriteError(
            f"{why}; the identical manifest of an earlier commit is published", published=True
        )
    if linked:
        # Published but maybe not durable: take it back, so that no caller trusts it.
        try:
            os.unlink(MANIFEST_NAME, dir_fd=dfd)
        except OSError as again:
            return CheckpointWriteError(
                f"{why}; the manifest IS published but may not be durable (removing it failed: "
                f"{again.strerror})",
                published=True,
            )
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    _unlink_unless_published(dfd, records)
    return CheckpointWriteError(f"{why}; no checkpoint was published", published=False)


def _unlink_unless_published(dfd: int, records: list[str]) -> None:
    """Delete a losing writer's records in the directory ``dfd``, except those a published
    manifest names."""
    named: set[str] = set()
    with contextlib.suppress(OSError, CheckpointStoreError, msgspec.MsgspecError):
        named = named_files(decode_manifest(read_bounded(MANIFEST_NAME, MANIFEST_MAX_BYTES, dir_fd=dfd)))
    for name in records:
        if name not in named:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)


def decode_manifest(raw: bytes) -> Manifest:
    return msgspec.json.decode(raw, type=Manifest)
