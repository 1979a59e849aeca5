"""Pickles, reprs and tracebacks name public modules only: a user's stored pickle of an event or
an error loads after we move a private module (0.3.0 moved many).

The names are read from the ``__all__`` of every public module, so a new public class is covered.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pickletools
import pkgutil
import traceback
from typing import Any

import anyio
import msgspec
import pytest

import ckpt_events
from ckpt_events import _errors
from tests.ckpt_events.test_pickling import EXCEPTIONS, _emitted, _sample


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _public_modules() -> list[str]:
    found = ["ckpt_events"]
    for info in pkgutil.walk_packages(ckpt_events.__path__, "ckpt_events."):
        if _private(info.name) or info.name.startswith("ckpt_events.benchmarks"):
            continue
        if info.name.endswith("__main__"):
            continue
        found.append(info.name)
    return found


def _public_objects() -> dict[str, Any]:
    """Every class and function of every public module's ``__all__``, by one public path."""
    found: dict[str, Any] = {}
    for module in _public_modules():
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            value = getattr(mod, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                found.setdefault(f"{module}.{name}", value)
    return found


PUBLIC = _public_objects()


def _pickled_paths(value: object) -> set[str]:
    """The ``module.name`` of each global that a protocol-0 pickle of ``value`` refers to."""
    return {
        arg.replace(" ", ".")
        for op, arg, _ in pickletools.genops(pickle.dumps(value, 0))
        if op.name == "GLOBAL" and isinstance(arg, str)
    }


def _private_paths(value: object) -> set[str]:
    return {path for path in _pickled_paths(value) if path.startswith("ckpt_events") and _private(path)}


def test_the_public_names_are_found() -> None:
    """The walk reaches the core, the sinks and their subpackages (a broken walk would test nothing)."""
    assert len(PUBLIC) >= 150
    for path in (
        "ckpt_events.OperationFinished",
        "ckpt_events.sinks.JsonLinesSink",
        "ckpt_events.vocab.Kind",
    ):
        assert path in PUBLIC


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_a_public_name_is_named_by_a_public_module(path: str) -> None:
    """``__module__`` is public and holds the object under its ``__qualname__``; the object
    pickles by that path and its repr names it (they named ``ckpt_events._events`` and the like)."""
    value = PUBLIC[path]
    home = value.__module__
    assert not _private(home), f"{path} is named {home}.{value.__qualname__}"
    assert getattr(importlib.import_module(home), value.__qualname__) is value
    assert pickle.loads(pickle.dumps(value)) is value
    assert _pickled_paths(value) == {f"{home}.{value.__qualname__}"}
    if type(value) is type:  # an enum's repr is <enum 'Kind'>
        assert repr(value) == f"<class '{home}.{value.__qualname__}'>"


@pytest.mark.parametrize("path", sorted(p for p, v in PUBLIC.items() if inspect.isclass(v)))
def test_a_public_struct_still_builds_its_decoder(path: str) -> None:
    """msgspec reads a Struct's annotations in its ``__module__``; named by the lazy public
    module, it raised NameError (``ErrorCode``) unless they were resolved at home first."""
    value = PUBLIC[path]
    if issubclass(value, msgspec.Struct):
        msgspec.json.Decoder(value)


def test_the_event_union_decodes_an_encoded_event() -> None:
    """The union's decoder builds and round-trips the events of an operation."""
    decoder = msgspec.json.Decoder(ckpt_events.CheckpointEvent)
    for event in anyio.run(_emitted):
        assert decoder.decode(msgspec.json.encode(event)) == event


@pytest.mark.parametrize("name", [c.__name__ for c in EXCEPTIONS])
def test_a_pickled_error_names_public_paths_only(name: str) -> None:
    """A pickled error names its class and nothing private (each named
    ``ckpt_events._errors._rebuilt``), and comes back with its message and fields."""
    error = _sample(name)
    assert _private_paths(error) == set()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(error, protocol))
        assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)


def test_a_traceback_names_the_public_error() -> None:
    """The last line of a traceback is ``ckpt_events.UnknownNameError: ...``."""
    error = _sample("UnknownNameError")
    assert traceback.format_exception_only(error)[0].startswith("ckpt_events.UnknownNameError: ")


def test_an_emitted_event_pickles_equal_under_public_paths() -> None:
    """Emitted events (enums inside, ids, times) round-trip equal, and their pickles name
    ``ckpt_events`` and ``ckpt_events.vocab`` (they named ``_events`` and ``_vocab``)."""
    events = [e for e in anyio.run(_emitted) if getattr(e, "attributes", None) is None]
    assert {type(e).__name__ for e in events} >= {"OperationStarted", "StepStarted", "OperationFinished"}
    for event in events:
        assert pickle.loads(pickle.dumps(event)) == event
        assert _private_paths(event) == set(), type(event).__name__


class _PickledBy030:
    """Reduces as 0.3.0's errors did: through ``ckpt_events._errors._rebuilt``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_errors._rebuilt, (type(self.error), self.error.args), vars(self.error) or None)


def test_an_error_pickled_by_0_3_0_still_loads() -> None:
    """A stored pickle naming the old private rebuilder loads into the same error."""
    error = _sample("UnknownNameError")
    data = pickle.dumps(_PickledBy030(error))
    assert b"ckpt_events._errors" in data
    back = pickle.loads(data)
    assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)
