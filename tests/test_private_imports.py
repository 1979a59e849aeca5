"""The harness (participants/, benchmarks/) is built on the library's public names only.

The library is ``ckpt_events`` and ``ckpt_events.sinks``. A harness module that imports a
``_private`` module or name of theirs is using something a user cannot: what the harness needs
becomes public (documented and tested) or stays inside the harness.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ("participants", "benchmarks")
#: Installed names of the harness: its own private modules are its business.
HARNESS_NAMES = ("ckpt_events.participants", "ckpt_events.benchmarks")


def _is_library(module: str) -> bool:
    if module == "ckpt_events" or module.startswith("ckpt_events."):
        return not any(module == h or module.startswith(h + ".") for h in HARNESS_NAMES)
    return False


def _private_name(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__


def _private(module: str) -> bool:
    return any(_private_name(part) for part in module.split("."))


def private_imports(source: str) -> list[str]:
    """Each import of a private module or name of the library in ``source``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if _is_library(a.name) and _private(a.name)
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_library(node.module or ""):
            module = node.module or ""
            if _private(module):
                found.append(f"{node.lineno}: from {module}")
            found += [
                f"{node.lineno}: from {module} import {a.name}" for a in node.names if _private_name(a.name)
            ]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_library(node.args[0].value)
            and _private(node.args[0].value)
        ):
            found.append(f"{node.lineno}: import_module({node.args[0].value!r})")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ckpt_events._lazy import lazy_attributes", ["1: from ckpt_events._lazy"]),
        ("import ckpt_events.sinks._span_attrs", ["1: import ckpt_events.sinks._span_attrs"]),
        ("from ckpt_events.sinks.otlp import _tags", ["1: from ckpt_events.sinks.otlp import _tags"]),
        (
            "import importlib\nimportlib.import_module('ckpt_events._bus')",
            ["2: import_module('ckpt_events._bus')"],
        ),
        ("from ckpt_events import Bus, __version__\nfrom ckpt_events.sinks.otlp import SpanEncoder", []),
        ("from ckpt_events.participants.server._x import y\nfrom . import _mine", []),
    ],
)
def test_the_detector_flags_private_imports_and_only_those(source: str, expected: list[str]) -> None:
    assert private_imports(source) == expected


def test_no_harness_module_imports_a_private_name_of_the_library() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for room in HARNESS
        for path in sorted((ROOT / room).rglob("*.py"))
        if (hits := private_imports(path.read_text()))
    }
    assert found == {}
