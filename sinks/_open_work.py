"""Open work, shared by ``MetricSink`` and ``OtlpMetricSink``: operations started and not finished.

``OpenWork.add(batch)`` pairs ``OperationStarted``/``CoordinateStarted`` with their
``*Finished`` by span id and keeps, per (operation, participant kind), how many are open and
when each began (on the monotonic clock, so a wall-clock step leaves the ages true);
``snapshot(now_ns)`` reads the instruments ``gym.checkpoint.open_operations``,
``gym.checkpoint.oldest_open_s`` and ``gym.checkpoint.last_published_ts`` from that. Attribute
sets are the low-cardinality flat keys of ``ckpt_events.sinks._metric_keys`` (tag ``open``), never an id;
past the cardinality limit of its ``Overflow`` a new (operation, kind) is counted under the
overflow key (``ckpt_events.sinks._cardinality``).
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    OperationStarted,
)
from ckpt_events._logs import library_logger
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._cardinality import Overflow
from ckpt_events.vocab import OPEN_WORK_INSTRUMENTS, CollectionAction, Outcome

__all__ = ["GAUGES", "MAX_OPEN", "OPEN_COUNTER", "OpenWork", "OpenWorkSnapshot"]

logger: Final = library_logger("ckpt_events.sinks.metrics")

#: The up-down counter and the two gauges (in export order), from the core's instrument table.
OPEN_COUNTER: Final = OPEN_WORK_INSTRUMENTS[0]
GAUGES: Final = OPEN_WORK_INSTRUMENTS[1:]
#: Open operations tracked at most: a process whose ``*Finished`` events are lost (dropped by a
#: full buffer, or a crash mid-operation) must not grow this without bound.
MAX_OPEN: Final = 10_000
_CONTROLLER: Final = keys.CONTROLLER
_OPEN: Final = keys.OPEN
_OVERFLOW_KEY: Final = keys.OVERFLOW_KEY
_OPEN_NAME: Final = OPEN_COUNTER.name
_PUBLISH: Final = CollectionAction.PUBLISH
_OK: Final = Outcome.OK


class OpenWorkSnapshot(msgspec.Struct, frozen=True):
    """Open operations per flat key, the oldest one's age (s, 0 when none) and the last publish."""

    open: dict[tuple[Any, ...], int]
    oldest_s: dict[tuple[Any, ...], float]
    last_published_ts: float | None
    #: Operations that could not be tracked because ``MAX_OPEN`` were open.
    untracked: int


class OpenWork:
    """What is open now, fed with batches; a dict insert and delete per operation.

    ``overflow`` (its owner's, so one count and one limit serve all its instruments; default a
    fresh one of OpenTelemetry's limit) caps the (operation, kind) sets kept. Past ``MAX_OPEN``
    open operations a start is counted in ``untracked``, and the first one logged (a warning
    naming ``overflow.owner``).
    """

    __slots__ = ("_counts", "_last_published_ns", "_open", "overflow", "untracked")

    def __init__(self, overflow: Overflow | None = None) -> None:
        self.overflow = Overflow() if overflow is None else overflow
        # span id -> (flat key, start on the monotonic clock). Keys once seen stay in _counts, so
        # a key whose work all finished reports 0 open and an oldest age of 0 rather than vanishing.
        self._open: dict[int, tuple[tuple[Any, ...], int]] = {}
        self._counts: dict[tuple[Any, ...], int] = {}
        self._last_published_ns: int | None = None
        self.untracked = 0

    def add(self, batch: list[Any], *, deltas: bool = True) -> dict[tuple[Any, ...], int] | None:
        """Fold ``batch`` in; returns the change in open operations per key (``None``: none, or
        ``deltas=False``: a caller that reads ``snapshot`` only saves a dict update per event)."""
        changes: dict[tuple[Any, ...], int] | None = {} if deltas else None
        opened = self._open
        counts = self._counts
        # An operation began this long before the monotonic reading (never less than 0: the
        # wall clock may have stepped back since); read once a batch.
        wall_ns, mono_ns = time.time_ns(), time.monotonic_ns()
        for event in batch:
            cls = event.__class__
            if cls is OperationStarted or cls is CoordinateStarted:
                if len(opened) >= MAX_OPEN:
                    if not self.untracked:
                        self._warn_untracked()
                    self.untracked += 1
                    continue
                kind = _CONTROLLER if cls is CoordinateStarted else event.kind
                key: tuple[Any, ...] = (_OPEN, event.operation, kind)
                count = counts.get(key)
                if count is None:
                    if len(counts) < self.overflow.limit:
                        count = 0
                    else:
                        self.overflow.fold(_OPEN_NAME)
                        key = _OVERFLOW_KEY
                        count = counts.get(key, 0)
                opened[event.span_id] = (key, mono_ns - max(0, wall_ns - event.start_ns))
                counts[key] = count + 1
                if changes is not None:
                    changes[key] = changes.get(key, 0) + 1
            elif cls is OperationFinished or cls is CoordinateFinished:
                entry = opened.pop(event.span_id, None)
                if entry is None:  # started before this sink subscribed, or untracked
                    continue
                key = entry[0]
                counts[key] -= 1
                if changes is not None:
                    changes[key] = changes.get(key, 0) - 1
            elif cls is CollectionFinished and event.action == _PUBLISH and event.outcome == _OK:
                self._last_published_ns = event.end_ns
        return changes or None

    def _warn_untracked(self) -> None:
        # Was silent: the gauges froze at MAX_OPEN while operations went on, and only
        # PrometheusSink counted what they left out (MetricSink counted nothing).
        logger.warning(
            "%s: %s operations open, the most it tracks; operations started from now on are not in "
            "%s or %s, which undercount (counted in untracked, not logged again); a span handle "
            "entered and never left, or ends dropped by a full buffer (bus.stats()), keep operations open",
            self.overflow.owner,
            f"{MAX_OPEN:,}",
            _OPEN_NAME,
            GAUGES[0].name,
        )

    def snapshot(self, now_ns: int) -> OpenWorkSnapshot:
        """The instruments' values at ``now_ns`` (Unix ns, the events' clock). Ages are read on
        the monotonic clock: ``now_ns`` only says how far from the present to look."""
        mono_ns = time.monotonic_ns() + (now_ns - time.time_ns())
        oldest: dict[tuple[Any, ...], int] = {}
        for key, since_ns in self._open.values():
            if since_ns < oldest.get(key, mono_ns):
                oldest[key] = since_ns
        ages = {
            key: max(0.0, (mono_ns - oldest[key]) / 1e9) if key in oldest else 0.0 for key in self._counts
        }
        published = self._last_published_ns
        return OpenWorkSnapshot(
            open=dict(self._counts),
            oldest_s=ages,
            last_published_ts=None if published is None else published / 1e9,
            untracked=self.untracked,
        )

    def __bool__(self) -> bool:
        return bool(self._counts) or self._last_published_ns is not None
