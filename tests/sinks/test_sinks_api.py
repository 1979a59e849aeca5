"""The public surface of sinks: sorted __all__, every name importable, nothing private."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("module", ["sinks", "sinks.jsonl", "sinks.otel", "sinks.replay"])
def test_all_is_sorted_and_complete(module: str) -> None:
    """__all__ is sorted, public, and every name in it exists."""
    mod = importlib.import_module(module)
    names = list(mod.__all__)
    assert names == sorted(names)
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
