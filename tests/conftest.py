"""Shared pytest setup: async tests run on anyio's asyncio backend (``anyio_mode = "auto"``).

Our own pytest plugin (``ckpt_events.sinks.pytest_plugin``, registered under ``pytest11``) is loaded by
its entry point, as in any project that installs ckpt-events; ``pytester`` tests the plugin.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_events._wallclock import CALIBRATION

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


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache of this test process's ``mypy_strict`` runs (tests/typecheck.py); a process
    of its own under xdist, so no two mypy runs write one cache at once."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture(autouse=True)
def _stamps_on_the_wall_clock() -> Iterator[None]:
    """Each test starts with the stamps' offset read afresh (``CALIBRATION``): a test that patched
    it (standing for an NTP step) and did not put it back, or the machine's own clock stepped
    (a CI virtual machine's moved 4 s within one run), left the process's stamps seconds off
    ``time.time_ns()`` until the next calibration, inside the next test, whose log then read "out
    of time order" or whose stamps fell before a ``time.time_ns()`` read just before them."""
    CALIBRATION.due = -1  # the first stamp of the test calibrates, taking the offset as it is now
    yield
