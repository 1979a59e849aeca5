"""``ckpt-events bench`` runs the suites that drive the participants, end to end, at their quick size.

Benchmarks assert no times; this only keeps them runnable as the participants change (the
workers suite once broke silently when checkpoints had to lie under a participant's root).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("suite", ["scale", "workers"])
def test_a_quick_suite_runs_and_writes_its_figures(suite: str, tmp_path: Path) -> None:
    """The suite exits 0, prints its table and writes its figures as JSON."""
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "participants.cli.main",
            "bench",
            "--quick",
            "--only",
            suite,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ratios measured side by side" in run.stdout
    assert suite in json.loads(out.read_text())["figures"]
