"""``ckpt-events ops`` (``participants.cli.ops``): the ops pack written as shipped, never over a
pack already there without ``--force``. What the pack says: ``tests/sinks/test_ops_pack.py``."""

from __future__ import annotations

from pathlib import Path

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
    (pack / "dashboard.json").rmdir()
    (pack / "dashboard.json").symlink_to(tmp_path / "gone" / "dashboard.json")  # cannot be written
    assert main(["ops", "--write", str(pack)]) == 2
    err = capsys.readouterr().err
    assert f"{pack / 'dashboard.json'}: No such file or directory (rules.yml, rules_test.yml written)" in err
    assert err.count("\n") == 1
