"""The user's runtime environment at its edges, with real processes: stdout closed (``>&-``), a
low ``ulimit -n``, uvloop logging a loop error that carries no exception, and spans with
multi-megabyte attributes sent to a collector that bounds its requests as the OpenTelemetry
Collector does (20 MiB). Each was a traceback, a lost log line or a whole batch of spans lost."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ckpt_events.participants.server.limits import ACCEPT_LOGGERS, log_resource_exhaustion_once

@pytest.fixture
def exhaustion_filter() -> Iterator[logging.Filter]:
    """``serve``'s one-line filter for running out of descriptors, removed again afterwards."""
    installed = log_resource_exhaustion_once()
    try:
        yield installed
    finally:
        for name in ACCEPT_LOGGERS:
            logging.getLogger(name).removeFilter(installed)


def test_a_uvloop_error_without_an_exception_is_logged_as_itself(
    exhaustion_filter: logging.Filter, caplog: pytest.LogCaptureFixture
) -> None:
    """uvloop logs a loop error that has no exception (its "Task was destroyed but it is
    pending!") with ``exc_info=False``: the filter indexed it, so the line was lost and
    replaced by "Exception in default exception handler" and a TypeError traceback."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            loop.call_exception_handler({"message": "a loop error with no exception"})
    finally:
        loop.close()
    assert [r.getMessage() for r in caplog.records] == ["a loop error with no exception"]
