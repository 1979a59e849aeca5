"""spread.Ratio: a ratio over rounds carries its spread; one whose spread covers 1.0 says so."""

from __future__ import annotations

import json

import pytest

from ckpt_events.benchmarks import report
from ckpt_events.benchmarks.spread import NO_DIFFERENCE, Ratio


def test_a_spread_covering_one_prints_no_measurable_difference() -> None:
    """Median 0.929 with rounds on both sides of 1.0: no number below 1 is printed."""
    ratio = Ratio([0.929, 0.90, 1.04])
    assert ratio.covers_one
    assert str(ratio) == f"{NO_DIFFERENCE} (0.900-1.040 over 3 rounds)"
    assert "0.929" not in str(ratio)


def test_a_spread_clear_of_one_prints_the_median_and_spread() -> None:
    """Every round above 1.0: the median, then the lowest and highest round."""
    ratio = Ratio.paired([115.0, 110.0, 121.0], [100.0, 100.0, 100.0])
    assert not ratio.covers_one
    assert str(ratio) == "1.150 (1.100-1.210 over 3 rounds)"
    assert ratio.figures() == {
        "median": pytest.approx(1.15),
        "low": pytest.approx(1.10),
        "high": pytest.approx(1.21),
        "rounds": 3,
        "no_measurable_difference": False,
    }


def test_a_spread_touching_one_is_covered() -> None:
    """A round at exactly 1.0 is inside the spread."""
    assert Ratio([1.0, 1.2, 1.3]).covers_one
    assert not Ratio([0.7, 0.8, 0.99]).covers_one


def test_one_round_has_no_spread_and_says_so() -> None:
    """A single round cannot tell a difference from noise; it prints its figure and says so."""
    ratio = Ratio([0.95])
    assert not ratio.covers_one
    assert str(ratio) == "0.950 (1 round: no spread)"
    with pytest.raises(ValueError, match="at least one round"):
        Ratio([])


def test_a_ratio_is_still_a_number_for_targets_and_json() -> None:
    """Targets compare it as the median; JSON writes the median as a number."""
    ratio = report.paired_ratio([1.2, 1.1, 1.3], [1.0, 1.0, 1.0])
    assert isinstance(ratio, Ratio)
    assert ratio <= 1.25 and not ratio <= 1.15
    assert json.loads(json.dumps({"r": ratio})) == {"r": pytest.approx(1.2)}
    assert "over 3 rounds" in report.markdown_table([("r", ratio, "<= 1.25", True)])
