"""Shared pytest setup: async tests run on anyio's asyncio backend (``anyio_mode = "auto"``).

Our own pytest plugin (``ckpt_events.sinks.pytest_plugin``, registered under ``pytest11``) is loaded by
its entry point, as in any project that installs ckpt-events; ``pytester`` tests the plugin.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

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


#: How far the process's stamp offset may be from the wall clock's after a test.
_OFFSET_SLACK_NS = 1_000_000_000


@pytest.fixture(autouse=True)
def _stamps_on_the_wall_clock() -> Iterator[None]:
    """A test that steps the stamps' clock (``CALIBRATION``, patched to stand for an NTP step)
    puts it back: left an hour or 5 s off, it stepped back at the next calibration, inside the
    next test of the process, whose log then read "out of time order" (an order-dependent
    failure three files away). The test that left it is the one that fails, and the next starts
    on the wall clock."""
    yield
    true_offset = time.time_ns() - time.monotonic_ns()
    if CALIBRATION.due >= 0 and abs(CALIBRATION.offset - true_offset) > _OFFSET_SLACK_NS:
        CALIBRATION.due = -1  # the next stamp calibrates again
        pytest.fail(
            f"this test left the stamps' clock {(CALIBRATION.offset - true_offset) / 1e9:+.1f} s off the "
            "wall clock: put CALIBRATION.offset back (monkeypatch.setattr(calibration, 'offset', ...))"
        )
