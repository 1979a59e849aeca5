"""What ``ckpt-events watch`` shows: per participant, its state from ``/status`` and its open work from logs.

``FleetView`` folds poll results and followed events in; ``render()`` draws it (``layout``: in
blocks for a few participants, in rows past ``ROWS_OVER`` or when blocks are taller than the
terminal, every string from a participant or a log escaped).

Participants known from the logs alone are tracked up to ``MAX_FROM_LOGS``; the rest are
counted in a note. Open work is aged by the participant's clock, not ours: each poll's clock offset
(``PollResult.clock_offset``) corrects the age, and the participant's line says so past
``CLOCK_NOTE_S``. A participant known from its logs only has no measured offset: its work's age
is a lower bound (``>=``), how long its own clock says the work was open by the newest event it
wrote that we have read, plus how long ago (by ours) we read that event, so a clock behind ours
never makes work look old, and work stays stalled past ``stall_after`` with no event since. That
bound holds while its clock runs forward: a writer whose stamp goes back past ``STEP_BACK_S``
(its clock stepped back, NTP) has what it wrote before set aside, and its work opened before
the step is of unknown age. A clock stepped forward (ours, or the writer's before it writes
again) is told by our monotonic clock: past what it measured since we read the start (plus the
age then) by more than ``STEP_FORWARD_S``, the age shown is that measure, never a stall. An
age is never negative: work stamped in our future by a participant whose clock is not known is
shown as such, with no age. Work is marked stalled only when its age, less the clock's
uncertainty, is past ``stall_after`` (or StallWatch said so). What is remembered of each
participant between refreshes, and of its clocks, is ``seen``'s.
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from rich.console import Group

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
from ckpt_events.participants.cli.text import escape
from ckpt_events.participants.cli.watch.layout import (
    Rendered,
    draw_blocks,
    draw_rows,
    least_ahead,
    monotonic,
    ms,
    on_worker,
)
from ckpt_events.participants.cli.watch.seen import (
    ADMITTING,
    STEP_BACK_S,
    STEP_FORWARD_S,
    Open,
    Seen,
    correction,
    passes,
    written,
)
from ckpt_events.participants.cli.watch.sources import PollResult
from ckpt_events.vocab import Kind, Outcome

__all__ = ["LAST_CHECKPOINTS", "MAX_FROM_LOGS", "STEP_BACK_S", "FleetView"]

#: Participants known from the logs alone that the view tracks; past it, counted in a note (a
#: log naming 100,000 instances took 353 MiB and 19 s a frame). Those polled by URL always are.
MAX_FROM_LOGS: Final = 1024
#: Participants not tracked that are told apart, to count them (~200 bytes each).
_UNTRACKED_KEPT: Final = 100_000
#: How many past outcomes each participant shows.
LAST_CHECKPOINTS: Final = 3
#: Open spans kept per participant; past it, new ones are counted, not shown.
_MAX_OPEN: Final = 1000
#: Spans seen to end kept per participant, so that a start read after its end (two files read
#: one after the other) does not open it again (~100 bytes each). Oldest let go with
#: ``OrderedDict.popitem``: a dict's ``del d[next(iter(d))]`` walks past the entries deleted
#: before it (1,000,000 evictions past 1,000: 1.0 s against 0.35, measured here).
_ENDED_KEPT: Final = 1000


class FleetView:
    """The fleet as last seen; ``stall_after``: open work older than this is marked stalled.
    ``rows``: ``True`` one line per participant, ``False`` blocks, ``None`` as fits (see above)."""

    def __init__(self, urls: Sequence[str], *, stall_after: float = 30.0, rows: bool | None = None) -> None:
        self.urls = list(urls)
        self.stall_after = stall_after
        self.rows = rows
        self.polls: dict[str, PollResult] = {}
        #: Who each URL last answered as: a participant that stops answering stays one entry
        #: (its URL's error beside its logs), not two (the error, then "from logs only").
        self.answered: dict[str, tuple[str, str]] = {}
        self.seen: dict[tuple[str, str], Seen] = {}
        self.notes: list[str] = []
        #: Participants in the logs not tracked, past ``MAX_FROM_LOGS``.
        self.untracked: set[tuple[str, str]] = set()
        self._from_logs = 0
        self._arrival = 0  # outcomes that end at one nanosecond keep the order they were read in
        #: Spans whose end was another version's line (``add_events(ended=...)``), last ones kept.
        self._unread_ends: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        #: The controller's stages, last ones kept: (trace, stage span) -> (its coordinate span,
        #: still open, the kind it calls). A stage open is a fan-out: its prepare waits on calls to that kind.
        self.stages: collections.OrderedDict[tuple[int, int], tuple[int | None, bool, str]] = (
            collections.OrderedDict()
        )
        #: Who answered a call of the controller's span (trace, calling span), last spans kept.
        self.answered_calls: collections.OrderedDict[tuple[int, int], set[tuple[str, str]]] = (
            collections.OrderedDict()
        )

    def _of(self, kind: str, instance: str) -> Seen:
        key = (kind, instance)
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = Seen()
        return seen

    def _logged(self, kind: str, instance: str) -> Seen | None:
        """The participant an event read from the logs is about; ``None`` (counted) when it is
        new past ``MAX_FROM_LOGS``."""
        key = (kind, instance)
        seen = self.seen.get(key)
        if seen is None:
            if self._from_logs >= MAX_FROM_LOGS:
                if len(self.untracked) < _UNTRACKED_KEPT:  # bounded too: past it, a floor
                    self.untracked.add(key)
                return None
            self._from_logs += 1
            seen = self.seen[key] = Seen()
        seen.logged = True
        return seen

    def _left(self, url: str) -> None:
        """``url`` no longer answers as the participant it answered as: one known only from its
        polls is forgotten (another server took the port; a name answered once is not kept for
        ever), unless another URL answers as it; one in the logs stays, from them."""
        key = self.answered.pop(url, None)
        if key is None or key in self.answered.values():
            return
        seen = self.seen.get(key)
        if seen is not None and not seen.logged:
            del self.seen[key]

    def shown_notes(self) -> list[str]:
        """The notes, and the participants in the logs not tracked."""
        if not self.untracked:
            return self.notes
        count = f"{len(self.untracked):,}" + ("+" if len(self.untracked) >= _UNTRACKED_KEPT else "")
        more = f"{count} more participants in the logs not tracked (past {MAX_FROM_LOGS:,})"
        return [*self.notes, more]

    def add_polls(self, results: Iterable[PollResult], now: float, *, mono: float | None = None) -> None:
        """Fold in one round of ``/status`` answers (``now``: Unix seconds; ``mono``: our
        monotonic clock then, ``monotonic``). A URL answering as a participant another URL of
        the round answered as first (two servers started with one instance) is shown as that,
        never folded in: their phases and clocks would mix."""
        at = monotonic(now, mono)
        claimed: dict[tuple[str, str], str] = {}
        #: Who the round's URLs answered as before it: those no URL answers as now have a gap.
        before: set[tuple[str, str]] = set()
        for answer in results:
            result = answer
            if (was := self.answered.get(result.url)) is not None:
                before.add(was)
            status = result.status
            if status is not None:
                key = (str(status.kind), status.instance)
                if (twin := claimed.setdefault(key, result.url)) != result.url:
                    said = (
                        f"answers as {key[0]}/{key[1]}, as {twin} does: two servers with one "
                        "instance (give each its own --instance)"
                    )
                    result = PollResult(
                        url=result.url, seconds=result.seconds, error=said, failure="duplicate"
                    )
                    self._left(result.url)
            self.polls[result.url] = result
            status = result.status
            if status is None:
                continue
            key = (str(status.kind), status.instance)
            if self.answered.get(result.url, key) != key:
                self._left(result.url)
            self.answered[result.url] = key
            seen = self._of(*key)
            if result.clock_offset is not None and result.clock_error is not None:
                seen.polled(result.clock_offset, result.clock_error, now - at)
            phase = (str(status.phase), status.checkpoint_id)
            if seen.phase != phase:
                seen.at_start = seen.phase is None
                seen.phase = phase
                seen.since = at
            if status.lease_expires_at != seen.lease_at:
                seen.lease_at = status.lease_expires_at
                theirs = now + correction(seen, now - at)
                seen.grace = None if seen.lease_at is None else max(seen.lease_at - theirs, 0.001)
        for key in before - claimed.keys():
            # Not seen this round (no answer, or its URL answers as another): what phase it is
            # in until it answers again is unknown, so its time in phase restarts then, as ``>=``
            # (was: counted across the gap, as if seen in that phase all along).
            if (gone := self.seen.get(key)) is not None:
                gone.phase = None

    def add_events(
        self,
        events: Iterable[Event],
        now: float | None = None,
        *,
        cut: Mapping[tuple[int, int], str] | None = None,
        mono: float | None = None,
        ended: Iterable[tuple[int, int]] = (),
    ) -> None:
        """Fold in events read from the logs by ``now`` (Unix seconds; ``None``: the time):
        spans that open and close, stalls, outcomes. Kinds, operations and outcomes may be
        plain strings (events built by keyword). A span's end may come before its start (two
        files read one after the other): it is not opened again (the last ``_ENDED_KEPT`` ends
        of each participant are remembered). ``cut``: spans (trace id, span id) read from a
        rotated file, the newest given of its log (``LogFollower.cut``): their age is unknown.
        ``mono``: our monotonic clock at ``now`` (``monotonic``). ``ended``: spans whose end
        was read in a line this version could not decode (``LogFollower.ended``): ended, never
        open (their outcome unknown); the last ``_ENDED_KEPT`` are remembered."""
        read_at = time.time() if now is None else now
        read_mono = monotonic(now, mono)
        cut = {} if cut is None else cut
        fresh: list[tuple[Seen, Open]] = []
        for key in ended:
            # Whose span it is was not read: it closes whichever participant holds it open.
            self._unread_ends[key] = None
            if len(self._unread_ends) > _ENDED_KEPT:
                self._unread_ends.popitem(last=False)
            for held in self.seen.values():
                held.open.pop(key, None)
        for event in events:
            if isinstance(event, OperationStarted | CoordinateStarted):
                kind = Kind.CONTROLLER if isinstance(event, CoordinateStarted) else event.kind
                if (seen := self._logged(str(kind), event.instance)) is None:
                    continue
                written(seen, event.start_ns, read_at, event.worker)
                key = (event.trace_id, event.span_id)
                if key in seen.ended or key in self._unread_ends:
                    continue  # its end was read first: finished, never open again
                if key in seen.open or len(seen.open) < _MAX_OPEN:
                    item = Open(
                        str(event.operation), event.checkpoint_id, event.start_ns, event.worker, read_mono
                    )
                    item.trace_id = event.trace_id
                    item.parent = event.parent_span_id
                    item.passed = any(passes(item, done) for done in seen.done)
                    known = seen.open.get(key)
                    item.cut = cut.get(key, None if known is None else known.cut)
                    if known is None:
                        fresh.append((seen, item))
                    else:  # a copy of its start: first read when the first was
                        item.read_mono = known.read_mono
                        item.read_age = known.read_age
                    seen.open[key] = item
                else:
                    seen.untracked += 1
            elif isinstance(event, OperationFinished | CoordinateFinished):
                kind = Kind.CONTROLLER if isinstance(event, CoordinateFinished) else event.kind
                if (seen := self._logged(str(kind), event.instance)) is None:
                    continue
                written(seen, event.end_ns, read_at, event.worker)
                key = (event.trace_id, event.span_id)
                seen.open.pop(key, None)
                if event.parent_span_id is not None and kind != Kind.CONTROLLER:
                    self._answer((event.trace_id, event.parent_span_id), (str(kind), event.instance))
                seen.ended[key] = None
                if len(seen.ended) > _ENDED_KEPT:
                    seen.ended.popitem(last=False)
                if str(event.operation) in ADMITTING and str(event.outcome) == Outcome.OK.value:
                    done = (event.start_ns, event.worker, str(event.operation), event.checkpoint_id)
                    seen.done.append(done)
                    for item in seen.open.values():
                        item.passed = item.passed or passes(item, done)
                took = (event.end_ns - event.start_ns) / 1e6
                # A worker's line names it: two workers' commits of one checkpoint read as one
                # line twice ("c5 commit ok 3 ms").
                line = (
                    f"{escape(event.checkpoint_id or '-')} {escape(event.operation)}"
                    f"{on_worker(event.worker)} {escape(event.outcome)} {ms(took)}"
                )
                self._arrival += 1
                bisect.insort(seen.outcomes, (event.end_ns, self._arrival, line))
                del seen.outcomes[:-LAST_CHECKPOINTS]
            elif isinstance(event, StageStarted | StageFinished):
                key = (event.trace_id, event.span_id)
                # Its end may be read before its start (two files): an ended stage stays ended.
                still = isinstance(event, StageStarted) and self.stages.get(key, (None, True, ""))[1]
                self.stages[key] = (event.parent_span_id, still, event.stage)
                if len(self.stages) > _ENDED_KEPT:
                    self.stages.popitem(last=False)
            elif isinstance(event, Stalled):
                if (seen := self._logged(str(event.kind), event.instance)) is None:
                    continue
                written(seen, event.time_ns, read_at, event.worker)
                for item in seen.open.values():
                    # Its own process's work, open by the report's time: was any work of that
                    # operation and checkpoint, so a worker's stall made its main process's
                    # commit, opened a moment ago, STALLED too (and a later one of the same id).
                    if (
                        item.operation == str(event.operation)
                        and item.checkpoint_id == event.checkpoint_id
                        and item.worker == event.worker
                        and item.start_ns <= event.time_ns
                    ):
                        item.stalled = True
        for seen, item in fresh:
            # Its least age by the stamps of the whole batch, as it is read: a writer's stamp past
            # our clock (ahead, or stepped forward since it opened: which is not known) gives none.
            ahead = least_ahead(seen, item)
            if ahead is not None and ahead <= STEP_FORWARD_S:
                item.read_age = max(read_at + ahead - item.start_ns / 1e9, 0.0)

    def _answer(self, caller: tuple[int, int], who: tuple[str, str]) -> None:
        """``who`` answered a call the controller's span ``caller`` made (its operation ended)."""
        answered = self.answered_calls.get(caller)
        if answered is None:
            answered = self.answered_calls[caller] = set()
            if len(self.answered_calls) > _ENDED_KEPT:
                self.answered_calls.popitem(last=False)
        answered.add(who)

    def render(
        self, now: float | None = None, *, rows: bool | None = None, mono: float | None = None
    ) -> Rendered:
        """The view at ``now`` (Unix seconds), laid out when printed: ``rows`` as in the
        constructor (``None``: the view's own choice); ``mono``: our monotonic clock at ``now``
        (``monotonic``)."""
        return Rendered(
            self,
            time.time() if now is None else now,
            self.rows if rows is None else rows,
            monotonic(now, mono),
        )

    def blocks(self, now: float, *, mono: float | None = None) -> Group:
        """One block per participant, then the notes: nothing cut, lines wrap. ``mono``: our
        monotonic clock at ``now`` (``monotonic``)."""
        return draw_blocks(self, now, mono=mono)

    def rows_of(self, now: float, width: int, height: int | None, *, mono: float | None = None) -> Group:
        """A summary line and one line per participant, cut at ``width``; with ``height``, those
        with a problem first and the rest counted in one line when they are more than fit."""
        return draw_rows(self, now, width, height, mono=mono)
