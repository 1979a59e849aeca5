"""A user's own ``sinks``, ``participants`` and ``benchmarks`` packages in the working directory never
shadow ours: ours are ``ckpt_events.*``, and child processes never import from the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

#: The installed command, as a user runs it (its own path holds no working directory).
COMMAND = Path(sys.executable).parent / "ckpt-events"
HOSTILE = ("sinks", "participants", "benchmarks")


@pytest.mark.parametrize(
    "mode", [["--processes"], ["--workers", "2"]], ids=["server processes", "worker processes"]
)
def test_demo_runs_from_a_directory_holding_modules_named_like_ours(tmp_path: Path, mode: list[str]) -> None:
    """From a directory with sinks/, participants/ and benchmarks/ packages that raise on import,
    the demo succeeds."""
    for name in HOSTILE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('the working directory\\'s {name} package was imported')\n"
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
