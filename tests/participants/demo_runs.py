"""Small demo runs for the tests that read a run's logs, started from fixtures (see ``conftest``)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import anyio
from rich.console import Console

from ckpt_events.participants.cli.demo.runner import DemoOptions, DemoResult, run_demo


@dataclass(frozen=True)
class DemoRun:
    """A finished demo: how it ran, its result, its ``--jsonl`` log, its work folder, its output."""

    processes: bool
    workers: int
    result: DemoResult
    log: Path
    workdir: Path
    printed: str


def demo_run(workdir: Path, *, processes: bool = False, workers: int = 1) -> DemoRun:
    """A small demo (12 rollouts of 2 steps, 4 at a time) with a JSON-lines log, in ``workdir``.

    It runs its own event loop: call it from a fixture, never from inside an async test."""
    log = workdir / "demo.jsonl"
    options = DemoOptions(
        rollouts=12, steps=2, concurrency=4, processes=processes, workers=workers, jsonl=log, workdir=workdir
    )
    out = io.StringIO()
    result = anyio.run(run_demo, options, Console(file=out, width=170))
    return DemoRun(processes, workers, result, log, workdir, out.getvalue())
