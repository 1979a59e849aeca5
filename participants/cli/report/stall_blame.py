"""Whom a controller's stalled operation waited on.

``StallWatch`` counts every operation open past its threshold, the controller's too: it cannot
see other processes. A controller's prepare held up by a participant's stuck prepare is open as
long, so ``demo --fault stall --watch`` recorded two ``stalled`` events (``controller/prepare``
beside ``environment/prepare``) where one party stalled. Here a controller's ``Stalled`` is
counted as a stall only when the logs hold calls of its checkpoint and none was open when it
was reported; while one was, it is waiting on that participant; with none in the logs read,
whom it waited on is unknown (never a stall of the controller).
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Final

from ckpt_events import Event, OperationFinished, OperationStarted, Stalled
from ckpt_events.vocab import Kind

__all__ = ["WAITING", "UNKNOWN_HOLDER", "StallBlame"]

#: The counted-events table's row for a controller's stalled operation that waited on a
#: participant (not a counted event of the SPEC: the ``stalled`` events themselves are kept).
WAITING: Final = "waiting"
#: Whom it waited on when no call of its checkpoint is in the logs read.
UNKNOWN_HOLDER: Final = "unknown (none of its calls in the logs read)"
#: Participant operations kept to judge by: past this, the checkpoints first seen longest ago
#: are forgotten (a controller's stall of one is judged unknown), so memory follows this bound,
#: not the lines read (200,000 kept made a report of participants' logs alone grow 61 -> 94
#: MiB, 16,384 still 61 -> 69); a controller's ``Stalled`` comes beside its checkpoint's calls
#: in the merged logs, so the checkpoints seen last are the ones it is judged by.
MAX_KEPT: Final = 4_096
#: Checkpoints forgotten, remembered as such (their later events are not taken for all of them).
MAX_FORGOTTEN: Final = 65_536


@dataclass(slots=True)
class _Call:
    who: str
    start_ns: int
    end_ns: int | None = None


@dataclass
class StallBlame:
    """Fed every event (any order), tells each controller's ``Stalled`` apart: a stall, or
    waiting on whom (``result``)."""

    #: Per checkpoint id (first seen first), its participants' operations by span id.
    calls: OrderedDict[str, dict[int, _Call]] = field(default_factory=OrderedDict)
    controller: list[Stalled] = field(default_factory=list)
    kept: int = 0
    #: Checkpoints whose calls were dropped for ``MAX_KEPT``: whom they waited on is unknown.
    forgotten: OrderedDict[str, None] = field(default_factory=OrderedDict)
    #: ``False``: keep no call, every controller's stall is unknown (logs with no controller's
    #: coordination: participants' logs alone, where a report's memory must not grow with them).
    keep_calls: bool = True

    def add(self, event: Event) -> bool:
        """Take ``event``; ``True`` if it is a controller's ``Stalled``, which ``result`` counts
        (the caller counts every other counted event itself)."""
        match event:
            case Stalled() if event.kind == Kind.CONTROLLER:
                self.controller.append(event)
                return True
            case _ if not self.keep_calls:
                pass
            case Stalled(checkpoint_id=str(cid), age_s=age):
                # Open from ``age_s`` before it was reported until at least then (its own
                # start and end, when in the logs, say the rest).
                start = event.time_ns - int(age * 1e9)
                call = self._call(cid, -1 - self.kept, event, start)
                if call is not None:
                    call.end_ns = event.time_ns
            case OperationStarted(checkpoint_id=str(cid)):
                call = self._call(cid, event.span_id, event, event.start_ns)
                if call is not None:
                    call.start_ns = min(call.start_ns, event.start_ns)
            case OperationFinished(checkpoint_id=str(cid)):
                call = self._call(cid, event.span_id, event, event.start_ns)
                if call is not None:
                    call.end_ns = event.end_ns
            case _:
                pass
        return False

    def _call(self, cid: str, key: int, event: Event, start_ns: int) -> _Call | None:
        """The call ``key`` of checkpoint ``cid``, made from ``event`` if new (``None``: the
        checkpoint was forgotten)."""
        calls = self.calls.get(cid)
        if calls is None:
            if cid in self.forgotten:
                return None
            calls = self.calls[cid] = {}
        elif (call := calls.get(key)) is not None:
            return call
        # One string per participant (interned), not one per call.
        new = calls[key] = _Call(sys.intern(f"{event.kind}/{event.instance}"), start_ns)
        self.kept += 1
        if self.kept > MAX_KEPT:
            self._forget(cid)
        return new

    def _forget(self, keep: str) -> None:
        """Drop the checkpoints first seen longest ago (not ``keep``) to a quarter under ``MAX_KEPT``."""
        for cid in list(self.calls):  # bounded: the checkpoints kept, at most MAX_KEPT
            if self.kept <= MAX_KEPT * 3 // 4:
                break
            if cid == keep:
                continue
            self.kept -= len(self.calls.pop(cid))
            self.forgotten[cid] = None
            if len(self.forgotten) > MAX_FORGOTTEN:
                self.forgotten.popitem(last=False)

    def result(self) -> tuple[Counter[str], Counter[str]]:
        """``(stalled, waiting)``: the controller's real stalls by ``kind/operation``, and its
        waits by ``kind/operation on <participant>`` (``UNKNOWN_HOLDER`` when not known)."""
        stalled: Counter[str] = Counter()
        waiting: Counter[str] = Counter()
        for event in self.controller:
            what = f"{event.kind}/{event.operation}"
            holders = self._holders(event)
            if holders is None:
                waiting[f"{what} on {UNKNOWN_HOLDER}"] += 1
            elif holders:
                waiting[f"{what} on {', '.join(holders)}"] += 1
            else:
                stalled[what] += 1
        return stalled, waiting

    def _holders(self, event: Stalled) -> list[str] | None:
        """The participants whose call of the checkpoint was open when ``event`` was reported;
        ``None`` when that is unknown (no call of it kept)."""
        calls = self.calls.get(event.checkpoint_id or "")
        if not calls:
            return None  # none in the logs read, or forgotten (``MAX_KEPT``)
        at = event.time_ns
        open_then = (c for c in calls.values() if c.start_ns <= at and (c.end_ns is None or c.end_ns >= at))
        return sorted({c.who for c in open_then})
