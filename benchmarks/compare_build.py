"""Commit+restore of N rollouts, sinks off: this checkout against another build, side by side.

The issue-11 target "commit+restore at 64k rollouts vs today's build <= 0.7" compares two
checkouts, which one process cannot import at once. This driver runs each build's own scale
benchmark (``benchmarks/bench_scale.py``'s ``_one(n, telemetry, workdir)``, which every build
since the first scale suite has, with the same signature and figures) in a fresh interpreter
per run, with no sink subscribed, and alternates the builds (old-new, new-old, ...) so a
drift in machine load hits both. Each child first runs a small warm-up round (imports, first
requests), then the timed one; the figures are the medians over the runs, and the ratio is
candidate / baseline per pair, median of the pairs.

Each build runs under its own interpreter: ``<checkout>/.venv/bin/python`` when there is
one, else this interpreter, with the checkout first on ``PYTHONPATH``. To compare with the
build a round started from::

    git worktree add --detach ../base <commit>
    (cd ../base && python3 -m venv .venv && .venv/bin/pip install -e '.[dev]')
    python -m ckpt_events.benchmarks.compare_build --baseline ../base --size 64000 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from ckpt_events.participants.cli.command import given_path

from . import report

DEFAULT_JSON: Final = Path(__file__).parent / "results" / "compare_build.json"
TARGET_RATIO: Final = 0.7
_WARMUP: Final = 1_000
_TIMEOUT: Final = 1800.0

# Run inside the build under test, so it imports only that build's code.
_CHILD: Final = """
import json, sys, tempfile
from pathlib import Path
import anyio
from ckpt_events.benchmarks import bench_scale
n, warmup = int(sys.argv[1]), int(sys.argv[2])
base = "/dev/shm" if Path("/dev/shm").is_dir() else None
with tempfile.TemporaryDirectory(prefix="ckpt-compare-", dir=base) as tmp:
    if warmup:
        anyio.run(bench_scale._one, warmup, False, Path(tmp))
    got = anyio.run(bench_scale._one, n, False, Path(tmp))
print(json.dumps({k: got[k] for k in ("commit_s", "restore_s", "cpu_s", "records")}))
"""


def interpreter(checkout: Path) -> str:
    """The checkout's own venv interpreter when it has one, else this one."""
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run_build(checkout: Path, n: int, warmup: int = _WARMUP) -> dict[str, Any]:
    """One commit+restore of ``n`` rollouts in a fresh interpreter of ``checkout``; its figures."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [interpreter(checkout), "-c", _CHILD, str(n), str(warmup)],
        cwd=checkout,
        env=env,
        capture_output=True,
        check=False,
        timeout=_TIMEOUT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: the scale run failed:\n{done.stderr.decode()[-4000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    figures["total_s"] = figures["commit_s"] + figures["restore_s"]
    return figures


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def compare(baseline: Path, candidate: Path, n: int, pairs: int, warmup: int = _WARMUP) -> dict[str, Any]:
    """``pairs`` runs of each build, alternated; medians and per-pair ratios (candidate / baseline)."""
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "candidate": []}
    ratios: dict[str, list[float]] = {"total_s": [], "cpu_s": []}
    builds = {"baseline": baseline, "candidate": candidate}
    for pair in range(pairs):
        order = ("baseline", "candidate") if pair % 2 == 0 else ("candidate", "baseline")
        got = {name: run_build(builds[name], n, warmup) for name in order}
        for name, figures in got.items():
            runs[name].append(figures)
            print(f"pair {pair + 1} {name}: {json.dumps(figures)}", file=sys.stderr)
        for key, values in ratios.items():
            values.append(got["candidate"][key] / got["baseline"][key])
    keys = ("commit_s", "restore_s", "total_s", "cpu_s")
    return {
        "size": n,
        "pairs": pairs,
        "builds": {name: str(path) for name, path in builds.items()},
        "median": {name: {k: _median([r[k] for r in runs[name]]) for k in keys} for name in runs},
        "ratio_pairs": ratios,
        "ratio_median_of_pairs": {k: _median(v) for k, v in ratios.items()},
        "runs": runs,
    }


def rows(result: dict[str, Any]) -> list[Any]:
    """The table: medians in ms for each build, then the ratios against the target."""
    n, pairs = result["size"], result["pairs"]
    out: list[Any] = []
    for name in ("baseline", "candidate"):
        m = result["median"][name]
        out.append(
            (
                f"{n:,} rollouts, {name}: commit / restore / total wall / CPU ms (median)",
                f"{m['commit_s'] * 1e3:.0f} / {m['restore_s'] * 1e3:.0f} / "
                f"{m['total_s'] * 1e3:.0f} / {m['cpu_s'] * 1e3:.0f}",
                "",
                None,
            )
        )
    for key, what in (("total_s", "wall"), ("cpu_s", "CPU")):
        ratio = result["ratio_median_of_pairs"][key]
        out.append(
            (
                f"{n:,} rollouts: commit+restore {what}, candidate / baseline (median of {pairs} pairs)",
                ratio,
                f"<= {TARGET_RATIO}",
                ratio <= TARGET_RATIO,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--baseline", type=given_path, required=True, help="the other build's checkout")
    parser.add_argument(
        "--candidate",
        type=given_path,
        default=Path(__file__).resolve().parent.parent,
        help="default: this one",
    )
    parser.add_argument("--size", type=int, default=64_000, help="rollouts (default 64,000)")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each build, alternated")
    parser.add_argument("--warmup", type=int, default=_WARMUP, help="rollouts of each child's warm-up round")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    args = parser.parse_args(argv)
    result = compare(args.baseline.resolve(), args.candidate.resolve(), args.size, args.pairs, args.warmup)
    table = rows(result)
    report.publish(
        "commit+restore, sinks off: this build against another, side by side", table, args.json, result
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
