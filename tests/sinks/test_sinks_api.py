"""The public surface of sinks: sorted __all__, every name importable, nothing private."""

from __future__ import annotations

import importlib
from pathlib import Path

import msgspec
import pytest

from tests.ckpt_events.test_bus import refused


@pytest.mark.parametrize(
    "module",
    [
        "ckpt_events.sinks",
        "ckpt_events.sinks.jsonl",
        "ckpt_events.sinks.otel",
        "ckpt_events.sinks.otlp",
        "ckpt_events.sinks.replay",
    ],
)
def test_all_is_sorted_and_complete(module: str) -> None:
    """__all__ is sorted (constants first, as ruff sorts it), public, and every name in it exists."""
    mod = importlib.import_module(module)
    names = list(mod.__all__)
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))  # constants first
    assert all(not name.startswith("_") for name in names)
    assert all(hasattr(mod, name) for name in names)


def test_importing_sinks_does_not_import_the_otel_sdk_eagerly() -> None:
    """configure() and the JSON-lines sink work without importing OpenTelemetry at import."""
    import subprocess
    import sys

    code = "import sys, sinks; print('opentelemetry.sdk.trace' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "module",
    ["ckpt_events.sinks", "ckpt_events.sinks.jsonl", "ckpt_events.sinks.otel", "ckpt_events.sinks.otlp"],
)
def test_every_lazy_name_is_listed_and_resolves_to_its_home(module: str) -> None:
    """The lazy table and __all__ hold the same names; each resolves to the object of its home module."""
    mod = importlib.import_module(module)
    assert sorted(mod._HOMES) == sorted(mod.__all__)  # __all__'s order: test_all_is_sorted_and_complete
    for name, home in mod._HOMES.items():
        value = getattr(mod, name)
        if name == "replay" and isinstance(value, type(mod)):
            # Importing the documented submodule sinks.replay rebinds sinks.replay to it (as it did
            # when the names were imported eagerly); the function is then ckpt_events.sinks.replay.replay.
            value = value.replay
        assert value is getattr(importlib.import_module(home), name)
    assert set(mod.__all__) <= set(dir(mod))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_importing_sinks_imports_neither_the_bus_nor_an_http_stack() -> None:
    """A bare ``import sinks`` loads no other module of ours (but the core's lazy-name helper and
    the core's package, itself lazy) and no http.client."""
    import subprocess
    import sys

    code = (
        "import sys, sinks; "
        "print(sorted(m for m in sys.modules if m.startswith(('ckpt_events', 'sinks.', 'http.client'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "['ckpt_events', 'ckpt_events._lazy']"


def test_sinks_replay_is_callable_whatever_was_imported_first(tmp_path: Path) -> None:
    """``ckpt_events.sinks.replay(log, sink)``, as the docs call it, once something imported the
    submodule ``ckpt_events.sinks.replay`` (``ckpt-events report`` does), which rebinds the
    package's name to the module: it raised "'module' object is not callable"."""
    import subprocess
    import sys

    log = tmp_path / "events.jsonl"
    log.write_bytes(msgspec.json.encode(refused(1)) + b"\n")
    code = (
        "import anyio, ckpt_events.sinks, ckpt_events.sinks.replay\n"
        "from ckpt_events.sinks import replay\n"
        "from ckpt_events.testing import MemorySink\n"
        "sink = MemorySink()\n"
        f"result = anyio.run(ckpt_events.sinks.replay, {str(log)!r}, sink)\n"
        f"again = anyio.run(replay, {str(log)!r}, sink)\n"
        "print(result.events, again.events, len(sink.events))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1", "2"]
