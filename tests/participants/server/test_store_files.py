"""The store's file primitives: Beneath, resolve_under, the walk, bounded reads, durable mkdir."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.server.store_files import (
    DEFAULT_CHECKPOINT_ROOT,
    MANIFEST_MAX_BYTES,
    RECORDS_MAX_BYTES,
    Beneath,
    fsync_dir,
    make_dirs,
    open_dir,
    open_regular,
    opened_dir,
    read_bounded,
    read_chunks,
    resolve_under,
)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def test_the_bounds_and_default_root() -> None:
    """A manifest is bounded at 64 KiB, a records file at 1 GiB; the default root is a relative name."""
    assert (MANIFEST_MAX_BYTES, RECORDS_MAX_BYTES) == (64 * 1024, 1 << 30)
    assert not Path(DEFAULT_CHECKPOINT_ROOT).is_absolute()


def test_a_beneath_spells_its_path_and_grows_by_children(tmp_path: Path) -> None:
    """fspath, str and path join root and parts; child appends names; the root is kept."""
    where = Beneath(tmp_path, ("a",)).child("b", "c")
    assert where.parts == ("a", "b", "c") and where.root == tmp_path
    assert os.fspath(where) == str(where) == str(tmp_path / "a" / "b" / "c")
    assert where.path == tmp_path / "a" / "b" / "c"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "nul\x00"])
def test_a_beneath_refuses_a_part_that_is_not_one_name(tmp_path: Path, name: str) -> None:
    """An empty, dot, dot-dot, slashed or NUL-holding part is InvalidCheckpointError, in child too."""
    message = f"{name!r} is not a directory name below {tmp_path}"
    with pytest.raises(InvalidCheckpointError) as info:
        Beneath(tmp_path, ("ok", name))
    assert info.value.detail == message
    with pytest.raises(InvalidCheckpointError):
        Beneath(tmp_path).child(name)


def test_a_beneath_round_trips_through_its_wire_form(tmp_path: Path) -> None:
    """wire() is [root, *parts]; from_wire rebuilds an equal Beneath; an empty list is refused."""
    where = Beneath(tmp_path, ("x", "gym"))
    assert where.wire() == [str(tmp_path), "x", "gym"]
    assert Beneath.from_wire(where.wire()) == where
    with pytest.raises(InvalidCheckpointError, match="an empty directory in a frame"):
        Beneath.from_wire([])
    with pytest.raises(InvalidCheckpointError, match="is not a directory name"):
        Beneath.from_wire([str(tmp_path), ".."])


def test_of_keeps_a_beneath_and_roots_a_plain_path(tmp_path: Path) -> None:
    """Beneath.of returns a Beneath as given; a plain path becomes its own root with no parts."""
    where = Beneath(tmp_path, ("a",))
    assert Beneath.of(where) is where
    assert Beneath.of(str(tmp_path)) == Beneath(tmp_path, ())
    assert Beneath.of(tmp_path / "d") == Beneath(tmp_path / "d")


def test_resolve_under_takes_relative_and_absolute_paths_below_the_root(tmp_path: Path) -> None:
    """A relative path is below the root; an absolute path under the root is made relative."""
    assert resolve_under(tmp_path, "x/y") == Beneath(tmp_path.resolve(), ("x", "y"))
    assert resolve_under(tmp_path, str(tmp_path / "x" / "y")) == Beneath(tmp_path.resolve(), ("x", "y"))
    assert resolve_under(tmp_path, str(tmp_path)) == Beneath(tmp_path.resolve(), ())


def test_resolve_under_accepts_the_root_as_configured_through_a_link(tmp_path: Path) -> None:
    """A root reached through a symlink: an absolute path may spell it either way; the root is resolved."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert resolve_under(link, str(link / "x")) == Beneath(real, ("x",))
    assert resolve_under(link, str(real / "x")) == Beneath(real, ("x",))


def test_resolve_under_refuses_what_leaves_the_root(tmp_path: Path) -> None:
    """A '..' part, an absolute path elsewhere, an empty path or a NUL: each its own message."""
    root = tmp_path / "root"
    with pytest.raises(InvalidCheckpointError) as info:
        resolve_under(root, "x/../y")
    assert info.value.detail == "checkpoint_dir 'x/../y' has a '..' part"
    with pytest.raises(InvalidCheckpointError) as info:
        resolve_under(root, "/etc")
    assert info.value.detail.startswith(
        f"checkpoint_dir '/etc' is outside this participant's checkpoint root {root.resolve()}: "
    )
    for bad in ("", "a\x00b"):
        with pytest.raises(InvalidCheckpointError) as info:
            resolve_under(root, bad)
        assert info.value.detail == f"checkpoint_dir {bad!r} is not a usable path"


def test_resolve_under_refuses_a_name_no_file_system_takes(tmp_path: Path) -> None:
    """A name over 255 bytes (NAME_MAX) is the caller's to fix: refused before the disk is touched,
    not met as an I/O error at commit (409 ``checkpoint_error``, which invites a retry)."""
    assert resolve_under(tmp_path, "a/" + "x" * 255) == Beneath(tmp_path.resolve(), ("a", "x" * 255))
    for long in ("x" * 256, "a/" + "é" * 128, str(tmp_path / ("x" * 256) / "b")):
        with pytest.raises(InvalidCheckpointError, match="has a name over 255 bytes: shorten it"):
            resolve_under(tmp_path, long)
    assert list(tmp_path.iterdir()) == []


def test_open_dir_walks_to_an_existing_directory(tmp_path: Path) -> None:
    """The descriptor opened is the directory's: a file made through it lands there."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    with opened_dir(Beneath(tmp_path, ("a", "b"))) as dfd:
        fd = os.open("made", os.O_WRONLY | os.O_CREAT, dir_fd=dfd)
        os.close(fd)
    assert _closed(dfd)
    assert (tmp_path / "a" / "b" / "made").is_file()


def test_open_dir_refuses_a_missing_directory_unless_asked_to_create(tmp_path: Path) -> None:
    """A missing part is FileNotFoundError; with create the whole path (root too) is made."""
    where = Beneath(tmp_path / "root", ("a", "b"))
    with pytest.raises(FileNotFoundError):
        open_dir(where)
    fd = open_dir(where, create=True)
    os.close(fd)
    assert (tmp_path / "root" / "a" / "b").is_dir()


def test_open_dir_never_walks_through_a_symlink(tmp_path: Path) -> None:
    """A symlinked part is InvalidCheckpointError saying so, even with create; nothing is made beyond."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "a").symlink_to(elsewhere, target_is_directory=True)
    where = Beneath(tmp_path / "root", ("a", "b"))
    for create in (False, True):
        with pytest.raises(InvalidCheckpointError) as info:
            open_dir(where, create=create)
        assert info.value.detail.startswith(
            f"{tmp_path / 'root' / 'a'} is a symlink, and the store never follows one"
        )
    assert list(elsewhere.iterdir()) == []


def test_open_dir_refuses_a_file_in_the_path(tmp_path: Path) -> None:
    """A regular file where a directory should be is 'is not a directory'."""
    (tmp_path / "a").write_text("not a dir")
    with pytest.raises(InvalidCheckpointError) as info:
        open_dir(Beneath(tmp_path, ("a", "b")))
    assert info.value.detail == f"{tmp_path / 'a'} is not a directory"


def test_make_dirs_creates_missing_parents_and_accepts_existing(tmp_path: Path) -> None:
    """mkdir -p: every missing level made; a second call is a no-op; a file in the way raises."""
    target = tmp_path / "a" / "b" / "c"
    make_dirs(target)
    assert target.is_dir()
    make_dirs(target)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError):
        make_dirs(tmp_path / "f" / "g")


def test_fsync_dir_needs_a_directory(tmp_path: Path) -> None:
    """A directory is fsynced; a regular file is NotADirectoryError."""
    fsync_dir(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")


def test_read_bounded_reads_a_small_regular_file(tmp_path: Path) -> None:
    """The whole file, by path or by name relative to a directory descriptor; at the bound is fine."""
    (tmp_path / "m.json").write_bytes(b"12345")
    assert read_bounded(tmp_path / "m.json", 5) == b"12345"
    with opened_dir(Beneath(tmp_path)) as dfd:
        assert read_bounded("m.json", 100, dir_fd=dfd) == b"12345"


def test_open_regular_refuses_a_file_over_its_bound(tmp_path: Path) -> None:
    """A file larger than the bound is refused by its size, naming the file, before any read."""
    (tmp_path / "big.jsonl").write_bytes(b"x" * 11)
    with pytest.raises(InvalidCheckpointError) as info:
        open_regular(tmp_path / "big.jsonl", 10)
    assert info.value.detail == "big.jsonl is 11 bytes, over the 10-byte bound"


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    """A FIFO (no writer) is 'not a regular file' at once instead of blocking the open."""
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InvalidCheckpointError) as info:
        open_regular(tmp_path / "pipe", 100)
    assert info.value.detail == "pipe is not a regular file"
    with pytest.raises(InvalidCheckpointError, match="is not a regular file"):
        read_bounded(tmp_path, 100)  # a directory is not one either


def test_open_regular_never_follows_a_final_symlink(tmp_path: Path) -> None:
    """A symlink as the last part is an OSError (ELOOP), even to a regular file."""
    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError) as info:
        open_regular(tmp_path / "link", 100)
    assert info.value.errno == errno.ELOOP


def test_read_chunks_stops_at_the_bound_and_closes(tmp_path: Path) -> None:
    """A file larger than the bound given to read_chunks is refused as having grown; fd is closed."""
    path = tmp_path / "grown.jsonl"
    path.write_bytes(b"y" * 20)
    fd = os.open(path, os.O_RDONLY)
    chunks = read_chunks(fd, path, 8)
    with pytest.raises(InvalidCheckpointError) as info:
        list(chunks)
    assert info.value.detail == "grown.jsonl grew past the 8-byte bound"
    assert _closed(fd)
    fd = os.open(path, os.O_RDONLY)
    assert b"".join(read_chunks(fd, path, 20)) == b"y" * 20
    assert _closed(fd)


def test_make_dirs_under_a_file_names_the_file(tmp_path: Path) -> None:
    """A file above the target is NotADirectoryError naming that file: it was "File exists",
    which read as a clash at the target itself."""
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        make_dirs(tmp_path / "f" / "g" / "h")
    assert info.value.strerror == f"{tmp_path / 'f'} is a file, not a folder"
    assert info.value.filename == str(tmp_path / "f")


def test_make_dirs_at_a_symlink_to_nothing_says_so(tmp_path: Path) -> None:
    """A dangling symlink in the way is said as one, not as a file."""
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(NotADirectoryError) as info:
        make_dirs(tmp_path / "link" / "g")
    assert info.value.strerror == f"{tmp_path / 'link'} is a symlink to nothing, not a folder"
