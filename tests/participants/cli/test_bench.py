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
            "ckpt_events.participants.cli.main",
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


def test_the_build_comparison_runs_this_checkout_against_itself(tmp_path: Path) -> None:
    """compare_build runs each build's own scale round in a child and writes per-pair ratios."""
    out = tmp_path / "compare.json"
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        [sys.executable, "-m", "ckpt_events.benchmarks.compare_build", "--baseline", str(root)]
        + ["--size", "200", "--pairs", "2", "--warmup", "0", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "candidate / baseline (median of 2 pairs)" in run.stdout
    figures = json.loads(out.read_text())["figures"]
    assert figures["size"] == 200 and len(figures["ratio_pairs"]["total_s"]) == 2
    for build in ("baseline", "candidate"):
        assert [r["records"] for r in figures["runs"][build]] == [
            {"environment-0": 200, "model-0": 200, "agent-0": 200, "resources-0": 200}
        ] * 2


def test_every_suite_in_the_benchmarks_folder_can_be_chosen() -> None:
    """``--only`` offers exactly the ``bench_*.py`` suites (a new suite cannot be left out), but
    ``bench_app``, which measures the user's own app and runs with ``--app``."""
    from ckpt_events import benchmarks

    folder = Path(benchmarks.__file__).parent
    found = sorted(p.stem.removeprefix("bench_") for p in folder.glob("bench_*.py"))
    assert sorted(benchmarks.SUITES) == [name for name in found if name != "app"]
