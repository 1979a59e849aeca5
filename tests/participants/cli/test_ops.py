"""``ckpt-events ops`` (``participants.cli.ops``): the ops pack written as shipped, never over a
pack already there without ``--force``. What the pack says: ``tests/sinks/test_ops_pack.py``."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.ops import OPS_FILES, ops_file
from tests.sinks.test_ops_pack import _written


def test_ops_writes_every_file_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every file lands as shipped; a second run without --force is one line and exit 2."""
    pack = _written(tmp_path)
    assert sorted(p.name for p in pack.iterdir()) == sorted(OPS_FILES)
    for name in OPS_FILES:
        assert (pack / name).read_text() == ops_file(name)
    capsys.readouterr()
    assert main(["ops", "--write", str(pack)]) == 2
    err = capsys.readouterr().err
    assert "already there; pass --force" in err and err.count("\n") == 1
    assert main(["ops", "--write", str(pack), "--force"]) == 0


def test_ops_refuses_a_name_that_is_not_a_file_and_names_a_failed_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name of the pack taken by a directory is refused before anything is written; a write
    failing part-way names its file and what was written (it said "Is a directory" alone)."""
    pack = tmp_path / "pack"
    (pack / "dashboard.json").mkdir(parents=True)
    assert main(["ops", "--write", str(pack), "--force"]) == 2
    err = capsys.readouterr().err
    assert "not a file: dashboard.json" in err and err.count("\n") == 1
    assert sorted(p.name for p in pack.iterdir()) == ["dashboard.json"]


def test_a_directory_that_is_a_dangling_link_says_what_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--write`` a link to a missing directory said "File exists" alone; it says what the
    link names and what to do, and writes nothing."""
    link = tmp_path / "pack"
    link.symlink_to(tmp_path / "gone")
    assert main(["ops", "--write", str(link)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which does not exist; create that directory" in err
    assert str(tmp_path / "gone") in err and not (tmp_path / "gone").exists()


def test_a_symlink_in_the_folder_is_a_file_already_there_and_force_replaces_the_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling symlink named like a file of the pack was not "already there": the pack was
    written through it, into a file outside the folder. It is refused without --force; with
    --force the link itself is replaced by the file, and nothing is written where it pointed."""
    pack = tmp_path / "pack"
    pack.mkdir()
    elsewhere = tmp_path / "elsewhere.yml"
    (pack / "rules.yml").symlink_to(elsewhere)
    assert main(["ops", "--write", str(pack)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ckpt-events ops: error: --write {pack}: rules.yml already there; pass --force to overwrite\n"
    )
    assert sorted(p.name for p in pack.iterdir()) == ["rules.yml"] and not elsewhere.exists()
    assert main(["ops", "--write", str(pack), "--force"]) == 0
    assert not (pack / "rules.yml").is_symlink() and (pack / "rules.yml").read_text() == ops_file("rules.yml")
    assert not elsewhere.exists()


#: What a process of ``_ops_with_file_size_limit`` may write to one file: rules.yml fits, a
#: later file of the pack does not.
_FILE_SIZE_LIMIT: Final = len(ops_file("rules.yml").encode())


def _ops_with_file_size_limit(pack: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``ops --write PACK`` in a process that may write no file past ``_FILE_SIZE_LIMIT`` bytes
    (RLIMIT_FSIZE, a full disk's stand-in)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", "ops", "--write", str(pack), *flags],
        capture_output=True, text=True, timeout=60, check=False, preexec_fn=limit,
    )  # fmt: skip


def test_a_write_failing_part_way_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    """A file of the pack failing to write (a full disk) left the files before it written, the
    failed one cut short (dashboard.json at 4096 of 12,139 bytes, unnamed in the error) and the
    old pack's other files beside them; a later run refused to touch them. The pack is written
    whole or not at all: nothing new in the folder, an old pack there left byte for byte."""
    too_large = [name for name in OPS_FILES if len(ops_file(name).encode()) > _FILE_SIZE_LIMIT]
    assert too_large and too_large[0] != OPS_FILES[0]  # part way: after rules.yml is written
    pack = tmp_path / "pack"
    done = _ops_with_file_size_limit(pack)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == (
        f"ckpt-events ops: error: --write {pack}: cannot write the pack: {pack / too_large[0]}: "
        "File too large; nothing written\n"
    )
    assert list(pack.iterdir()) == []
    old = {name: f"old {name}\n" for name in OPS_FILES}
    for name, text in old.items():
        (pack / name).write_text(text)
    done = _ops_with_file_size_limit(pack, "--force")
    assert done.returncode == 2 and "nothing written" in done.stderr, done
    assert {p.name: p.read_text() for p in pack.iterdir()} == old


def test_the_written_paths_show_terminal_controls_as_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ops --write DIR`` with a clear screen, an OSC 8 link and a bidi override in DIR's name:
    the four paths it printed carried them raw (16 control and format characters); escaped now,
    and the pack is written under the real name."""
    name = "pack\x1b[2J\x1b]8;;http:\x07\u202e"
    assert main(["ops", "--write", str(tmp_path / name)]) == 0
    out = capsys.readouterr().out
    assert all(line.isprintable() for line in out.splitlines())
    shown = str(tmp_path) + r"/pack\x1b[2J\x1b]8;;http:\x07\u202e"
    assert out.splitlines() == [f"{shown}/{file}" for file in OPS_FILES]
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted(OPS_FILES)
