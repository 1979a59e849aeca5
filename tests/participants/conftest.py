"""Demo runs shared by the participant tests that read the same run."""

from __future__ import annotations

import pytest

from tests.participants.demo_runs import DemoRun, demo_run


@pytest.fixture(scope="session")
def two_worker_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``demo --workers 2 --jsonl`` (servers in process, two worker processes each), run once:
    its merged log and each worker's own log (``logs/*.w<i>``) are read by several tests."""
    return demo_run(tmp_path_factory.mktemp("two-worker-demo"), workers=2)
