"""The store's file primitives: the checkpoint root, the directories below it, bounded reads of
regular files only, and durable directory creation.

Nothing outside the root: ``resolve_under(root, checkpoint_dir)`` is the only way a request's
directory reaches the disk, as a ``Beneath`` (the root and the names below it, checked by
their spelling only). ``open_dir`` then walks those names from the root one at a time, each
opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor (``openat``, as
``openat2(RESOLVE_BENEATH)`` does in one call), so a symlink anywhere below the root is refused
(``InvalidCheckpointError``), never followed, even one swapped in during the walk. The store
then creates, renames, links, reads and deletes only by name relative to the descriptor it
holds. The root itself is the operator's: links in its own path are followed.
``read_bounded`` opens with ``O_NOFOLLOW | O_NONBLOCK`` so a FIFO or a device never blocks,
refuses anything but a regular file, never reads past a bound, and always closes its
descriptor. Every directory created is made durable: its parent is fsynced.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckpt_events.participants.errors import InvalidCheckpointError, shown

__all__ = [
    "DEFAULT_CHECKPOINT_ROOT",
    "Beneath",
    "MANIFEST_MAX_BYTES",
    "RECORDS_MAX_BYTES",
    "fsync_dir",
    "make_dirs",
    "open_dir",
    "open_regular",
    "opened_dir",
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
#: The longest directory name the usual file systems take (NAME_MAX, in bytes): a longer one in
#: a request is the caller's to fix, not an I/O error a retry might get past.
_NAME_MAX: Final = 255
#: One step of the walk below the root: a directory, never a symlink to one.
_DIRECTORY_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Beneath:
    """A directory ``parts`` below a trusted ``root``, reached only by ``open_dir``'s walk.

    ``os.fspath`` (and ``str``) give its path, for messages; ``wire`` and ``from_wire`` carry it
    to a worker process, which walks it the same way.
    """

    root: Path
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Each part is one name: a '..' would walk up out of the root even without a symlink.
        for name in self.parts:
            if name in ("", ".", "..") or "/" in name or "\x00" in name:
                raise InvalidCheckpointError(f"{shown(name)} is not a directory name below {self.root}")

    def __fspath__(self) -> str:
        return str(self.root.joinpath(*self.parts))

    def __str__(self) -> str:
        return self.__fspath__()

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)

    def child(self, *names: str) -> Beneath:
        return Beneath(self.root, (*self.parts, *names))

    def wire(self) -> list[str]:
        """``[root, *parts]``: a frame's JSON form."""
        return [str(self.root), *self.parts]

    @classmethod
    def from_wire(cls, value: Sequence[str]) -> Beneath:
        if not value:
            raise InvalidCheckpointError("an empty directory in a frame")
        return cls(Path(value[0]), tuple(value[1:]))

    @classmethod
    def of(cls, directory: str | os.PathLike[str]) -> Beneath:
        """``directory`` as given if it is a ``Beneath``; else the directory is its own root (a
        caller with no root trusts the directory it names, and nothing below it is followed)."""
        if isinstance(directory, Beneath):
            return directory
        return cls(Path(directory))


def resolve_under(root: Path, checkpoint_dir: str) -> Beneath:
    """``checkpoint_dir`` below ``root``: relative to it, or an absolute path under it; a
    ``..`` part or an absolute path elsewhere is ``InvalidCheckpointError``. Nothing is
    resolved here: ``open_dir`` walks the parts without following a symlink."""
    if "\x00" in checkpoint_dir or not checkpoint_dir:
        raise InvalidCheckpointError(f"checkpoint_dir {shown(checkpoint_dir)} is not a usable path")
    given = Path(checkpoint_dir)
    if ".." in given.parts:
        raise InvalidCheckpointError(f"checkpoint_dir {shown(checkpoint_dir)} has a '..' part")
    real_root = root.resolve()
    if given.is_absolute():
        # The root as configured or as resolved: an absolute path may spell either.
        base = next((b for b in (real_root, root.absolute()) if given.is_relative_to(b)), None)
        if base is None:
            raise InvalidCheckpointError(
                f"checkpoint_dir {shown(checkpoint_dir)} is outside this participant's checkpoint root "
                f"{real_root}: give it relative to the root, or as a path under it"
            )
        given = given.relative_to(base)
    if any(len(os.fsencode(part)) > _NAME_MAX for part in given.parts):
        raise InvalidCheckpointError(
            f"checkpoint_dir {shown(checkpoint_dir)} has a name over {_NAME_MAX} bytes: shorten it"
        )
    return Beneath(real_root, given.parts)


def open_dir(where: Beneath, *, create: bool = False) -> int:
    """A descriptor of ``where``'s directory, walked from its root one name at a time.

    A name that is a symlink (or not a directory) is ``InvalidCheckpointError``, whatever it
    points at; a missing one is ``FileNotFoundError``, or with ``create`` is made (its parent
    fsynced), the root too. Other ``OSError``s pass through; the caller closes the descriptor.
    """
    if create:
        make_dirs(where.root)
    fd = os.open(where.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(where.parts):
            child = _open_child(fd, name, create)
            if child is None:
                raise InvalidCheckpointError(_not_a_directory(fd, name, where, depth))
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(parent: int, name: str, create: bool) -> int | None:
    """The directory ``name`` in ``parent``, never through a symlink; ``None`` if it is not one."""
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        raise
    try:
        os.mkdir(name, dir_fd=parent)
    except FileExistsError:
        pass  # made beside us since: opened (and judged) below
    else:
        os.fsync(parent)
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        raise


def _not_a_directory(parent: int, name: str, where: Beneath, depth: int) -> str:
    path = where.root.joinpath(*where.parts[: depth + 1])
    try:
        link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        link = False
    if link:
        return (
            f"{path} is a symlink, and the store never follows one: nothing is written or read "
            f"outside this participant's checkpoint root {where.root} (make it a real directory)"
        )
    return f"{path} is not a directory"


@contextmanager
def opened_dir(where: Beneath, *, create: bool = False) -> Iterator[int]:
    """``open_dir`` as a context: the descriptor is closed on the way out."""
    fd = open_dir(where, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


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
                # Said as what it is, naming the file: "File exists" read as a clash at the target.
                what = "a symlink to nothing" if path.is_symlink() else "a file"
                why = f"{path} is {what}, not a folder"
                raise NotADirectoryError(errno.ENOTDIR, why, str(path)) from None
            continue
        fsync_dir(path.parent)


def open_regular(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> int:
    """A read-only descriptor of ``path`` (relative to ``dir_fd`` if given) if it is a regular
    file of at most ``limit`` bytes.

    Never follows a symlink in the last part and never blocks on a FIFO or a device; the
    descriptor is closed whenever this raises.
    """
    name = Path(path).name
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidCheckpointError(f"{name} is not a regular file")
        if info.st_size > limit:
            raise InvalidCheckpointError(f"{name} is {info.st_size} bytes, over the {limit}-byte bound")
        # Back to blocking reads: a regular file does not block anyway.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_chunks(fd: int, path: str | os.PathLike[str], limit: int) -> Generator[bytes, None, None]:
    """The file's bytes in chunks, refusing (not reading) anything past ``limit``; closes ``fd``."""
    total = 0
    try:
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                return
            total += len(chunk)
            if total > limit:
                raise InvalidCheckpointError(f"{Path(path).name} grew past the {limit}-byte bound")
            yield chunk
    finally:
        os.close(fd)


def read_bounded(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> bytes:
    """The whole of a small regular file (at most ``limit`` bytes), relative to ``dir_fd`` if given."""
    return b"".join(read_chunks(open_regular(path, limit, dir_fd=dir_fd), path, limit))
