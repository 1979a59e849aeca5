"""Shared pytest setup: async tests run on anyio's asyncio backend (``anyio_mode = "auto"``).

Our own pytest plugin (``ckpt_events.sinks.pytest_plugin``, registered under ``pytest11``) is loaded by
its entry point, as in any project that installs ckpt-events; ``pytester`` tests the plugin.
"""

from __future__ import annotations

import os

import pytest

# The command line's tables are as wide as the terminal, or $COLUMNS when piped (170 without
# it). A runner's own terminal size must not reach them: pytest-xdist's workers set COLUMNS=80
# and LINES=24, and four report tests then read truncated cells. A test that wants a width
# sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

pytest_plugins = ["pytester"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
