"""The cost-against-scale suite: the exponent fit, its words, the picture, and real points."""

from __future__ import annotations

import math

import anyio
import pytest

from ckpt_events.benchmarks import bench_curves
from ckpt_events.benchmarks.bench_curves import FAIL_EXPONENT, curves_svg, fit_exponent, growth

SIZES = (1_000, 16_000, 64_000)


@pytest.mark.parametrize(
    ("cost", "low", "high"),
    [
        (lambda n: 3e-6 * n, 0.99, 1.01),
        (lambda n: 1e-7 * n * math.log(n), 1.05, 1.2),
        (lambda n: 1e-9 * n * n, 1.99, 2.01),
        (lambda n: 0.5 + 1e-9 * n, 0.0, 0.2),
    ],
    ids=["linear", "n-log-n", "quadratic", "fixed-cost"],
)
def test_the_exponent_is_the_log_log_slope(cost: object, low: float, high: float) -> None:
    exponent = fit_exponent([(n, cost(n)) for n in SIZES])  # type: ignore[operator]
    assert low <= exponent <= high


def test_the_words_fail_only_what_grows_faster_than_n_log_n() -> None:
    assert growth(1.0) == "linear"
    assert growth(1.11) == "linear"
    assert growth(1.3) == "n log n or a little worse"
    assert "failure" in growth(2.0) and "failure" in growth(FAIL_EXPONENT)
    assert growth(0.2).startswith("sub-linear")


@pytest.mark.parametrize("points", [[(10, 1.0)], [(10, 1.0), (10, 2.0)], [(0, 1.0), (10, 2.0)]])
def test_an_exponent_needs_two_distinct_positive_sizes(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError):
        fit_exponent(points)


def test_the_picture_has_a_panel_per_curve_with_its_points_and_reference() -> None:
    figures = {
        "curves": {
            "rollouts": {"unit": "rollouts", "points": {"1000": [0.1], "16000": [1.5]}, "exponent": 0.98},
            "report": {"unit": "checkpoints <&>", "points": {"10": [0.01], "1000": [0.9]}, "exponent": 0.98},
        }
    }
    svg = curves_svg(figures)
    assert svg.count("<polyline") == 4  # measured and linear reference, per panel
    assert svg.count("<circle") == 4
    assert "rollouts: exponent 0.98" in svg and "checkpoints &lt;&amp;&gt; (log)" in svg


@pytest.mark.parametrize(("curve", "size"), [("fleet", 1), ("fleet", 2), ("report", 10)])
def test_a_point_is_measured_from_the_real_work(curve: str, size: int) -> None:
    """The fleet point runs a checkpoint and a restore across 4 x size participants (a failed
    prepare or restore raises); the report point checks the overview has a row per checkpoint."""
    seconds = anyio.run(bench_curves.POINTS[curve], size)
    assert 0 < seconds < 60
