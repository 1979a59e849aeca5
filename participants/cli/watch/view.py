"""What ``ckpt-events watch`` shows: per participant, its state from ``/status`` and its open work from logs.

``FleetView`` folds poll results and followed events in and renders one block of short lines
per participant (rich ``Text``, no markup: every string from a participant or a log is shown
with its control characters escaped, so it cannot move the cursor or recolour the terminal).
Lines wrap at the console's width; nothing is cut.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Sequence
from typing import Final

from rich.console import Group
from rich.text import Text

from ckpt_events import (
    CoordinateFinished,
    CoordinateStarted,
    Event,
    OperationFinished,
    OperationStarted,
    Stalled,
)
from ckpt_events.participants.cli.watch.sources import PollResult
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Phase

__all__ = ["LAST_CHECKPOINTS", "FleetView", "escape"]

#: How many past outcomes each participant shows.
LAST_CHECKPOINTS: Final = 3
#: At most this many blockers are named; the count says how many there are.
_BLOCKERS_SHOWN: Final = 3
#: The lease turns red under this fraction of the lease it was given.
_LEASE_RED: Final = 0.2
_CONTROL: Final = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}


def escape(text: object) -> str:
    """``text`` with terminal control characters shown as ``\\xNN``."""
    return str(text).translate(_CONTROL)


class _Open:
    __slots__ = ("checkpoint_id", "operation", "stalled", "start_ns")

    def __init__(self, operation: str, checkpoint_id: str | None, start_ns: int) -> None:
        self.operation = operation
        self.checkpoint_id = checkpoint_id
        self.start_ns = start_ns
        self.stalled = False


class _Seen:
    """What the view remembers of one participant between refreshes."""

    __slots__ = ("at_start", "grace", "lease_at", "open", "outcomes", "phase", "since")

    def __init__(self) -> None:
        self.phase: tuple[Phase, str | None] | None = None
        self.since = 0.0
        #: The phase was already there at the first poll: its time is at least what is shown.
        self.at_start = False
        self.lease_at: float | None = None
        self.grace: float | None = None
        self.open: dict[int, _Open] = {}
        self.outcomes: collections.deque[str] = collections.deque(maxlen=LAST_CHECKPOINTS)


class FleetView:
    """The fleet as last seen; ``stall_after``: open work older than this is marked stalled."""

    def __init__(self, urls: Sequence[str], *, stall_after: float = 30.0) -> None:
        self.urls = list(urls)
        self.stall_after = stall_after
        self.polls: dict[str, PollResult] = {}
        self.seen: dict[tuple[str, str], _Seen] = {}
        self.notes: list[str] = []

    def _of(self, kind: str, instance: str) -> _Seen:
        key = (kind, instance)
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = _Seen()
        return seen

    def add_polls(self, results: Iterable[PollResult], now: float) -> None:
        """Fold in one round of ``/status`` answers (``now``: Unix seconds)."""
        for result in results:
            self.polls[result.url] = result
            status = result.status
            if status is None:
                continue
            seen = self._of(status.kind, status.instance)
            phase = (status.phase, status.checkpoint_id)
            if seen.phase != phase:
                seen.at_start = seen.phase is None
                seen.phase = phase
                seen.since = now
            if status.lease_expires_at != seen.lease_at:
                seen.lease_at = status.lease_expires_at
                seen.grace = None if seen.lease_at is None else max(seen.lease_at - now, 0.001)

    def add_events(self, events: Iterable[Event]) -> None:
        """Fold in events read from the logs: spans that open and close, stalls, outcomes."""
        for event in events:
            if isinstance(event, OperationStarted | CoordinateStarted):
                kind = Kind.CONTROLLER if isinstance(event, CoordinateStarted) else event.kind
                seen = self._of(str(kind), event.instance)
                seen.open[event.span_id] = _Open(event.operation.value, event.checkpoint_id, event.start_ns)
            elif isinstance(event, OperationFinished | CoordinateFinished):
                kind = Kind.CONTROLLER if isinstance(event, CoordinateFinished) else event.kind
                seen = self._of(str(kind), event.instance)
                seen.open.pop(event.span_id, None)
                took = (event.end_ns - event.start_ns) / 1e6
                seen.outcomes.append(
                    f"{escape(event.checkpoint_id or '-')} {event.operation.value} {event.outcome.value} "
                    f"{_ms(took)}"
                )
            elif isinstance(event, Stalled):
                seen = self._of(str(event.kind), event.instance)
                for item in seen.open.values():
                    if item.operation == event.operation.value and item.checkpoint_id == event.checkpoint_id:
                        item.stalled = True

    def render(self, now: float | None = None) -> Group:
        """One block per participant: polled ones in the order given, then those only in logs."""
        now = time.time() if now is None else now
        blocks: list[Text] = []
        shown: set[tuple[str, str]] = set()
        for url in self.urls:
            result = self.polls.get(url)
            if result is None:
                blocks.append(Text(f"{escape(url)}  waiting for the first answer", style="dim"))
            elif result.status is None:
                blocks.append(Text(f"{escape(url)}  {escape(result.error)}", style="bold red"))
            else:
                key = (result.status.kind, result.status.instance)
                shown.add(key)
                blocks.append(self._block(key, now, result))
        for key in self.seen:
            if key not in shown and (key[0] != Kind.CONTROLLER.value or self.seen[key].open):
                blocks.append(self._block(key, now, None))
        if not blocks:
            blocks.append(Text("nothing to watch yet", style="dim"))
        blocks.extend(Text(escape(note), style="yellow") for note in self.notes)
        return Group(*blocks)

    def _block(self, key: tuple[str, str], now: float, result: PollResult | None) -> Text:
        kind, instance = key
        seen = self.seen.get(key) or _Seen()
        text = Text()
        text.append(f"{escape(kind)} {escape(instance)}", style="bold")
        if result is not None:
            text.append(f"  {escape(result.url)}", style="dim")
        status = None if result is None else result.status
        if status is not None:
            text.append(f"\n  phase {status.phase.value}")
            text.append(f"  checkpoint {escape(status.checkpoint_id or '-')}")
            text.append(f"  for {'>=' if seen.at_start else ''}{_seconds(now - seen.since)}")
            if status.lease_expires_at is not None:
                left = status.lease_expires_at - now
                red = seen.grace is not None and left < _LEASE_RED * seen.grace
                text.append("  lease ")
                text.append(f"{_seconds(max(left, 0.0))} left", style="bold red" if red else "")
            report = status.report
            if report is not None:
                if report.ready:
                    text.append("\n  ready", style="green")
                else:
                    names = ", ".join(escape(b) for b in report.blockers[:_BLOCKERS_SHOWN])
                    more = report.blocker_count - min(len(report.blockers), _BLOCKERS_SHOWN)
                    tail = f" and {more} more" if more > 0 else ""
                    text.append("\n  NOT READY", style="bold red")
                    text.append(f": {report.blocker_count} blocking: {names}{tail}")
            elif status.phase is Phase.PREPARING:
                text.append("\n  readiness not reported yet", style="yellow")
        elif kind != Kind.CONTROLLER.value or instance != CONTROLLER_INSTANCE:
            text.append("\n  (from logs only)", style="dim")
        for item in sorted(seen.open.values(), key=lambda o: o.start_ns):
            age = now - item.start_ns / 1e9
            stalled = item.stalled or age >= self.stall_after
            text.append(f"\n  open {item.operation} {escape(item.checkpoint_id or '-')} {_seconds(age)}")
            if stalled:
                text.append(" STALLED", style="bold red")
        if seen.outcomes:
            text.append("\n  last: " + " | ".join(seen.outcomes), style="dim")
        return text


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else _seconds(value / 1000)
