"""The run directory of rollout collection: ``<id>/collection.json``, then ``LATEST``.

Writing ``LATEST`` publishes a checkpoint; every file is written to a temporary name,
fsynced and renamed, so a crash leaves either the old file or the new one. Only the two
newest published checkpoints of the run are kept, and an aborted checkpoint's directory (the
records some participants wrote before it failed, no ``collection.json``) is removed
(``discard``): a fleet that aborted often filled its disk with them.

A run directory belongs to one run. ``claim()`` holds ``LOCK`` (``flock``, as SQLite and
Prometheus's TSDB lock their data directories; the kernel drops it when the holder's process
dies, so a stale lock needs no cleaning): a second fleet gets ``RunDirectoryInUse`` at once,
before it writes anything. Each checkpoint's ``collection.json`` names its ``run_id``:
``prune`` only counts and deletes this run's, and ``read`` refuses another run's
(``ForeignCheckpoint``) unless that run's id is given. A checkpoint directory, ``LATEST`` and
``collection.json`` are opened relative to the run directory without following a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import (
    CheckpointWriteError,
    ForeignCheckpoint,
    InvalidCheckpointError,
    RunDirectoryInUse,
    shown,
)
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.vocab import SAFE_NAME

__all__ = ["KEEP_CHECKPOINTS", "CollectionManifest", "RunDir", "new_checkpoint_id", "new_restore_id"]

KEEP_CHECKPOINTS: Final = 2
_LATEST: Final = "LATEST"
_MANIFEST: Final = "collection.json"
_LOCK: Final = "LOCK"
_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def new_checkpoint_id() -> str:
    """``ckpt-<YYYYmmddTHHMMSS>-<8hex>`` (UTC)."""
    return f"ckpt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def new_restore_id() -> str:
    """``restore-<12hex>``."""
    return f"restore-{secrets.token_hex(6)}"


class CollectionManifest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``<id>/collection.json``: which rollouts a checkpoint continues, restarts or finished."""

    checkpoint_id: str
    run_id: str
    created_at: float
    steps: int
    continued: list[EpisodeId]
    restarted: list[EpisodeId]
    completed: list[str] = msgspec.field(default_factory=list)
    #: The members (by name) each continued rollout's session is on, and every member that
    #: committed: a restore gives each its own episodes. Empty in a checkpoint that predates
    #: them (every member held every rollout).
    placement: dict[str, list[str]] = msgspec.field(default_factory=dict)
    members: list[str] = msgspec.field(default_factory=list)


class _LockHolder(msgspec.Struct, kw_only=True):
    """What the fleet holding ``LOCK`` wrote in it, for the next one's error message."""

    run_id: str
    pid: int
    host: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        return f"run {shown(self.run_id)}, pid {self.pid} on {self.host}, since {when}"


def _write_atomic(dfd: int, name: str, data: bytes) -> None:
    """``name`` in the directory ``dfd`` replaced by ``data`` (temp file, fsync, rename, fsync)."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    os.fsync(dfd)


def _read_file(dfd: int, name: str, where: Path) -> bytes:
    """The regular file ``name`` in the directory ``dfd``, never through a symlink."""
    try:
        fd = os.open(name, _READ, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidCheckpointError(f"{where / name} is a symlink: it is never followed") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidCheckpointError(f"{where / name} is not a regular file")
        return f.read()


class RunDir:
    """One collection run's directory; the checkpoint directories live inside it.

    ``run_id`` (default: the directory's name) is the run it belongs to: ``publish`` and
    ``prune`` hold the directory's lock (``claim``), ``prune`` and ``read`` go by the run id.
    """

    def __init__(self, path: Path | str, *, run_id: str | None = None) -> None:
        self.path = Path(path)
        self.run_id = run_id or self.path.name
        self._claim_lock = threading.Lock()
        self._claims = 0
        self._lock_fd: int | None = None

    # -- the lock ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the run directory for the block (re-entrant: the outermost claim takes ``LOCK``,
        creating the directory). Another fleet holding it is ``RunDirectoryInUse``."""
        with self._claim_lock:
            if self._claims == 0:
                self._lock_fd = self._take_lock()
            self._claims += 1
        try:
            yield
        finally:
            with self._claim_lock:
                self._claims -= 1
                if self._claims == 0 and self._lock_fd is not None:
                    os.close(self._lock_fd)  # closing the last descriptor drops the flock
                    self._lock_fd = None

    def _take_lock(self) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirectoryInUse(
                f"run directory {self.path} is in use by another fleet ({holder or 'holder unknown'}): "
                "give this fleet its own run directory, or stop the other fleet first",
                holder=holder,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        me = _LockHolder(run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(), since=time.time())
        os.ftruncate(fd, 0)
        os.pwrite(fd, msgspec.json.encode(me) + b"\n", 0)
        return fd

    @contextlib.contextmanager
    def _opened(self) -> Iterator[int]:
        fd = os.open(self.path, _DIRECTORY)
        try:
            yield fd
        finally:
            os.close(fd)

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint_dir(self, checkpoint_id: str) -> Path:
        if SAFE_NAME.fullmatch(checkpoint_id) is None:
            raise InvalidValueError(f"unsafe checkpoint id {shown(checkpoint_id)}")
        return self.path / checkpoint_id

    def _checkpoint_fd(self, run_fd: int, checkpoint_id: str, *, create: bool = False) -> int:
        """The checkpoint's directory, opened in the run directory without following a symlink."""
        path = self.checkpoint_dir(checkpoint_id)
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(checkpoint_id, dir_fd=run_fd)
                os.fsync(run_fd)
        try:
            return os.open(checkpoint_id, _DIRECTORY | os.O_NOFOLLOW, dir_fd=run_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise InvalidCheckpointError(
                    f"{path} is a symlink or not a directory: a checkpoint is never reached through one"
                ) from None
            raise

    def latest(self) -> str | None:
        """The published checkpoint id, or ``None`` before the first publish."""
        try:
            with self._opened() as run_fd:
                value = _read_file(run_fd, _LATEST, self.path).decode(errors="replace").strip()
        except FileNotFoundError:
            return None
        if SAFE_NAME.fullmatch(value) is None:
            raise InvalidCheckpointError(
                f"{self.path / _LATEST} does not hold a checkpoint id: {value[:80]!r}"
            )
        return value

    def read(self, checkpoint_id: str, *, run_id: str | None = None) -> CollectionManifest:
        """The checkpoint's manifest, if it belongs to ``run_id`` (default: this run's);
        another run's is ``ForeignCheckpoint``."""
        with self._opened() as run_fd:
            try:
                manifest = self._load(run_fd, checkpoint_id)
            except FileNotFoundError:
                raise InvalidCheckpointError(self._unpublished(run_fd, checkpoint_id)) from None
        expected = self.run_id if run_id is None else run_id
        if manifest.run_id != expected:
            raise ForeignCheckpoint(
                f"checkpoint {checkpoint_id} in {self.path} belongs to run {shown(manifest.run_id)}, not "
                f"{shown(expected)}: give this run its own run directory (or run_id={shown(manifest.run_id)} "
                "to continue that run)",
                checkpoint_id=checkpoint_id,
                run_id=manifest.run_id,
            )
        return manifest

    def _unpublished(self, run_fd: int, checkpoint_id: str) -> str:
        """Why ``checkpoint_id`` has no manifest to restore, and which one to restore instead."""
        latest = self.latest()
        instead = f"restore a published one ({'none yet' if latest is None else f'the latest is {latest}'})"
        try:
            os.stat(checkpoint_id, dir_fd=run_fd, follow_symlinks=False)
        except FileNotFoundError:
            return (
                f"no checkpoint {checkpoint_id} in {self.path} (never taken, or removed: aborted, or pruned "
                f"past the newest {KEEP_CHECKPOINTS}): {instead}"
            )
        # Participants write their records before the controller publishes: an aborted commit
        # leaves some of them here, which are no checkpoint.
        return (
            f"checkpoint {checkpoint_id} in {self.path} was never published (no {_MANIFEST}: its commit "
            f"or publish failed, or it is still being taken): {instead}"
        )

    def check_latest(self, *, also: str | None = None) -> None:
        """The published checkpoint, if any, is this run's (or run ``also``'s, which this run
        continues on purpose); another run's is ``ForeignCheckpoint``: publishing over it would
        hide that run's state from its next start. One that cannot be read is left to ``read``."""
        latest = self.latest()
        if latest is None:
            return
        try:
            with self._opened() as run_fd:
                owner = self._load(run_fd, latest).run_id
        except (OSError, InvalidCheckpointError, msgspec.DecodeError):
            return
        if owner not in (self.run_id, also):
            raise ForeignCheckpoint(
                f"run directory {self.path} holds the published checkpoint {latest} of run {shown(owner)}, "
                f"and this is run {shown(self.run_id)}: give this run its own run directory (or "
                f"run_id={shown(owner)} to continue that run)",
                checkpoint_id=latest,
                run_id=owner,
            )

    def _load(self, run_fd: int, checkpoint_id: str) -> CollectionManifest:
        fd = self._checkpoint_fd(run_fd, checkpoint_id)
        try:
            data = _read_file(fd, _MANIFEST, self.checkpoint_dir(checkpoint_id))
        finally:
            os.close(fd)
        manifest = msgspec.json.decode(data, type=CollectionManifest)
        if manifest.checkpoint_id != checkpoint_id:
            raise InvalidCheckpointError(
                f"{checkpoint_id}/{_MANIFEST} names checkpoint {shown(manifest.checkpoint_id)}"
            )
        return manifest

    def publish(self, manifest: CollectionManifest) -> None:
        """Write ``collection.json``, then ``LATEST``; then drop all but this run's newest two.

        Holds the directory (``claim``) throughout; a manifest of another run is refused. A write
        that fails (a full disk) is ``CheckpointWriteError`` (``published=False``), in one line
        naming the file: nothing of it is left to read, and ``LATEST`` names what it named before.
        """
        if manifest.run_id != self.run_id:
            raise InvalidValueError(
                f"checkpoint {manifest.checkpoint_id} is of run {shown(manifest.run_id)}, this directory's "
                f"run is {shown(self.run_id)}"
            )
        checkpoint_id = manifest.checkpoint_id
        with self.claim(), self._opened() as run_fd:
            try:
                fd = self._checkpoint_fd(run_fd, checkpoint_id, create=True)
                try:
                    _write_atomic(fd, _MANIFEST, msgspec.json.format(msgspec.json.encode(manifest), indent=1))
                finally:
                    os.close(fd)
            except OSError as exc:
                raise self._not_published(checkpoint_id, _MANIFEST, exc) from None
            try:
                _write_atomic(run_fd, _LATEST, checkpoint_id.encode() + b"\n")
            except OSError as exc:
                if self._names(checkpoint_id):  # renamed into place; only the fsync after it failed
                    raise
                # Was: collection.json stayed with LATEST naming the checkpoint before (a full
                # disk): read() restored it by id, discard() kept it, prune() counted it published.
                with contextlib.suppress(OSError):
                    os.unlink(f"{checkpoint_id}/{_MANIFEST}", dir_fd=run_fd)
                    os.fsync(run_fd)
                raise self._not_published(checkpoint_id, _LATEST, exc) from None
            self.prune(keep=checkpoint_id)

    def _names(self, checkpoint_id: str) -> bool:
        """Whether ``LATEST`` names ``checkpoint_id`` (``False`` if it cannot be read)."""
        try:
            return self.latest() == checkpoint_id
        except (OSError, InvalidCheckpointError):
            return False

    def _not_published(self, checkpoint_id: str, name: str, exc: OSError) -> CheckpointWriteError:
        """The one-line error of a publish that failed writing ``name``: nothing was published."""
        try:
            latest = self.latest()
        except (OSError, InvalidCheckpointError):
            latest = None
        still = "none yet" if latest is None else f"the latest is still {latest}"
        where = self.path / (checkpoint_id if name == _MANIFEST else "") / name
        return CheckpointWriteError(
            f"cannot publish checkpoint {checkpoint_id}: writing {where} failed: {exc.strerror or exc}; "
            f"nothing was published ({still}): free space in {self.path}, or make it writable",
            published=False,
        )

    def discard(self, checkpoint_id: str) -> bool:
        """Remove the directory of ``checkpoint_id``, a checkpoint that failed before it was
        published (what its participants wrote so far); whether it was removed. A published one
        (it has ``collection.json``, whoever's run it is) is never removed, nor anything through
        a symlink."""
        with self.claim(), self._opened() as run_fd:
            try:
                fd = self._checkpoint_fd(run_fd, checkpoint_id)
            except (FileNotFoundError, InvalidCheckpointError):
                return False  # never made, or a symlink: nothing of ours to remove
            try:
                os.stat(_MANIFEST, dir_fd=fd, follow_symlinks=False)
                return False  # published: only prune removes one, past the newest two
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
            shutil.rmtree(checkpoint_id, dir_fd=run_fd, ignore_errors=True)
        return True

    def prune(self, *, keep: str) -> list[str]:
        """Remove this run's published checkpoints older than its ``KEEP_CHECKPOINTS`` newest;
        never ``keep``, never another run's, never through a symlink."""
        with self.claim(), self._opened() as run_fd:
            published: list[tuple[float, str]] = []
            with os.scandir(run_fd) as entries:
                names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            for name in names:
                if SAFE_NAME.fullmatch(name) is None:
                    continue
                try:
                    manifest = self._load(run_fd, name)
                except (OSError, InvalidCheckpointError, msgspec.DecodeError):
                    continue  # not a published checkpoint (yet): leave it alone
                if manifest.run_id == self.run_id:
                    published.append((manifest.created_at, name))
            published.sort(reverse=True)
            removed = [name for _, name in published[KEEP_CHECKPOINTS:] if name != keep]
            for name in removed:
                shutil.rmtree(name, dir_fd=run_fd, ignore_errors=True)
        return removed


def _holder(fd: int) -> str:
    """Who holds ``LOCK`` (what it wrote there), or ``""`` if that is unreadable."""
    try:
        return msgspec.json.decode(os.pread(fd, 4096, 0), type=_LockHolder).describe()
    except (OSError, msgspec.DecodeError):
        return ""
