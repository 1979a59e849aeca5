"""Child processes never import from the working directory: a user's own sinks.py cannot shadow ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

#: The installed command, as a user runs it (its own path holds no working directory).
COMMAND = Path(sys.executable).parent / "ckpt-events"
HOSTILE = ("sinks", "participants")


@pytest.mark.parametrize(
    "mode", [["--processes"], ["--workers", "2"]], ids=["server processes", "worker processes"]
)
def test_demo_runs_from_a_directory_holding_modules_named_like_ours(tmp_path: Path, mode: list[str]) -> None:
    """From a directory with a sinks.py and a participants.py that raise on import, the demo succeeds."""
    for name in HOSTILE:
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the working directory {name}.py was imported')\n"
        )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_", "PYTHONSAFE"))}
    run = subprocess.run(
        [str(COMMAND), "demo", *mode, "--rollouts", "2", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "working directory" not in run.stderr and "Traceback" not in run.stderr
    assert "ok no rollout ran twice" in run.stdout
