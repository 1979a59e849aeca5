"""bench_scale measures each size in a child process that never imports from the working directory,
and prints its on/off ratios with their spread."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks import bench_scale, report
from ckpt_events.benchmarks.bench_scale import measure_in_child, run
from ckpt_events.benchmarks.spread import Ratio


def test_a_size_is_measured_from_a_directory_holding_modules_named_like_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a directory with a sinks.py and a participants.py that raise on import, the child measures."""
    for name in ("sinks", "participants"):
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the working directory {name}.py was imported')\n"
        )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    figures = measure_in_child(10, 1)
    assert figures["off"]["commit_s"] > 0
    assert figures["events_per_run"] > 0


@pytest.mark.slow
def test_the_ratio_rows_print_their_spread_over_the_pairs() -> None:
    """The on/off rows printed the median of the pairs alone ("1.009"), never "no measurable
    difference" for pairs straddling 1.0: they are ratios with their spread now."""
    result = run(quick=True)
    for what, value, _target, _met in result["rows"][:2]:
        assert "all sinks / off" in what
        assert isinstance(value, Ratio) and value.rounds == result["pairs"]
        assert report.cell(value).endswith(f"over {result['pairs']} rounds)")


def test_the_growth_rows_target_says_the_limit_its_verdict_uses() -> None:
    """The target said "<= 16" while a growth of 17.0 was met: it names the limit it checks."""
    what, _, target, met = bench_scale.growth_row(16_000, 1_000, 17.0)
    assert "16,000" in what and "1,000" in what
    limit = float(target.split()[1])
    assert limit == pytest.approx(17.6)
    assert met
    assert bench_scale.growth_row(16_000, 1_000, limit)[3]
    assert not bench_scale.growth_row(16_000, 1_000, limit * 1.001)[3]
