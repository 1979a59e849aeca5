"""The server benchmark's nemo-lens row: skipped with its reason without a usable interpreter;
its server (run under Python 3.13) compiles here, imports nothing of ours and does the same work."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from ckpt_events.benchmarks import nemo_lens_row, report, server_app

_SERVER_APP = Path(server_app.__file__)


def _skipped_line(lens: nemo_lens_row.LensInterpreter) -> str:
    (line,) = report.markdown_table([nemo_lens_row.skipped_row(lens.skipped)]).splitlines()[2:]
    return line


def test_without_an_interpreter_the_row_says_how_to_give_one() -> None:
    """No option and no variable: skipped, naming both ways to give the interpreter."""
    lens = nemo_lens_row.probe(None)
    assert lens.python is None
    line = _skipped_line(lens)
    assert "skipped: no interpreter given" in line
    assert "--nemo-lens-python" in line and nemo_lens_row.ENV in line
    assert "| n/a |" in line


def test_a_path_that_cannot_run_is_skipped_not_raised(tmp_path: Path) -> None:
    """A missing file and a file that is not executable give a skipped row with the OS's reason."""
    missing = nemo_lens_row.probe(str(tmp_path / "python3.13"))
    assert missing.python is None
    assert "cannot run: No such file or directory" in missing.skipped
    text = tmp_path / "notes.txt"
    text.write_text("not an interpreter\n")
    denied = nemo_lens_row.probe(str(text))
    assert denied.python is None
    assert "cannot run: Permission denied" in denied.skipped


@pytest.mark.skipif(importlib.util.find_spec("nemo") is not None, reason="this interpreter has nemo")
def test_an_interpreter_without_nemo_lens_is_skipped_with_the_import_error() -> None:
    """Our own interpreter imports fastapi and uvicorn but not nemo.lens: skipped, on one line."""
    lens = nemo_lens_row.probe(sys.executable)
    assert lens.python is None
    assert lens.skipped.startswith(f"{sys.executable} lacks nemo-lens[sdk], fastapi or uvicorn")
    assert "No module named 'nemo'" in lens.skipped
    assert "\n" not in lens.skipped


def test_the_server_runs_as_a_file_without_our_interpreter_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command names the interpreter and the server file; our PYTHONPATH is not passed on."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    assert nemo_lens_row.command("/opt/py313/bin/python", 8123, "http://127.0.0.1:4318") == [
        "/opt/py313/bin/python",
        str(nemo_lens_row.SERVER),
        "8123",
        "http://127.0.0.1:4318",
    ]
    assert nemo_lens_row.command("/opt/py313/bin/python", 8123, None)[2:] == ["8123"]
    assert nemo_lens_row.SERVER.is_file()
    assert "PYTHONPATH" not in nemo_lens_row.environment()


def test_the_row_names_both_interpreters() -> None:
    """The comparison crosses interpreters, and the row's name says so."""
    name = nemo_lens_row.name(nemo_lens_row.VARIANT, "CPython 3.13.0")
    assert "on CPython 3.13.0" in name
    assert f"the other rows: CPython {sys.version.split()[0]}" in name
    assert "uninstrumented, on CPython 3.13.0" in nemo_lens_row.name(nemo_lens_row.BASELINE, "CPython 3.13.0")
    what, ratio, _, _ = nemo_lens_row.same_interpreter_row(
        {nemo_lens_row.VARIANT: [300.0, 330.0, 280.0], nemo_lens_row.BASELINE: [200.0, 220.0, 140.0]},
        "CPython 3.13.0",
    )
    assert ratio == 1.5
    assert what.endswith("/ uninstrumented, both on CPython 3.13.0")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_the_nemo_lens_server_compiles_and_imports_nothing_of_ours() -> None:
    """It compiles on this interpreter, and imports neither ckpt_events nor sinks nor benchmarks."""
    source = nemo_lens_row.SERVER.read_text()
    compile(source, str(nemo_lens_row.SERVER), "exec")
    imported = set()
    for node in ast.walk(_tree(nemo_lens_row.SERVER)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import needs our package"
            imported.add((node.module or "").split(".")[0])
    assert imported.isdisjoint(
        {"ckpt_events", "sinks", "participants", "benchmarks", "ckpt_events.benchmarks"}
    )
    assert {"nemo", "fastapi", "uvicorn"} <= imported


def test_the_nemo_lens_server_does_the_same_unit_of_work() -> None:
    """Its ``_unit_of_work`` is the other variants' one, statement for statement."""

    def unit(path: Path) -> str:
        (node,) = [
            n for n in _tree(path).body if isinstance(n, ast.FunctionDef) and n.name == "_unit_of_work"
        ]
        return ast.dump(node)

    assert unit(nemo_lens_row.SERVER) == unit(_SERVER_APP)
