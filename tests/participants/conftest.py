"""Demo runs shared by the participant tests that read the same run."""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.participants.demo_runs import DemoRun, demo_run


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing): one xdist worker at a time."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def two_worker_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``demo --workers 2 --jsonl`` (servers in process, two worker processes each), run once:
    its merged log and each worker's own log (``logs/*.w<i>``) are read by several tests.

    Its readers are in different files, which ``--dist loadfile`` may give to different xdist
    workers: the first to ask runs the demo into the session's shared temporary folder and
    pickles the result there; the others wait on the lock and read it (32 s of demo saved)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # not under xdist: this process is the session
        return demo_run(tmp_path_factory.mktemp("two-worker-demo"), workers=2)
    shared = tmp_path_factory.getbasetemp().parent
    workdir, saved = shared / "two-worker-demo", shared / "two-worker-demo.pickle"
    with _locked(shared / "two-worker-demo.lock"):
        if saved.exists():
            run: DemoRun = pickle.loads(saved.read_bytes())
            return run
        workdir.mkdir()
        run = demo_run(workdir, workers=2)
        saved.write_bytes(pickle.dumps(run))
        return run
