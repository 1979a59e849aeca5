"""bench_scale measures each size in a child process that never imports from the working directory,
and prints its on/off ratios with their spread, and how the time grows with the rollouts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_events.benchmarks import report
from ckpt_events.benchmarks.bench_scale import growth_rows, measure_in_child, run, title
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
    assert result["quick"] is True  # the JSON says its figures are a quick run's
    for what, value, _target, _met in result["rows"][:2]:
        assert "all sinks / off" in what
        assert isinstance(value, Ratio) and value.rounds == result["pairs"]
        assert report.cell(value).endswith(f"over {result['pairs']} rounds)")


def _sizes(cost: Callable[[int], float], sizes: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    """A scale run's per-size figures with off runs of ``cost(n)`` (split 40/60 between commit
    and restore) and a 2% spread over three runs."""
    figures: dict[int, dict[str, Any]] = {}
    for n in sizes:
        totals = [cost(n) * f for f in (0.99, 1.0, 1.01)]
        figures[n] = {"off": {"commit_s": 0.4 * cost(n), "restore_s": 0.6 * cost(n)}, "off_totals_s": totals}
    return figures


def test_a_fixed_cost_with_quadratic_work_is_never_read_as_linear() -> None:
    """The growth row was "time at 16,000 / at 1,000 rollouts (linear: 16)", met up to 17.6
    against a printed "<= 16": 0.1 s fixed with quadratic work on top (1.0 s at 16,000) read
    10.6, "yes". The verdict is now the exponent beyond the fixed cost, and fails it."""
    rows = growth_rows(_sizes(lambda n: 0.1 + (n / 16_000) ** 2, (1_000, 4_000, 16_000)))
    ratio, verdict_row = rows
    assert ratio[1] == pytest.approx(1.1 / (0.1 + (1 / 16) ** 2)) and ratio[2:] == ("", None)
    assert verdict_row[3] is False and "(a failure)" in verdict_row[0]
    linear = growth_rows(_sizes(lambda n: 0.02 + 3e-5 * n, (1_000, 4_000, 16_000)))[1]
    assert linear[3] is True and "linear or n log n" in linear[0]


def test_two_sizes_give_no_growth_verdict() -> None:
    """A quick run measures 1,000 and 4,000 rollouts: two points cannot set a fixed cost apart."""
    rows = growth_rows(_sizes(lambda n: 1e-9 * n * n, (1_000, 4_000)))
    assert rows[1] == (
        "scale: growth exponent: unknown, two sizes (a full run measures three)",
        None,
        "",
        None,
    )


def test_a_quick_runs_title_says_so() -> None:
    """A --quick table (1,000 and 4,000 rollouts, 5 pairs) was titled as the full run's."""
    assert "--quick" in title(quick=True) and "not the full run's figures" in title(quick=True)
    assert "quick" not in title(quick=False)
