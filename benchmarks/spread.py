"""A ratio measured over rounds, with its spread: how every ratio row of the benchmarks prints.

Each round measures the variants back to back, so a drift in the machine's speed cancels out
of that round's ratio; the figure is the median over the rounds and its spread the lowest and
the highest round. A ratio whose spread covers 1.0 is no measurable difference, and prints so:
never a number below 1 that the noise made (a quick run once printed "no sink /
uninstrumented = 0.929").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["NO_DIFFERENCE", "Ratio"]

#: What a ratio whose spread covers 1.0 prints instead of its median.
NO_DIFFERENCE = "no measurable difference"


class Ratio(float):
    """The median over rounds of a ratio (a ``float``), with ``low``, ``high`` and ``rounds``.

    A ``float``, so a row's target (``ratio <= 1.15``) and the JSON figures read it as a number;
    ``str()`` is what the table prints: ``"1.153 (1.102-1.210 over 3 rounds)"``, or
    ``"no measurable difference (0.962-1.041 over 3 rounds)"`` when the spread covers 1.0.
    """

    __slots__ = ("high", "low", "rounds")

    low: float
    high: float
    rounds: int

    def __new__(cls, per_round: Sequence[float]) -> Ratio:
        if not per_round:
            raise ValueError("a ratio needs at least one round")
        self = super().__new__(cls, statistics.median(per_round))
        self.low = min(per_round)
        self.high = max(per_round)
        self.rounds = len(per_round)
        return self

    @classmethod
    def paired(cls, values: Sequence[float], baseline: Sequence[float]) -> Ratio:
        """``values[r] / baseline[r]`` in each round ``r`` (measured back to back), over the rounds."""
        return cls([x / b for x, b in zip(values, baseline, strict=True)])

    @property
    def covers_one(self) -> bool:
        """Whether 1.0 lies within the spread: no measurable difference (needs two rounds)."""
        return self.rounds >= 2 and self.low <= 1.0 <= self.high

    def __str__(self) -> str:
        if self.rounds < 2:
            return f"{float(self):.3f} (1 round: no spread)"
        spread = f"({self.low:.3f}-{self.high:.3f} over {self.rounds} rounds)"
        return f"{NO_DIFFERENCE} {spread}" if self.covers_one else f"{float(self):.3f} {spread}"

    def __repr__(self) -> str:
        return f"Ratio({float(self)!r}, low={self.low!r}, high={self.high!r}, rounds={self.rounds})"

    def figures(self) -> dict[str, Any]:
        """The ratio for JSON: ``median``, ``low``, ``high``, ``rounds``, ``no_measurable_difference``."""
        return {
            "median": float(self),
            "low": self.low,
            "high": self.high,
            "rounds": self.rounds,
            "no_measurable_difference": self.covers_one,
        }
