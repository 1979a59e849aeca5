"""What a user's ``help()``, ``pydoc`` and tab completion (``dir()``) show of each public module."""

from __future__ import annotations

import importlib
import inspect
import pydoc

import pytest

from ckpt_events import OperationSpan, StepSpan

PUBLIC_MODULES = [
    "ckpt_events",
    "ckpt_events.sinks",
    "ckpt_events.sinks.jsonl",
    "ckpt_events.sinks.otel",
    "ckpt_events.sinks.otlp",
    "ckpt_events.participants",
    "ckpt_events.participants.fastapi",
]


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
