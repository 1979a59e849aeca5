"""Trends across a run, folded checkpoint by checkpoint as the logs stream past.

Per (participant kind, operation, step), each checkpoint contributes one value: its slowest
instance's milliseconds (what the checkpoint waited for). From those: count, p50, p95, max,
and three flags in words:

* a checkpoint slower than twice the run's median checkpoint, and more than ``SLOW_MIN_MS`` over it (a
  clock that stamps whole milliseconds makes a run of sub-millisecond checkpoints a median of
  0.0 ms and one of them 1.0 ms: no slower checkpoint, and no ratio: it divided by zero);
* a straggler: an instance that is the slowest of its kind (by its operations' total time in
  a checkpoint) in more than two thirds of at least ``MIN_CHECKPOINTS`` checkpoints that did
  their work (an aborted one's times are its cause's: a server stalled to the deadline; a
  restore's, named by the id it restored, are no checkpoint's), a share
  that luck among equals gives with a chance under ``STRAGGLER_CHANCE``, or, where a few are
  slow together and take turns at the top, among its ``r`` slowest (``r`` under half the kind's
  instances, luck judged at ``r`` in that many); and whose gap to its
  peers (per checkpoint, its total minus the median of the others' in that checkpoint, so a
  load that slows everyone at once cancels) has a median at least ``STRAGGLER_RATIO`` times
  the peers' level, ``STRAGGLER_MIN_MS``, and the gaps' own spread (times ``STRAGGLER_SPREAD``);
* a growing step: its time against checkpoint order has a significant Spearman rank
  correlation (``rho * sqrt(n - 1)`` at least ``GROWTH_Z``, one-sided p ~ 0.01: seven
  checkpoints at the least), and the growth over the run of a Theil-Sen line (the median of
  the pairwise slopes, which outliers do not move) is at least ``GROWTH_MIN_MS``, takes the
  step to ``GROWTH_RATIO`` times its fitted start, and is ``GROWTH_SPREAD`` times its jitter
  (the robust spread of the changes from one checkpoint to the next).

The thresholds were set on real fleets run 20 times on a loaded two-core machine (healthy runs
reached a growth 4x their jitter, a write drifting 8 -> 27 ms with the machine's load, and a
straggler gap 1.36x its peers; a step slowed 15 ms more at every checkpoint reached 22x at the
least, an instance slowed by 50 ms 1.9x), and on synthetic runs with jitter, outliers and a
drifting load (none of 600 healthy ones flagged; an instance 2.5x its peers always is, 2x
over 30 checkpoints too; a step growing 5-fold over 300 checkpoints always is, over 8 only
about one in three: a short run needs a larger, cleaner change).

Memory: a few numbers per key and per instance per checkpoint (``array`` of doubles), never
the events.
"""

from __future__ import annotations

import itertools
import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.report.durations import Key, percentile
from ckpt_events.participants.cli.report.events import FinishedSpan, duration_ns, who_wrote
from ckpt_events.participants.cli.text import short_id
from ckpt_events.vocab import CollectionAction, Kind, Operation, Outcome

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import RunRow

__all__ = ["Growth", "Trend", "Trends", "binomial_tail", "growth", "spearman", "theil_sen"]

MIN_CHECKPOINTS: Final = 3
SLOW_FACTOR: Final = 2.0
SLOW_MIN_MS: Final = 1.0
STRAGGLER_CHANCE: Final = 0.05
STRAGGLER_RATIO: Final = 1.5
STRAGGLER_SPREAD: Final = 1.0
STRAGGLER_MIN_MS: Final = 1.0
#: Past this many stragglers of one kind, one flag says how many and names the first (as the
#: breakdown folds a kind past ``timeline.FLEET`` participants): a fleet of 5,000 whose first
#: third was slower in each of 3 checkpoints was 1,617 flags, 744 kB of a run page.
NAMED_STRAGGLERS: Final = 8
GROWTH_Z: Final = 2.33
GROWTH_RATIO: Final = 2.0
GROWTH_SPREAD: Final = 6.0
GROWTH_MIN_MS: Final = 1.0
#: A longer run is judged on the medians of this many consecutive blocks of checkpoints: a
#: block's median is less noisy than one checkpoint (so a long run needs a smaller growth to
#: stand out of its jitter), and Theil-Sen is quadratic in the points.
GROWTH_MAX_POINTS: Final = 16
#: Ids of checkpoints that did not do their work kept, the latest (``Trends._undone_ids``).
_UNDONE_KEPT: Final = 4096
#: The median absolute deviation times this estimates a normal spread's standard deviation.
_MAD_TO_SIGMA: Final = 1.4826


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


def theil_sen(values: Sequence[float], at: Sequence[float] | None = None) -> tuple[float, float]:
    """The Theil-Sen line through ``values`` placed ``at`` (by default their order): (intercept,
    slope), the slope the median of all pairwise slopes, the intercept the median of
    ``v - slope * x``. Needs at least 2 values."""
    xs = range(len(values)) if at is None else at
    n = len(values)
    slopes = [(values[j] - values[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median(slopes)
    return statistics.median(v - slope * x for x, v in zip(xs, values, strict=True)), slope


def spread(values: Sequence[float]) -> float:
    """A robust standard deviation: the median absolute deviation, scaled to a normal's."""
    middle = statistics.median(values)
    return _MAD_TO_SIGMA * statistics.median(abs(v - middle) for v in values)


def binomial_tail(wins: int, trials: int, chance: float) -> float:
    """P(at least ``wins`` of ``trials``) when each is won with probability ``chance``."""
    if wins <= 0:
        return 1.0
    log_p, log_q = math.log(chance), math.log1p(-chance)
    total = 0.0
    for x in range(wins, trials + 1):
        log_comb = math.lgamma(trials + 1) - math.lgamma(x + 1) - math.lgamma(trials - x + 1)
        total += math.exp(log_comb + x * log_p + (trials - x) * log_q)
    return min(1.0, total)


@dataclass(frozen=True)
class Growth:
    """A step's growth through the run (see the module docstring for when it is one)."""

    #: The fitted line's value at the first and the last checkpoint, and its slope per
    #: checkpoint (ms).
    start: float
    end: float
    slope: float
    #: The growth over the jitter between consecutive points (``inf`` with no jitter).
    over_jitter: float
    rho: float
    points: int


def _blocks(values: Sequence[float], most: int) -> tuple[list[float], list[float]]:
    """At most ``most`` points: the medians of consecutive blocks, each at its block's middle."""
    if len(values) <= most:
        return list(values), [float(i) for i in range(len(values))]
    edges = [round(b * len(values) / most) for b in range(most + 1)]
    pairs = itertools.pairwise(edges)
    return [statistics.median(values[a:z]) for a, z in pairs], [
        (a + z - 1) / 2 for a, z in itertools.pairwise(edges)
    ]


def growth(values: Sequence[float]) -> Growth | None:
    """The growth of ``values`` (one per checkpoint, in order) if it is one, else ``None``."""
    points, at = _blocks(values, GROWTH_MAX_POINTS)
    n = len(points)
    rho = spearman(points)
    if rho is None or rho * math.sqrt(n - 1) < GROWTH_Z:
        return None
    intercept, slope = theil_sen(points, at)
    grown = slope * (len(values) - 1)
    start, end = intercept, intercept + grown
    if grown < GROWTH_MIN_MS or (start > 0 and end < GROWTH_RATIO * start):
        return None
    jitter = spread([b - a for a, b in itertools.pairwise(points)]) / math.sqrt(2)
    over = grown / jitter if jitter > 0 else math.inf
    if over < GROWTH_SPREAD:
        return None
    return Growth(start, end, slope, over, rho, n)


def _undone(root: FinishedSpan) -> bool:
    """Whether ``root`` ended without doing its work: in error, a collection not published, a
    prepare not prepared (the overview's aborted and failed rows)."""
    match root:
        case CollectionFinished(published=False) | CoordinateFinished(prepared=False):
            return True
        case _:
            return root.outcome == Outcome.ERROR


def _is_restore(root: FinishedSpan) -> bool:
    """Whether ``root`` is a restore's: a collection restore or a bare coordinator's."""
    match root:
        case (
            CollectionFinished(action=CollectionAction.RESTORE)
            | CoordinateFinished(operation=Operation.RESTORE)
        ):
            return True
        case _:
            return False


def _median_without(ordered: Sequence[float], position: int) -> float:
    """The median of sorted ``ordered`` without its element at ``position`` (2+ elements)."""
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < position else i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


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
    #: Per kind, per instance, its place in each checkpoint with 2+ of the kind (1: the slowest).
    places: dict[str, dict[str, array[int]]] = field(default_factory=dict)
    checkpoints_of_kind: dict[str, int] = field(default_factory=dict)
    #: Per kind, per instance, in each checkpoint with 2+ of the kind: its total minus the
    #: median of the others' (its gap), and that median (its peers' level); and the fewest
    #: instances of the kind in such a checkpoint (what a share won by luck is judged by).
    gaps: dict[str, dict[str, array[float]]] = field(default_factory=dict)
    peers: dict[str, dict[str, array[float]]] = field(default_factory=dict)
    fewest_of_kind: dict[str, int] = field(default_factory=dict)
    rows: list[RunRow] = field(default_factory=list)
    _pending_id: str | None = None
    _pending: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Kinds of the pending checkpoint with an operation of unknown duration: no totals.
    _pending_unknown: set[str] = field(default_factory=set)
    #: Whether a root of the pending checkpoint ended without doing its work (``_undone``).
    _pending_undone: bool = False
    #: Whether the pending group is a restore of ``_pending_id``, not that checkpoint.
    _pending_restore: bool = False
    #: The ids of checkpoints that did not do their work, the latest ``_UNDONE_KEPT``: a bare
    #: coordinator's resume after an aborted prepare is a root of its own, folded after the
    #: checkpoints that followed (it ranked the stalled server again).
    _undone_ids: dict[str, None] = field(default_factory=dict)

    def add_trace(self, spans: Sequence[FinishedSpan], root: FinishedSpan) -> None:
        """Fold one finished trace (its finished spans) under ``root``."""
        operation_of: dict[int, str] = {}
        per_key: dict[Key, dict[str, float]] = {}
        per_kind: dict[str, dict[str, float]] = {}
        # Keys and kinds with a span of unknown duration (its clock went back during it): the
        # checkpoint's slowest instance, or an instance's total, is unknown, so left out.
        unknown: set[Key | str] = set()
        for e in spans:
            if isinstance(e, OperationFinished):
                operation_of[e.span_id] = str(e.operation)
        for e in spans:
            # A straggler is judged among the participants of a kind: a worker's share of an
            # operation (a few ms) is no peer of a participant's whole one, which waits for it.
            match e:
                case OperationFinished():
                    key: Key = (str(e.kind), str(e.operation), "")
                    whole = e.worker is None
                case StepFinished():
                    key = (str(e.kind), operation_of.get(e.parent_span_id or 0, "?"), str(e.step))
                    whole = False
                case _:
                    continue
            if e.kind == Kind.CONTROLLER:
                continue
            length = duration_ns(e)
            if length is None:
                unknown.add(key)
                if whole:
                    unknown.add(str(e.kind))
                continue
            ms = length / 1e6
            writer = who_wrote(e)
            mine = per_key.setdefault(key, {})
            mine[writer] = mine.get(writer, 0.0) + ms
            if whole:
                of_kind = per_kind.setdefault(str(e.kind), {})
                of_kind[writer] = of_kind.get(writer, 0.0) + ms
        for key, by_who in per_key.items():
            if key in unknown:
                continue
            self.starts.setdefault(key, array("q")).append(root.start_ns)
            self.values.setdefault(key, array("d")).append(max(by_who.values()))
        # A bare coordinator's checkpoint is one trace per coordinate operation: the totals
        # are per checkpoint id, summed until the next checkpoint's root ends.
        # A restore names the checkpoint it restored, but is none of its time: its own group
        # (a bare coordinator's resume after it too), which ranks no one. Summed into that
        # checkpoint's, a 1 s read on model-0 made it the slowest model there, and model-1, the
        # slowest in the other 4 of 5, went unflagged.
        restore = _is_restore(root) or (self._pending_restore and root.checkpoint_id == self._pending_id)
        if root.checkpoint_id != self._pending_id or restore != self._pending_restore:
            self._flush()
            self._pending_id = root.checkpoint_id
            self._pending_restore = restore
        self._pending_unknown.update(k for k in unknown if isinstance(k, str))
        if _undone(root):
            self._pending_undone = True
            if root.checkpoint_id:
                self._undone_ids[root.checkpoint_id] = None
                if len(self._undone_ids) > _UNDONE_KEPT:
                    del self._undone_ids[next(iter(self._undone_ids))]
        for kind, by_who in per_kind.items():
            pending = self._pending.setdefault(kind, {})
            for who, ms in by_who.items():
                pending[who] = pending.get(who, 0.0) + ms

    def _flush(self) -> None:
        # An aborted checkpoint ranks no one: its slowest server was the one its cause held
        # (a stall to the deadline), said as the cause. Ranked, a stall in the first of six
        # checkpoints hid a server 5x slower than its peer in the other five (5 of 6: luck).
        undone = self._pending_undone or self._pending_restore or self._pending_id in self._undone_ids
        pending = {} if undone else self._pending
        for kind, by_who in pending.items():
            if kind in self._pending_unknown:
                continue
            totals = self.totals.setdefault(kind, {})
            for who, ms in by_who.items():
                totals.setdefault(who, array("d")).append(ms)
            if len(by_who) > 1:
                winner = max(by_who, key=lambda w: by_who[w])
                counts = self.slowest_of_kind.setdefault(kind, {})
                counts[winner] = counts.get(winner, 0) + 1
                self.checkpoints_of_kind[kind] = self.checkpoints_of_kind.get(kind, 0) + 1
                self.fewest_of_kind[kind] = min(len(by_who), self.fewest_of_kind.get(kind, len(by_who)))
                ordered = sorted(by_who.items(), key=lambda kv: kv[1])
                ms_sorted = [ms for _, ms in ordered]
                gaps, peers = self.gaps.setdefault(kind, {}), self.peers.setdefault(kind, {})
                places = self.places.setdefault(kind, {})
                for position, (who, ms) in enumerate(ordered):
                    level = _median_without(ms_sorted, position)
                    gaps.setdefault(who, array("d")).append(ms - level)
                    peers.setdefault(who, array("d")).append(level)
                    places.setdefault(who, array("i")).append(len(ordered) - position)
        self._pending = {}
        self._pending_unknown = set()
        self._pending_undone = False
        self._pending_restore = False
        self._pending_id = None

    def _ordered(self, key: Key) -> list[float]:
        return [v for _, v in sorted(zip(self.starts[key], self.values[key], strict=True))]

    def table(self) -> list[Trend]:
        """One ``Trend`` per key, sorted by kind, operation, step."""
        out = []
        for key in sorted(self.values):
            ordered = self._ordered(key)
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
        # (number, row, ms) of each published checkpoint that ended.
        done = [
            (number, r, ms)
            for number, r in enumerate(self.rows, 1)
            if r.published and r.what == "checkpoint" and (ms := r.ms) is not None
        ]
        if len(done) >= MIN_CHECKPOINTS:
            middle = statistics.median(ms for _, _, ms in done)
            for number, row, ms in done:
                if ms > SLOW_FACTOR * middle and ms - middle > SLOW_MIN_MS:
                    times = (
                        f"{ms / middle:.1f}x the run's median" if middle > 0 else "where the run's median is"
                    )
                    cid = short_id(row.checkpoint_id)
                    out.append(f"checkpoint #{number} {cid} took {ms:.1f} ms, {times} {middle:.1f} ms")
        for kind, lines in self._stragglers().items():
            out.extend(lines if len(lines) <= NAMED_STRAGGLERS else [self._stragglers_line(kind, lines)])
        for key in sorted(self.values):
            ordered = self._ordered(key)
            if len(ordered) < 2 * MIN_CHECKPOINTS or (found := growth(ordered)) is None:
                continue
            name = Trend(key, 0, 0.0, 0.0, 0.0, None).name
            jitter = "" if math.isinf(found.over_jitter) else f", {found.over_jitter:.0f}x its jitter"
            out.append(
                f"growing: {name} went from {found.start:.1f} ms to {found.end:.1f} ms through the "
                f"run's {len(ordered)} checkpoints (+{found.slope:.1f} ms per checkpoint{jitter}, "
                f"rank correlation {found.rho:.2f})"
            )
        return out

    def _stragglers_line(self, kind: str, lines: list[str]) -> str:
        """One flag for ``lines``, the many stragglers of ``kind``: how many of how many, and
        the first (the one named among the fewest slowest) in full."""
        first = lines[0].removeprefix("straggler: ")
        return (
            f"stragglers: {len(lines):,} of {len(self.places[kind]):,} {kind} participants were each "
            f"among the slowest in most checkpoints, too many to name one by one; the first: {first}"
        )

    def _stragglers(self) -> dict[str, list[str]]:
        """Each kind's straggler flags, kinds in name order (a kind with none is absent)."""
        out: dict[str, list[str]] = {}
        for kind, places in sorted(self.places.items()):
            total, fewest = self.checkpoints_of_kind[kind], self.fewest_of_kind[kind]
            if total < MIN_CHECKPOINTS:
                continue
            # Two servers slowed alike among 16 take turns at the top (5 and 3 of 8): judged as
            # the slowest alone, neither was named. Among the r slowest, each is, while r stays
            # under half the kind, so the others' median is still the healthy level.
            top = max(1, (fewest - 1) // 2)
            found: list[tuple[int, str, str]] = []
            for who, held in places.items():
                # Named at the least r that passes. Its count of places <= r changes only at its
                # own places, and at one count the tail only grows with r (the gap test reads no
                # r): so only its places are tried, not every r for every participant (2,000
                # participants over 3 checkpoints: 6.7 s, quadratic in the fleet).
                ranked = sorted(place for place in held if place <= top)
                for wins, r in enumerate(ranked, 1):
                    if wins < len(ranked) and ranked[wins] == r:
                        continue  # the count at r takes every place equal to it
                    if wins * 3 <= total * 2:
                        continue
                    if binomial_tail(wins, total, r / fewest) >= STRAGGLER_CHANCE:
                        continue
                    if (line := self._straggler(kind, who, wins, total, r)) is not None:
                        found.append((r, who, line))
                    break  # named here, or never: the gap test reads neither r nor the count
            if found:
                out[kind] = [line for _, _, line in sorted(found)]
        return out

    def _straggler(self, kind: str, who: str, wins: int, total: int, r: int) -> str | None:
        """The flag of ``who``, among the ``r`` slowest of ``kind`` in ``wins`` of ``total``
        checkpoints, if its gap to its peers is large and steady enough (else ``None``)."""
        gaps = self.gaps[kind][who]
        gap, level = statistics.median(gaps), statistics.median(self.peers[kind][who])
        if gap < STRAGGLER_MIN_MS or level + gap < STRAGGLER_RATIO * level:
            return None
        if gap < STRAGGLER_SPREAD * spread(gaps):
            return None
        mine = statistics.median(self.totals[kind][who])
        times = f"{(level + gap) / level:.1f}x" if level > 0 else "where they took none"
        place = f"the slowest {kind}" if r == 1 else f"among the {r} slowest {kind}s"
        return (
            f"straggler: {who} was {place} in {wins} of {total} checkpoints "
            f"(median {mine:.1f} ms in its operations, {gap:.1f} ms over the other {kind}s' "
            f"{level:.1f} ms in the same checkpoint, {times})"
        )
