"""Trends across a run, folded checkpoint by checkpoint as the logs stream past.

Per (participant kind, operation, step), each checkpoint contributes one value: its slowest
instance's milliseconds (what the checkpoint waited for). From those: count, p50, p95, max,
and three flags in words:

* a checkpoint slower than twice the run's median checkpoint;
* a straggler: an instance that is the slowest of its kind (by its operations' total time in
  a checkpoint) in more than two thirds of at least ``MIN_CHECKPOINTS`` checkpoints, and whose
  median total is at least ``STRAGGLER_RATIO`` times the others' and ``STRAGGLER_MIN_MS``
  above it (so a coin flip between two equal instances is not called one);
* a growing step: Spearman's rank correlation of its time with checkpoint order at least
  ``GROWTH_RHO`` and the last third's median over the first third's above ``GROWTH_RATIO``
  and ``GROWTH_MIN_MS`` above it (sub-millisecond jitter is not a trend).

Memory: a few numbers per key and per instance per checkpoint (``array`` of doubles), never
the events.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ckpt_events import Kind, OperationFinished, StepFinished
from participants.cli.durations import Key, percentile
from participants.cli.report_model import who_of

__all__ = ["Trend", "Trends", "spearman"]

MIN_CHECKPOINTS: Final = 3
STRAGGLER_RATIO: Final = 1.2
STRAGGLER_MIN_MS: Final = 1.0
GROWTH_RHO: Final = 0.6
GROWTH_RATIO: Final = 1.5
GROWTH_MIN_MS: Final = 1.0
SLOW_FACTOR: Final = 2.0


@dataclass(frozen=True)
class Trend:
    """One key's figures over the run's checkpoints."""

    key: Key
    count: int
    p50: float
    p95: float
    max: float
    rho: float | None

    @property
    def name(self) -> str:
        kind, operation, step = self.key
        return f"{kind} {operation}" + (f".{step}" if step else "")


def spearman(values: Sequence[float]) -> float | None:
    """Spearman's rank correlation of ``values`` with their order (ties ranked by their mean);
    ``None`` for fewer than 3 values or constant ones."""
    n = len(values)
    if n < 3:
        return None
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    mean = (n - 1) / 2
    cov = sum((r - mean) * (i - mean) for i, r in enumerate(ranks))
    var_r = sum((r - mean) ** 2 for r in ranks)
    var_i = sum((i - mean) ** 2 for i in range(n))
    return None if var_r == 0 else cov / (var_r * var_i) ** 0.5


@dataclass
class Trends:
    """Per-checkpoint values folded from each finished trace (see the module docstring)."""

    #: Per key: (root start, slowest instance's ms) per checkpoint.
    starts: dict[Key, array[int]] = field(default_factory=dict)
    values: dict[Key, array[float]] = field(default_factory=dict)
    #: Per participant kind: per instance, its operations' total ms in each checkpoint it
    #: took part in; and who was the slowest of the kind, per checkpoint.
    totals: dict[str, dict[str, array[float]]] = field(default_factory=dict)
    slowest_of_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    checkpoints_of_kind: dict[str, int] = field(default_factory=dict)
    rows: list[Any] = field(default_factory=list)
    _pending_id: str | None = None
    _pending: dict[str, dict[str, float]] = field(default_factory=dict)

    def add_trace(self, spans: Sequence[Any], root: Any) -> None:
        """Fold one finished trace (its finished spans) under ``root``."""
        operation_of: dict[int, str] = {}
        per_key: dict[Key, dict[str, float]] = {}
        per_kind: dict[str, dict[str, float]] = {}
        for e in spans:
            if isinstance(e, OperationFinished):
                operation_of[e.span_id] = e.operation.value
        for e in spans:
            if isinstance(e, OperationFinished):
                key: Key = (e.kind.value, e.operation.value, "")
            elif isinstance(e, StepFinished):
                key = (e.kind.value, operation_of.get(e.parent_span_id or 0, "?"), e.step.value)
            else:
                continue
            if e.kind is Kind.CONTROLLER:
                continue
            who = who_of(e.kind, e.instance, e.worker)
            ms = (e.end_ns - e.start_ns) / 1e6
            mine = per_key.setdefault(key, {})
            mine[who] = mine.get(who, 0.0) + ms
            if isinstance(e, OperationFinished):
                of_kind = per_kind.setdefault(e.kind.value, {})
                of_kind[who] = of_kind.get(who, 0.0) + ms
        for key, by_who in per_key.items():
            self.starts.setdefault(key, array("q")).append(root.start_ns)
            self.values.setdefault(key, array("d")).append(max(by_who.values()))
        # A bare coordinator's checkpoint is one trace per coordinate operation: the totals
        # are per checkpoint id, summed until the next checkpoint's root ends.
        if root.checkpoint_id != self._pending_id:
            self._flush()
            self._pending_id = root.checkpoint_id
        for kind, by_who in per_kind.items():
            pending = self._pending.setdefault(kind, {})
            for who, ms in by_who.items():
                pending[who] = pending.get(who, 0.0) + ms

    def _flush(self) -> None:
        for kind, by_who in self._pending.items():
            totals = self.totals.setdefault(kind, {})
            for who, ms in by_who.items():
                totals.setdefault(who, array("d")).append(ms)
            if len(by_who) > 1:
                winner = max(by_who, key=lambda w: by_who[w])
                counts = self.slowest_of_kind.setdefault(kind, {})
                counts[winner] = counts.get(winner, 0) + 1
                self.checkpoints_of_kind[kind] = self.checkpoints_of_kind.get(kind, 0) + 1
        self._pending = {}
        self._pending_id = None

    def table(self) -> list[Trend]:
        """One ``Trend`` per key, sorted by kind, operation, step."""
        out = []
        for key in sorted(self.values):
            ordered = [v for _, v in sorted(zip(self.starts[key], self.values[key], strict=True))]
            out.append(
                Trend(
                    key,
                    len(ordered),
                    percentile(ordered, 0.5),
                    percentile(ordered, 0.95),
                    max(ordered),
                    spearman(ordered),
                )
            )
        return out

    def flags(self) -> list[str]:
        """The run's flags in words: slow checkpoints, stragglers, growing steps."""
        self._flush()
        out: list[str] = []
        done = [r for r in self.rows if r.published and r.what == "checkpoint" and r.ms is not None]
        if len(done) >= MIN_CHECKPOINTS:
            middle = statistics.median(r.ms for r in done)
            done_ids = {id(r) for r in done}
            for number, row in enumerate(self.rows, 1):
                if id(row) in done_ids and row.ms > SLOW_FACTOR * middle:
                    out.append(
                        f"checkpoint #{number} {row.checkpoint_id} took {row.ms:.1f} ms, "
                        f"{row.ms / middle:.1f}x the run's median {middle:.1f} ms"
                    )
        for kind, counts in sorted(self.slowest_of_kind.items()):
            total = self.checkpoints_of_kind[kind]
            who, wins = max(counts.items(), key=lambda kv: kv[1])
            if total < MIN_CHECKPOINTS or wins * 3 <= total * 2:
                continue
            mine = statistics.median(self.totals[kind][who])
            others = [statistics.median(v) for w, v in self.totals[kind].items() if w != who]
            rest = statistics.median(others) if others else 0.0
            if rest > 0 and mine >= STRAGGLER_RATIO * rest and mine - rest >= STRAGGLER_MIN_MS:
                out.append(
                    f"straggler: {who} was the slowest {kind} in {wins} of {total} checkpoints "
                    f"(median {mine:.1f} ms in its operations, {mine / rest:.1f}x the other {kind}s')"
                )
        for trend in self.table():
            if trend.count < 2 * MIN_CHECKPOINTS or trend.rho is None or trend.rho < GROWTH_RHO:
                continue
            ordered = [v for _, v in sorted(zip(self.starts[trend.key], self.values[trend.key], strict=True))]
            third = len(ordered) // 3
            first, last = statistics.median(ordered[:third]), statistics.median(ordered[-third:])
            if first > 0 and last / first > GROWTH_RATIO and last - first >= GROWTH_MIN_MS:
                out.append(
                    f"growing: {trend.name} went from a median {first:.1f} ms in the first third of the "
                    f"run to {last:.1f} ms in the last (x{last / first:.1f}, "
                    f"rank correlation {trend.rho:.2f})"
                )
        return out
