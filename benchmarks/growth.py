"""How a timing grows with its size: the exponent ``k`` of ``time = c + a * size**k`` through a
curve's points, its range over the repeats, and the verdict (linear or n log n, a failure, or
unknown), shared by the cost-against-scale suite (``bench_curves``) and the scale suite
(``bench_scale``). The why of each choice is in ``bench_curves``' docstring."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

#: An exponent at or above this fails the curve: work that grows faster than n log n.
FAIL_EXPONENT: Final = 1.5


def fit_exponent(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of log(time) on log(size): how time grows with size."""
    if len(points) < 2 or any(size <= 0 or seconds <= 0 for size, seconds in points):
        raise ValueError(f"an exponent needs two or more positive points, got {points!r}")
    xs = [math.log(size) for size, _ in points]
    ys = [math.log(seconds) for _, seconds in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("an exponent needs two or more distinct sizes")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def growth(exponent: float) -> str:
    """The exponent in words, as the table prints it."""
    if exponent >= FAIL_EXPONENT:
        return "faster than n log n (a failure)"
    if exponent > 1.25:
        return "n log n or a little worse"
    if exponent >= 0.8:
        return "linear"
    return "sub-linear (a fixed cost dominates)"


#: The largest exponent ``growth_exponent`` tells apart; a steeper curve reads this.
MAX_EXPONENT: Final = 4.0


def growth_exponent(points: Sequence[tuple[float, float]]) -> float:
    """``k`` of ``time = c + a * size**k`` through the smallest point and the two largest: how
    the work grows once the fixed cost (the smallest point's time) is set aside. 0.0 when the
    time does not grow from the middle point to the largest; at most ``MAX_EXPONENT``."""
    if len(points) < 3 or any(size <= 0 or seconds <= 0 for size, seconds in points):
        raise ValueError(f"a growth exponent needs three or more positive points, got {points!r}")
    ordered = sorted(points)
    (n1, t1), (n2, t2), (n3, t3) = ordered[0], ordered[-2], ordered[-1]
    if not n1 < n2 < n3:
        raise ValueError(f"a growth exponent needs three distinct sizes, got {points!r}")
    if t3 <= t2 or t3 <= t1:
        return 0.0
    if t2 <= t1:
        # Nothing measurable between the smallest and the middle point, all of it at the top.
        return MAX_EXPONENT

    def ratio(k: float) -> float:
        # (n3^k - n1^k) / (n2^k - n1^k), in logs so large sizes do not overflow; rises with k.
        return math.expm1(k * math.log(n3 / n1)) / math.expm1(k * math.log(n2 / n1))

    wanted = (t3 - t1) / (t2 - t1)
    if wanted <= math.log(n3 / n1) / math.log(n2 / n1):  # the ratio's limit as k -> 0
        return 0.0
    if wanted >= ratio(MAX_EXPONENT):
        return MAX_EXPONENT
    low, high = 0.0, MAX_EXPONENT
    for _ in range(60):  # bisection: 4 / 2**60, far below the 0.01 printed
        middle = (low + high) / 2
        if ratio(middle) < wanted:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def fail_exponent(sizes: Sequence[int]) -> float:
    """The ``growth_exponent`` at and above which a curve over ``sizes`` fails: nearer quadratic
    (2.0) than n log n at these sizes (``n * (1 + ln n)``, so a size of 1 has a log too), and
    never below ``FAIL_EXPONENT``."""
    n_log_n = growth_exponent([(n, n * (1 + math.log(n))) for n in sizes])
    return max(FAIL_EXPONENT, (n_log_n + 2.0) / 2)


def check_points(points: Mapping[int, Sequence[float]]) -> None:
    """``ValueError`` naming the first point a verdict cannot use: fewer than three sizes, a size
    that is not a positive whole number, a point with no timing, a timing that is not a positive,
    finite number of seconds. (A NaN timing compared false everywhere and read "sub-linear", a
    pass; an infinite one read "4+", a failure.)"""
    if len(points) < 3:
        raise ValueError(f"a curve's verdict needs three or more sizes, got {sorted(points)!r}")
    for size, timings in sorted(points.items()):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size {size!r} is not a positive whole number")
        if not timings:
            raise ValueError(f"the point at {size:,} has no timing")
        for seconds in timings:
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(
                    f"the point at {size:,} has a timing of {seconds!r} s: not a positive, finite time"
                )


def verdict(points: Mapping[int, Sequence[float]]) -> dict[str, Any]:
    """The growth of a curve from each size's timings: ``exponent`` (of the medians), its
    ``low``-``high`` range over the repeats (every point anywhere in its spread), ``fail_at``
    and ``met``: True when the whole range is below ``fail_at``, False when the whole range is at
    or above it, None (unknown) when the spread allows either, or when a point has a single
    timing (``single``: no spread to tell the noise by; ``low`` and ``high`` are then None).
    ``ValueError`` (``check_points``) for timings no verdict can use."""
    check_points(points)
    sizes = sorted(points)
    single = [n for n in sizes if len(points[n]) < 2]
    if single:
        exponent = growth_exponent([(n, statistics.median(points[n])) for n in sizes])
        fail_at = fail_exponent(sizes)
        return {
            "exponent": exponent,
            "low": None,
            "high": None,
            "fail_at": fail_at,
            "met": None,
            "single": single,
        }
    exponent = growth_exponent([(n, statistics.median(points[n])) for n in sizes])
    corners = [
        growth_exponent(list(zip(sizes, choice, strict=True)))
        for choice in itertools.product(*((min(points[n]), max(points[n])) for n in sizes))
    ]
    low, high = min([*corners, exponent]), max([*corners, exponent])
    fail_at = fail_exponent(sizes)
    met: bool | None = None  # the spread allows either side: unknown
    if high < fail_at:
        met = True
    elif low >= fail_at:
        met = False
    return {"exponent": exponent, "low": low, "high": high, "fail_at": fail_at, "met": met}


def exponent_text(exponent: float) -> str:
    """An exponent as the table prints it: two decimals, or "4+" at ``MAX_EXPONENT``."""
    return f"{MAX_EXPONENT:.0f}+" if exponent >= MAX_EXPONENT else f"{exponent:.2f}"


def exponent_row(curve: str, unit: str, points: Mapping[int, Sequence[float]]) -> tuple[Any, ...]:
    """The table's row for a curve's growth: its exponent with the range, the target, met."""
    said = verdict(points)
    exponent, fail_at = said["exponent"], said["fail_at"]
    if said.get("single"):
        at = ", ".join(f"{n:,}" for n in said["single"])
        words = f"unknown: one timing at {at}, no spread to judge the noise by"
        value = f"{exponent_text(exponent)} (no range: one timing)"
        what = f"{curve}: exponent of time on {unit} beyond the fixed cost, range over the repeats ({words})"
        return (what, value, f"< {fail_at:.2f}", None)
    if said["met"] is None:
        words = f"unknown: the repeats' spread allows either side of {fail_at:.2f}"
    elif exponent >= fail_at:
        words = "faster than n log n (a failure)"
    elif exponent < 0.8:
        words = "sub-linear"
    else:
        words = "linear or n log n"
    value = f"{exponent_text(exponent)} ({exponent_text(said['low'])}-{exponent_text(said['high'])})"
    what = f"{curve}: exponent of time on {unit} beyond the fixed cost, range over the repeats ({words})"
    return (what, value, f"< {fail_at:.2f}", said["met"])
