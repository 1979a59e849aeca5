"""What a user's ``help()``, ``pydoc`` and tab completion (``dir()``) show of each public module."""

from __future__ import annotations

import importlib
import inspect
import pydoc
import re
import types
from pathlib import Path

import pytest

from ckpt_events import OperationSpan, StepSpan
from tests.typecheck import mypy_strict

PUBLIC_MODULES = [
    "ckpt_events",
    "ckpt_events.sinks",
    "ckpt_events.sinks.jsonl",
    "ckpt_events.sinks.otel",
    "ckpt_events.sinks.otlp",
    "ckpt_events.participants",
    "ckpt_events.participants.fastapi",
    "ckpt_events.testing",
]


def _load_everything(mod: types.ModuleType) -> None:
    """Read every public name, so the lazy packages have loaded their private submodules too."""
    for name in mod.__all__:
        getattr(mod, name)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_dir_lists_the_api_and_no_private_or_imported_name(module: str) -> None:
    """Past the dunders, dir() holds __all__ and public submodules only (it held ``_HOMES``,
    ``Final``, ``annotations``, loaded ``_file_lock``, and in the fastapi module ``os``, ``Bus``)."""
    mod = importlib.import_module(module)
    _load_everything(mod)
    listed = {name for name in dir(mod) if not name.startswith("__")}
    submodules = {
        name
        for name in listed
        if isinstance(getattr(mod, name), types.ModuleType) and name not in mod.__all__
    }
    assert listed - submodules == set(mod.__all__)
    for name in submodules:
        assert not name.startswith("_") and getattr(mod, name).__name__ == f"{module}.{name}"


def test_dir_lists_a_public_submodule_once_imported() -> None:
    """``ckpt_events.sinks`` stays completable after ``import ckpt_events.sinks``."""
    import ckpt_events
    import ckpt_events.sinks

    assert "sinks" in dir(ckpt_events) and "vocab" in dir(ckpt_events)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_help_renders_every_public_module(module: str) -> None:
    """``help(module)`` and ``python -m pydoc module`` render, naming each public name
    (``help(ckpt_events)`` raised NameError: the span handles' signatures named ``Telemetry``)."""
    mod = importlib.import_module(module)
    text = pydoc.render_doc(mod, renderer=pydoc.plaintext)
    for name in mod.__all__:
        assert name in text


@pytest.mark.parametrize("handle", [OperationSpan, StepSpan])
def test_span_handles_have_a_signature(handle: type) -> None:
    """inspect.signature (help, IDEs, IPython's ``?``) reads the handles' fields."""
    assert "_tel" in inspect.signature(handle).parameters


def test_mypy_strict_refuses_a_misspelt_public_name(tmp_path: Path, mypy_cache: Path) -> None:
    """A name no public module has is a type error, as it is an ImportError at run time (the lazy
    packages' ``__getattr__`` typed every name, ``Bsu`` included, as Any, and mypy passed); a name
    that moved to ``vocab`` is still typed where it is still read, until it leaves."""
    errors = mypy_strict(
        """
        import ckpt_events.participants as participants
        from ckpt_events import Bsu, Bus, ErrorCode, sinks
        from ckpt_events.sinks import JsonLineSink
        from ckpt_events.sinks.jsonl import JsonLinesStats
        from ckpt_events.sinks.otlp import OtlpSpanSink

        bus: Bus = Bus()
        stats: type[JsonLinesStats] = JsonLinesStats
        configure = sinks.confgure
        create_app = participants.create_ap
        code: ErrorCode = ErrorCode.ADMISSION_CLOSED  # moved to vocab: still typed until it leaves
        """,
        tmp_path,
        mypy_cache,
    )
    missing = sorted(re.findall(r'has no attribute "(\w+)"', "\n".join(errors)))
    assert missing == ["Bsu", "JsonLineSink", "OtlpSpanSink", "confgure", "create_ap"], errors
