"""Shared pytest setup: async tests run on anyio's asyncio backend (``anyio_mode = "auto"``).

Our own pytest plugin (``ckpt_events.sinks.pytest_plugin``, registered under ``pytest11``) is loaded by
its entry point, as in any project that installs ckpt-events; ``pytester`` tests the plugin.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
