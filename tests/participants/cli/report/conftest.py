"""The report tests' one real run with aborted checkpoints, shared: it takes about 6 s (a 3.5 s
lease wait among them) and seven tests read it, each writing its own logs from the events."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.participants.cli.report.test_run_report import _run


@pytest.fixture(scope="session")
def _aborted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return tuple(anyio.run(_run, tmp_path_factory.mktemp("aborted-run")))


@pytest.fixture
def aborted_run(_aborted_run: tuple[Any, ...]) -> list[Any]:
    """``_run``'s events (c1, c2 published; c-blocked not ready; c-lease's lease expired), a
    list of this test's own; the events are frozen structs."""
    return list(_aborted_run)
