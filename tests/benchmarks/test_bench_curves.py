"""The cost-against-scale suite: the exponent fit, its words, the picture, and real points."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import anyio
import pytest

from ckpt_events.benchmarks import bench_curves
from ckpt_events.benchmarks.bench_curves import curves_svg
from ckpt_events.benchmarks.growth import (
    FAIL_EXPONENT,
    MAX_EXPONENT,
    exponent_row,
    fit_exponent,
    growth,
    growth_exponent,
    verdict,
)

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


#: Each curve's sizes, full and quick: the verdict is checked at every size a run measures.
ALL_SIZES = [sizes for full, quick, _, _ in bench_curves.CURVES.values() for sizes in (full, quick)]


@pytest.mark.parametrize("sizes", ALL_SIZES, ids=str)
@pytest.mark.parametrize(
    "cost",
    [
        lambda n, top: 1.0 + 20.0 * (n / top) ** 2,  # a fixed cost, then a quadratic step overtakes it
        lambda n, top: 0.2 + n / top + 6.0 * (n / top) ** 2,  # quadratic 6x the linear work at the top
        lambda n, top: 1e-9 * n * n,
    ],
    ids=["fixed-then-quadratic", "linear-plus-quadratic", "quadratic"],
)
def test_a_quadratic_step_fails_at_every_curves_sizes(sizes: tuple[int, ...], cost: object) -> None:
    """The log-log slope over every point averaged the smallest size's fixed cost into the
    exponent: a fixed cost that a quadratic step overtook at the largest size read 0.38 over the
    report's sizes ("sub-linear (a fixed cost dominates)") and 1.07 over the watch's ("linear"),
    and passed. The verdict sets the fixed cost aside and fails both."""
    points = {n: [cost(n, sizes[-1])] * 2 for n in sizes}  # type: ignore[operator]
    what, _, _, met = exponent_row("report", "checkpoints", points)
    assert met is False and "(a failure)" in what


@pytest.mark.parametrize("sizes", ALL_SIZES, ids=str)
@pytest.mark.parametrize(
    "cost",
    [
        lambda n: 3e-6 * n,
        lambda n: 0.5 + 1e-6 * n,  # a fixed cost and linear work
        lambda n: 1e-7 * n * math.log2(n + 1),
        lambda n: 1e-7 * n * (1 + math.log(n)),
    ],
    ids=["linear", "fixed-plus-linear", "n-log2-n", "n-ln-n"],
)
def test_linear_and_n_log_n_pass_at_every_curves_sizes(sizes: tuple[int, ...], cost: object) -> None:
    """n log n reads more than 1 at small sizes (about 1.4 over 4, 8, 16 participants, where the
    log-log slope read 1.50: "faster than n log n (a failure)"); it passes at every curve's sizes."""
    points = {n: [cost(n)] * 2 for n in sizes}  # type: ignore[operator]
    what, value, _, met = exponent_row("watch", "participants", points)
    assert met is True, (what, value)
    assert "failure" not in what


def test_the_exponent_is_stated_with_its_range_and_unknown_when_it_straddles() -> None:
    """The exponent alone was printed ("0.730 ... sub-linear" for a quick run whose largest point
    ran from 278 to 662 ms): now with its range over the repeats, and a range on both sides of
    the failure line is unknown (met None), neither a pass nor a failure."""
    quick_run = {500: [0.0609, 0.0648], 2000: [0.0742, 0.0922], 8000: [0.2784, 0.6620]}
    what, value, target, met = exponent_row("rollouts", "rollouts", quick_run)
    assert met is None and "unknown" in what
    low, high = (float(x) for x in value.split("(")[1].rstrip(")").split("-"))
    assert low < float(target.removeprefix("< ")) <= high
    quiet = {10: [0.0101, 0.0105, 0.0140], 1000: [0.5871, 0.7057, 0.8590], 10000: [5.8428, 6.1499, 6.8789]}
    what, value, _, met = exponent_row("report", "checkpoints", quiet)
    assert met is True and value == "0.94 (0.83-1.08)" and "linear or n log n" in what


def test_the_growth_exponent_sets_the_fixed_cost_aside() -> None:
    sizes = (10, 1_000, 10_000)
    for k in (0.5, 1.0, 1.5, 2.0, 3.0):
        assert growth_exponent([(n, 7.0 + 1e-4 * n**k) for n in sizes]) == pytest.approx(k, abs=1e-6)
    assert growth_exponent([(1, 1.0), (2, 1.0), (4, 1.0)]) == 0.0  # no growth
    assert growth_exponent([(1, 1.0), (2, 0.9), (4, 5.0)]) == MAX_EXPONENT
    with pytest.raises(ValueError):
        growth_exponent([(1, 1.0), (4, 2.0)])


class _LoadBurst:
    """A fake ``measure``: each size's own cost (the fleet's standalone figures: 1 -> 0.30 s,
    2 -> 0.34 s, 4 -> 0.42 s, a fixed cost and linear work), on a clock that the timings advance,
    and a burst of load over ``[start, start + width)`` of that clock that slows every timing it
    overlaps ``factor`` times."""

    def __init__(self, start: float, width: float, factor: float = 3.0) -> None:
        self.start, self.end, self.factor = start, start + width, factor
        self.clock = 0.0
        self.calls: list[tuple[str, int]] = []

    @staticmethod
    def cost(size: int) -> float:
        return 0.26 + 0.04 * size

    def __call__(self, curve: str, size: int) -> float:
        seconds = self.cost(size)
        if self.clock < self.end and self.clock + seconds > self.start:
            seconds *= self.factor
        self.clock += seconds
        self.calls.append((curve, size))
        return seconds


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_a_load_burst_is_never_a_false_failure_the_repeats_are_interleaved(quick: bool) -> None:
    """The repeats of one point ran back to back in one process: a burst of load over them moved
    all of them together, and a quick run read 325.1-325.9 ms at 4 servers per kind against 114 ms
    at 2, "a failure" (2.73, range 2.10-3.79), where standalone runs read 0.34 s and 0.42 s. Now
    round r measures every size once before round r + 1: a burst as long as all the largest
    point's repeats, anywhere in the run, widens the spreads of several sizes and never fails
    linear work. (The same burst on back-to-back repeats fails it: the control.)"""
    full, small, _, _ = bench_curves.CURVES["fleet"]
    sizes, repeats = (small, 2) if quick else (full, 3)
    top = _LoadBurst.cost(sizes[-1])
    width = 3.0 * top * repeats  # the slowed largest point's repeats, back to back
    total = 3.0 * sum(_LoadBurst.cost(n) for n in sizes) * repeats
    false_failures_back_to_back = 0
    for step in range(201):
        start = total * step / 200 - width / 2
        burst = _LoadBurst(start, width)
        result = bench_curves.run(quick=quick, curves=("fleet",), measure=burst)
        fleet = result["curves"]["fleet"]
        assert fleet["met"] is not False, (start, fleet["points"], fleet["low"], fleet["high"])
        # Every round measures every size once, each round's order rotated from the last.
        called = [size for _, size in burst.calls]
        rounds = [called[i : i + len(sizes)] for i in range(0, len(called), len(sizes))]
        assert len(rounds) == repeats and all(sorted(r) == sorted(sizes) for r in rounds)
        assert rounds == fleet["order"] and len({tuple(r) for r in rounds}) == repeats
        assert all(len(fleet["points"][str(n)]) == repeats for n in sizes)
        # The control: the same burst over each point's repeats run back to back.
        back_to_back = _LoadBurst(start, width)
        points = {n: [back_to_back("fleet", n) for _ in range(repeats)] for n in sizes}
        false_failures_back_to_back += verdict(points)["met"] is False
    assert false_failures_back_to_back > 0


def test_the_schedule_rotates_every_size_through_every_place() -> None:
    assert bench_curves.schedule((1, 4, 16), 3) == [[1, 4, 16], [4, 16, 1], [16, 1, 4]]
    assert bench_curves.schedule((1, 2, 4), 2) == [[1, 2, 4], [2, 4, 1]]
    assert bench_curves.schedule((1, 2, 4), 4)[3] == [1, 2, 4]


def test_a_point_in_its_process_is_timed_after_its_warm_up() -> None:
    """The first run in a fresh process pays its imports and first calls: it is run untimed."""
    timings = bench_curves.measure_point("report", 10, 2, warmups=1)
    assert len(timings) == 2 and all(0 < t < 10 for t in timings)


@pytest.mark.parametrize(
    ("timings", "said"),
    [
        (
            [float("nan"), 0.05],
            "has a timing of nan s",
        ),  # compared false everywhere: read "sub-linear", a pass
        ([float("inf"), 0.05], "has a timing of inf s"),  # read "4+", a failure
        ([0.0, 0.05], "has a timing of 0.0 s"),
        ([-0.01, 0.05], "has a timing of -0.01 s"),
        ([], "has no timing"),
    ],
    ids=["nan", "inf", "zero", "negative", "none"],
)
@pytest.mark.parametrize("where", [1_000, 64_000], ids=["smallest", "largest"])
def test_a_timing_no_verdict_can_use_is_a_precise_error(timings: list[float], said: str, where: int) -> None:
    """A NaN at the largest point read "0.00 (0.00-0.00) sub-linear", met: a false pass; an
    infinite one "4+", a false failure. Now a ValueError naming the point and the timing."""
    points = {n: [1e-6 * n, 1.1e-6 * n] for n in SIZES}
    points[where] = timings
    with pytest.raises(ValueError, match=f"the point at {where:,} {said}"):
        verdict(points)


@pytest.mark.parametrize("points", [{1_000: [0.1, 0.1], 64_000: [3.0, 3.1]}, {}])
def test_a_verdict_needs_three_sizes(points: dict[int, list[float]]) -> None:
    with pytest.raises(ValueError, match="three or more sizes"):
        verdict(points)


def test_a_run_keeps_every_curve_when_one_has_a_nan_timing() -> None:
    """A NaN from a child (JSON carries it) read as a passed curve; now that curve is unknown,
    says why, keeps its timings, and the other curves keep their verdicts."""

    def measure(curve: str, size: int) -> float:
        return float("nan") if (curve, size) == ("report", 10_000) else 1e-4 * size

    result = bench_curves.run(curves=("report", "fleet"), measure=measure)
    report_curve, fleet = result["curves"]["report"], result["curves"]["fleet"]
    assert report_curve["met"] is None and "timing of nan s" in report_curve["error"]
    assert len(report_curve["points"]["10000"]) == 3 and report_curve["points"]["10"] == [1e-3] * 3
    assert fleet["met"] is True and fleet["exponent"] == pytest.approx(1.0)
    last_report_row = [row for row in result["rows"] if row[0].startswith("report:")][-1]
    assert "unknown" in last_report_row[0] and last_report_row[3] is None


def test_one_timing_per_point_is_unknown_with_no_range() -> None:
    """One timing a point printed "2.00 (2.00-2.00)", a range with no repeats behind it, and a
    failure (or a pass) the noise could have made: now unknown, and no range is claimed."""
    for cost in (lambda n: 1e-9 * n * n, lambda n: 3e-6 * n):
        what, value, _, met = exponent_row("rollouts", "rollouts", {n: [cost(n)] for n in SIZES})
        assert met is None and "one timing" in what and value.endswith("(no range: one timing)")
    said = verdict({n: [1e-9 * n * n] for n in SIZES})
    assert said["low"] is None and said["high"] is None and said["single"] == list(SIZES)


def test_a_quick_run_says_its_figures_are_quick() -> None:
    """A --quick table was titled as the full run's, its JSON without a word of it."""
    result = bench_curves.run(quick=True, curves=("fleet",), measure=lambda curve, size: 0.1 * size)
    assert (
        result["quick"] is True
        and bench_curves.run(curves=("fleet",), measure=lambda c, n: n)["quick"] is False
    )
    assert "--quick" in bench_curves.title(quick=True) and "quick" not in bench_curves.title(quick=False)


def test_the_picture_says_each_curves_verdict_and_why_one_has_none() -> None:
    """A failed curve's panel read "report: exponent 2.00", as a passed one's does."""
    figures = {
        "curves": {
            "report": {
                "unit": "checkpoints",
                "points": {"10": [0.01], "1000": [90.0]},
                "exponent": 2.0,
                "met": False,
            },
            "watch": {
                "unit": "participants",
                "points": {"4": [0.01], "64": [0.9]},
                "exponent": 1.5,
                "met": None,
            },
            "fleet": {
                "unit": "servers",
                "points": {"1": [float("nan")]},
                "met": None,
                "error": "a <nan> timing",
            },
        }
    }
    svg = curves_svg(figures)
    assert "report: exponent 2.00, a failure" in svg and "watch: exponent 1.50, unknown" in svg
    assert "fleet: unknown" in svg and "a &lt;nan&gt; timing" in svg and svg.count("<polyline") == 4


def test_png_without_chromium_is_refused_in_one_line_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Chromium, --png failed after the whole run (minutes), naming a fix the suite
    does not have ("or write .html/.svg"); now it is refused before anything is measured."""
    monkeypatch.delenv("CKPT_EVENTS_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    out = tmp_path / "figures.json"
    began = time.perf_counter()
    code = bench_curves.main(["--only", "report", "--png", str(tmp_path / "c.png"), "--json", str(out)])
    assert code == 1 and time.perf_counter() - began < 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Chromium found" in err and "nothing was measured" in err
    assert not out.exists()


def test_a_point_past_its_time_is_stopped_in_one_line() -> None:
    """A child ran up to 1,800 s a timing (36 timings in a full run) before subprocess said
    "Command [...] timed out"; past ``timeout_s`` it is killed and the point named."""
    began = time.perf_counter()
    with pytest.raises(bench_curves.PointError) as caught:
        bench_curves.measure_point("report", 10, 1, timeout_s=0.2)
    assert time.perf_counter() - began < 2
    assert str(caught.value).startswith("report at 10: 1 timing(s) and 1 warm-up(s) ran past 0.2 s")
    assert "\n" not in str(caught.value)


def test_a_failed_point_makes_its_curve_unknown_and_the_run_goes_on() -> None:
    """A point that failed or ran past its time failed the whole run, every curve measured
    before it lost; now its curve is unknown with why, and keeps the timings it has."""

    def measure(curve: str, size: int) -> float:
        if (curve, size) == ("report", 1_000):
            raise bench_curves.PointError("report at 1,000: ran past 300 s and was stopped")
        return 1e-4 * size

    result = bench_curves.run(curves=("report", "fleet"), measure=measure)
    report_curve = result["curves"]["report"]
    assert report_curve["met"] is None and "ran past 300 s" in report_curve["error"]
    assert report_curve["points"] == {"10": [1e-3]}  # round 0 measured 10, then 1,000 failed
    assert result["curves"]["fleet"]["met"] is True
    report_rows = [row for row in result["rows"] if row[0].startswith("report:")]
    assert len(report_rows) == 2 and "unknown, report at 1,000: ran past" in report_rows[-1][0]


def test_the_last_panels_top_label_fits_in_the_picture() -> None:
    """A one-curve picture (``--only report``) cut its top point's "1,134 ms" at "1,134 m": the
    picture was exactly its panels wide. At 11 px sans-serif a glyph is under 7 px wide."""
    figures = {
        "curves": {
            "report": {
                "unit": "checkpoints",
                "points": {"10": [0.011], "100": [0.1], "1000": [100.005]},
                "exponent": 1.0,
            }
        }
    }
    svg = curves_svg(figures)
    width = float(re.search(r'<svg [^>]*width="([0-9.]+)"', svg).group(1))  # type: ignore[union-attr]
    x, label = re.findall(r'<text x="([0-9.]+)" y="[0-9.-]+">([^<]* ms)</text>', svg)[-1]
    assert label == "100,005 ms" and float(x) + 7 * len(label) <= width
