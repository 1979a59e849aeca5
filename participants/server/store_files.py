"""The store's file primitives: the checkpoint root, bounded reads of regular files only, and
durable directory creation.

``resolve_under(root, checkpoint_dir)`` is the only way a request's directory reaches the
disk: relative names are taken under the participant's root, absolute ones must resolve
(symlinks followed) inside it. ``read_bounded`` opens with ``O_NOFOLLOW | O_NONBLOCK`` so a
FIFO or a device never blocks, refuses anything but a regular file, never reads past a bound,
and always closes its descriptor. ``make_dirs`` fsyncs the parent of every directory it creates.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Generator
from pathlib import Path
from typing import Final

from ckpt_events.participants.errors import InvalidCheckpointError

__all__ = [
    "DEFAULT_CHECKPOINT_ROOT",
    "MANIFEST_MAX_BYTES",
    "RECORDS_MAX_BYTES",
    "fsync_dir",
    "make_dirs",
    "open_regular",
    "read_bounded",
    "read_chunks",
    "resolve_under",
]

#: The participant's checkpoint root when none is given: this directory, under the working directory.
DEFAULT_CHECKPOINT_ROOT: Final = "ckpt-events-checkpoints"
#: A manifest is a few hundred bytes; anything larger is not one.
MANIFEST_MAX_BYTES: Final = 64 * 1024
#: The default bound on a records file (configurable per participant).
RECORDS_MAX_BYTES: Final = 1 << 30
_CHUNK: Final = 1 << 20


def resolve_under(root: Path, checkpoint_dir: str) -> Path:
    """``checkpoint_dir`` resolved inside ``root``; anything that escapes is ``InvalidCheckpointError``."""
    if "\x00" in checkpoint_dir or not checkpoint_dir:
        raise InvalidCheckpointError(f"checkpoint_dir {checkpoint_dir!r} is not a usable path")
    if ".." in Path(checkpoint_dir).parts:
        raise InvalidCheckpointError(f"checkpoint_dir {checkpoint_dir!r} has a '..' part")
    real_root = root.resolve()
    target = (real_root / checkpoint_dir).resolve()
    if not target.is_relative_to(real_root):
        raise InvalidCheckpointError(
            f"checkpoint_dir {checkpoint_dir!r} resolves to {target}, outside this participant's "
            f"checkpoint root {real_root}"
        )
    return target


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """``mkdir -p`` that fsyncs the parent of each directory it creates, so they survive a crash."""
    missing: list[Path] = []
    current = directory
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        fsync_dir(path.parent)


def open_regular(path: Path, limit: int) -> int:
    """A read-only descriptor of ``path`` if it is a regular file of at most ``limit`` bytes.

    Never follows a symlink in the last part and never blocks on a FIFO or a device; the
    descriptor is closed whenever this raises.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidCheckpointError(f"{path.name} is not a regular file")
        if info.st_size > limit:
            raise InvalidCheckpointError(f"{path.name} is {info.st_size} bytes, over the {limit}-byte bound")
        # Back to blocking reads: a regular file does not block anyway.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_chunks(fd: int, path: Path, limit: int) -> Generator[bytes, None, None]:
    """The file's bytes in chunks, refusing (not reading) anything past ``limit``; closes ``fd``."""
    total = 0
    try:
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                return
            total += len(chunk)
            if total > limit:
                raise InvalidCheckpointError(f"{path.name} grew past the {limit}-byte bound")
            yield chunk
    finally:
        os.close(fd)


def read_bounded(path: Path, limit: int) -> bytes:
    """The whole of a small regular file (at most ``limit`` bytes)."""
    return b"".join(read_chunks(open_regular(path, limit), path, limit))
