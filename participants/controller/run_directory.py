"""The run directory of rollout collection: ``<id>/collection.json``, then ``LATEST``.

Writing ``LATEST`` publishes a checkpoint; every file is written to a temporary name,
fsynced and renamed, so a crash leaves either the old file or the new one. Only the two
newest published checkpoints are kept.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Final

import msgspec

from ckpt_events import SAFE_NAME, InvalidValueError
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.protocol import EpisodeId

__all__ = ["KEEP_CHECKPOINTS", "CollectionManifest", "RunDir", "new_checkpoint_id", "new_restore_id"]

KEEP_CHECKPOINTS: Final = 2
_LATEST: Final = "LATEST"
_MANIFEST: Final = "collection.json"


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunDir:
    """One collection run's directory; the checkpoint directories live inside it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def checkpoint_dir(self, checkpoint_id: str) -> Path:
        if SAFE_NAME.fullmatch(checkpoint_id) is None:
            raise InvalidValueError(f"unsafe checkpoint id {checkpoint_id!r}")
        return self.path / checkpoint_id

    def latest(self) -> str | None:
        """The published checkpoint id, or ``None`` before the first publish."""
        try:
            value = (self.path / _LATEST).read_text().strip()
        except FileNotFoundError:
            return None
        if SAFE_NAME.fullmatch(value) is None:
            raise InvalidCheckpointError(
                f"{self.path / _LATEST} does not hold a checkpoint id: {value[:80]!r}"
            )
        return value

    def read(self, checkpoint_id: str) -> CollectionManifest:
        data = (self.checkpoint_dir(checkpoint_id) / _MANIFEST).read_bytes()
        manifest = msgspec.json.decode(data, type=CollectionManifest)
        if manifest.checkpoint_id != checkpoint_id:
            raise InvalidCheckpointError(
                f"{checkpoint_id}/{_MANIFEST} names checkpoint {manifest.checkpoint_id!r}"
            )
        return manifest

    def publish(self, manifest: CollectionManifest) -> None:
        """Write ``collection.json``, then ``LATEST``; then drop all but the newest two."""
        directory = self.checkpoint_dir(manifest.checkpoint_id)
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(directory / _MANIFEST, msgspec.json.format(msgspec.json.encode(manifest), indent=1))
        _write_atomic(self.path / _LATEST, manifest.checkpoint_id.encode() + b"\n")
        self.prune(keep=manifest.checkpoint_id)

    def prune(self, *, keep: str) -> list[str]:
        """Remove published checkpoints older than the ``KEEP_CHECKPOINTS`` newest; never ``keep``."""
        published: list[tuple[float, str]] = []
        for child in self.path.iterdir():
            if not child.is_dir() or SAFE_NAME.fullmatch(child.name) is None:
                continue
            try:
                published.append((self.read(child.name).created_at, child.name))
            except (OSError, InvalidCheckpointError, msgspec.DecodeError):
                continue  # not a published checkpoint (yet): leave it alone
        published.sort(reverse=True)
        removed = [name for _, name in published[KEEP_CHECKPOINTS:] if name != keep]
        for name in removed:
            shutil.rmtree(self.path / name, ignore_errors=True)
        return removed
