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
