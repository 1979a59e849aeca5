"""``Backlog``: what the watch needs of a stream of events, folded in bounded memory.

The first read of ``LogFollower`` folds everything the followed logs hold into a ``Backlog``: the
spans still open, their stall reports and each participant's last ``KEEP_FINISHED`` finished
operations, never a prefix of the log read as if it were the whole. ``merged_by_stamp`` merges
the events of several files, each in its own order, by stamp.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

from ckpt_events import (
    CoordinateFinished,
    CoordinateStarted,
    Event,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    Stalled,
)

__all__ = ["KEEP_FINISHED", "MAX_FINISHED", "MAX_OPEN", "Backlog", "merged_by_stamp"]

#: Open spans a backlog keeps at most (an open operation is a few hundred bytes).
MAX_OPEN: Final = 10_000
#: Finished spans a backlog remembers, so that a copy of one's ``*Started`` event read after it
#: (a file out of time order, a copy of the log) does not open it again (~100 bytes each).
MAX_FINISHED: Final = 200_000
#: Finished operations a backlog keeps per participant: the view shows the last three.
KEEP_FINISHED: Final = 8


class Backlog:
    """What the view needs of a stream of events, in bounded memory: the spans still open, the
    stall reports about them, and each participant's last ``KEEP_FINISHED`` finished operations.

    The events may come in any order (a file out of time order, a copy of a log in the same
    folder): a span whose ``*Finished`` event was seen is never opened again by its ``*Started``
    event, and a finished operation is kept once. The last ``MAX_FINISHED`` finished spans are
    remembered; a ``*Started`` event older than the end of one forgotten is not shown as open
    (whether it finished is unknown) but counted in ``unknown``. ``events()`` hands on what it
    kept of each file (``source``) in the order it was read, so that each writer's stamps keep
    their order (the view tells by it a clock stepped back), the files' merged by stamp.
    """

    __slots__ = (
        "_done",
        "_finished",
        "_forgotten_end",
        "_open",
        "_seq",
        "_stalled",
        "source",
        "unknown",
        "untracked",
    )

    def __init__(self) -> None:
        #: Each kept event with its file and arrival (``_Arrival``): ``events()`` hands each
        #: file's on in that order.
        self._open: dict[tuple[int, int], tuple[_Arrival, Event]] = {}
        self._stalled: dict[tuple[str, str, str, str | None, int | None], tuple[_Arrival, Stalled]] = {}
        #: Per participant, its latest finished operations: a heap of (end, arrival, event).
        self._finished: dict[tuple[str, str], list[tuple[int, _Arrival, Event]]] = {}
        #: The spans seen finished, oldest first. An OrderedDict pops its oldest in O(1): a dict's
        #: ``pop(next(iter(...)))`` walks past every entry deleted before it, so folding 400,000
        #: finished spans took 38 s (a 794 MB log, 169 s), and 0.2 s this way.
        self._done: OrderedDict[tuple[int, int], int] = OrderedDict()  # span -> its end
        #: The latest end of a finished span forgotten past ``MAX_FINISHED`` (-1: none).
        self._forgotten_end = -1
        self._seq = 0
        #: The file the events given next come from (``LogFollower`` sets it).
        self.source = 0
        #: Spans (and stall reports) left out past ``MAX_OPEN``.
        self.untracked = 0
        #: Spans started before a forgotten span ended: whether they are still open is unknown.
        self.unknown = 0

    def notes(self) -> dict[str, str]:
        """What the backlog left out, in words (keyed as the view's lasting notes); none if nothing."""
        said = {}
        if self.untracked:
            said["(backlog)"] = f"backlog: {self.untracked} open span(s) past {MAX_OPEN} not shown"
        if self.unknown:
            said["(backlog: unknown)"] = (
                f"backlog: {self.unknown} span(s) not shown: started before the last {MAX_FINISHED:,} "
                "finished spans, whether they finished too is unknown"
            )
        return said

    def add_all(self, events: Iterable[Event]) -> None:
        """Fold ``events`` in, in any order."""
        for event in events:
            if isinstance(event, OperationStarted | CoordinateStarted | StageStarted):
                span = (event.trace_id, event.span_id)
                if span in self._done:
                    continue  # finished already: a copy, or a file out of time order
                if event.start_ns <= self._forgotten_end:
                    self.unknown += 1
                elif span in self._open:
                    continue  # a copy: it keeps its first arrival
                elif len(self._open) < MAX_OPEN:
                    self._seq += 1
                    self._open[span] = ((self.source, self._seq), event)
                else:
                    self.untracked += 1
            elif isinstance(event, OperationFinished | CoordinateFinished):
                span = (event.trace_id, event.span_id)
                if span in self._done:
                    continue  # a copy of one already folded
                self._done[span] = event.end_ns
                if len(self._done) > MAX_FINISHED:
                    _, gone = self._done.popitem(last=False)
                    self._forgotten_end = max(self._forgotten_end, gone)
                self._open.pop(span, None)
                who = (str(event.kind), event.instance)
                last = self._finished.get(who)
                if last is None:
                    if len(self._finished) >= MAX_OPEN:
                        self.untracked += 1
                        continue
                    last = self._finished[who] = []
                self._seq += 1
                entry = (event.end_ns, (self.source, self._seq), event)
                if len(last) < KEEP_FINISHED:
                    heapq.heappush(last, entry)
                else:
                    heapq.heappushpop(last, entry)
            elif isinstance(event, StageFinished):
                # No outcome shown: a controller's stage only tells what its prepare waits on.
                self.end((event.trace_id, event.span_id), event.end_ns)
            elif isinstance(event, Stalled):
                # By worker too: a worker's report and its main process's are of two operations.
                key = (
                    str(event.kind),
                    event.instance,
                    str(event.operation),
                    event.checkpoint_id,
                    event.worker,
                )
                if key in self._stalled or len(self._stalled) < MAX_OPEN:
                    self._seq += 1
                    self._stalled[key] = ((self.source, self._seq), event)
                else:
                    self.untracked += 1

    def end(self, span: tuple[int, int], end_ns: int) -> None:
        """Fold in the end of ``span`` read from a line this version could not decode (another
        version's ``*_finished`` event, ``CorruptLine.ended``): it ended, never open again; its
        outcome is unknown, so it is not among the finished operations shown."""
        if span in self._done:
            return
        self._done[span] = end_ns
        if len(self._done) > MAX_FINISHED:
            _, gone = self._done.popitem(last=False)
            self._forgotten_end = max(self._forgotten_end, gone)
        self._open.pop(span, None)

    def opened(self) -> dict[tuple[int, int], int]:
        """The spans still open, each with the file (``source``) its start was read from."""
        return {span: arrival[0] for span, (arrival, _) in self._open.items()}

    def events(self) -> list[Event]:
        """The fold as events: each participant's last finished operations, the open spans, and
        the stall reports of open operations; each file's in the order it was read, the files'
        merged by stamp (read one after the other, a worker's log of its own went back in time:
        a clock stepped back, to the view)."""
        kept: list[tuple[_Arrival, Event]] = [
            (seq, event) for last in self._finished.values() for _, seq, event in last
        ]
        kept.extend(self._open.values())
        open_ops = {
            (str(e.kind), e.instance, str(e.operation), e.checkpoint_id, e.worker)
            for _, e in self._open.values()
            if isinstance(e, OperationStarted)
        }
        kept.extend(entry for key, entry in self._stalled.items() if key in open_ops)
        kept.sort(key=lambda entry: entry[0])
        files = [
            [event for _, event in entries] for _, entries in itertools.groupby(kept, key=lambda e: e[0][0])
        ]
        return merged_by_stamp(files)


#: Where a kept event came from: (its file, its arrival).
_Arrival = tuple[int, int]


def merged_by_stamp(files: list[list[Event]]) -> list[Event]:
    """The events of ``files`` (each a file's, in its own order) merged by stamp: read one file
    after the other, a log per worker (one instance) went back in time and read as a clock step."""
    return files[0] if len(files) == 1 else list(heapq.merge(*files, key=_stamp))


def _stamp(event: Event) -> int:
    """When a followed event happened: a span's start or end, a stall report's time."""
    match event:
        case OperationStarted() | CoordinateStarted() | StageStarted():
            return event.start_ns
        case OperationFinished() | CoordinateFinished() | StageFinished():
            return event.end_ns
        case Stalled():
            return event.time_ns
        case _:
            return 0
