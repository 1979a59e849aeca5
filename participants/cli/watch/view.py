"""What ``ckpt-events watch`` shows: per participant, its state from ``/status`` and its open work from logs.

``FleetView`` folds poll results and followed events in and renders them (rich ``Text``, no
markup: every string from a participant or a log is shown with its control characters escaped,
so it cannot move the cursor or recolour the terminal). Two layouts:

- **blocks** (a few participants): one block of short lines per participant; lines wrap at the
  console's width and nothing is cut;
- **rows** (more than ``ROWS_OVER`` participants, or blocks taller than the terminal): a summary
  line, then one line per participant, cut at the width with an ellipsis (long names and ids are
  cut in the middle, keeping their distinct end); when the rows are taller than the terminal,
  those with a problem come first and the rest are counted.

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
from typing import TYPE_CHECKING, Final

from rich.console import Group
from rich.text import Text

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
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Outcome, Phase

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

__all__ = ["CLOCK_NOTE_S", "LAST_CHECKPOINTS", "MAX_FROM_LOGS", "ROWS_OVER", "STEP_BACK_S", "FleetView"]

#: Participants known from the logs alone that the view tracks; past it, counted in a note (a
#: log naming 100,000 instances took 353 MiB and 19 s a frame). Those polled by URL always are.
MAX_FROM_LOGS: Final = 1024
#: Participants not tracked that are told apart, to count them (~200 bytes each).
_UNTRACKED_KEPT: Final = 100_000
#: How many past outcomes each participant shows.
LAST_CHECKPOINTS: Final = 3
#: Past this many participants the view is one row each.
ROWS_OVER: Final = 12
#: A participant's clock off ours by more than this (seconds) is said on its line.
CLOCK_NOTE_S: Final = 1.0
#: At most this many blockers are named; the count says how many there are.
_BLOCKERS_SHOWN: Final = 3
#: The lease turns red under this fraction of the lease it was given.
_LEASE_RED: Final = 0.2
#: Open spans kept per participant; past it, new ones are counted, not shown.
_MAX_OPEN: Final = 1000
#: Spans seen to end kept per participant, so that a start read after its end (two files read
#: one after the other) does not open it again (~100 bytes each). Oldest let go with
#: ``OrderedDict.popitem``: a dict's ``del d[next(iter(d))]`` walks past the entries deleted
#: before it (1,000,000 evictions past 1,000: 1.0 s against 0.35, measured here).
_ENDED_KEPT: Final = 1000
#: Work stamped this far in our future by a participant of known clock is shown as just opened.
_FUTURE_SLACK_S: Final = 0.5


class _Age:
    """An open operation's age by the participant's clock: ``seconds`` (``None``: unknown, with
    ``why``; ``at_least``: a lower bound), and whether it is certainly stalled."""

    __slots__ = ("at_least", "seconds", "short", "stalled", "why")

    def __init__(
        self, seconds: float | None, stalled: bool, why: str = "", short: str = "", *, at_least: bool = False
    ) -> None:
        self.seconds = seconds
        self.stalled = stalled
        self.why = why
        #: ``why`` in a word or two, for one line per participant.
        self.short = short or why
        self.at_least = at_least

    def shown(self, *, short: bool = False) -> str:
        """The age as a line shows it: ``12.3 s``, ``>=12.3 s`` or ``age unknown (why)``."""
        if self.seconds is None:
            return f"age unknown ({self.short if short else self.why})"
        return (">=" if self.at_least else "") + _seconds(self.seconds)


class _Wait:
    """What the controller's overdue open operation waits on: ``on``, the participants whose
    calls of it are open (name, whether that call is stalled); else ``held`` (nothing of it in
    flight: the controller holds it, a stall of its own) or not known (``why``)."""

    __slots__ = ("held", "on", "why")

    def __init__(
        self, on: Sequence[tuple[tuple[str, str], bool]] = (), *, held: bool = False, why: str = ""
    ) -> None:
        self.on = list(on)
        self.held = held
        self.why = why


def _on_worker(item: Open) -> str:
    """`` on worker N`` for a ``serve --workers`` worker's work, else nothing: its main process
    and a worker may each hold the same checkpoint's operation open, and which one hung matters."""
    return "" if item.worker is None else f" on worker {item.worker}"


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
        self._stages: collections.OrderedDict[tuple[int, int], tuple[int | None, bool, str]] = (
            collections.OrderedDict()
        )
        #: Who answered a call of the controller's span (trace, calling span), last spans kept.
        self._answered: collections.OrderedDict[tuple[int, int], set[tuple[str, str]]] = (
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

    def _notes(self) -> list[str]:
        """The notes, and the participants in the logs not tracked."""
        if not self.untracked:
            return self.notes
        count = f"{len(self.untracked):,}" + ("+" if len(self.untracked) >= _UNTRACKED_KEPT else "")
        more = f"{count} more participants in the logs not tracked (past {MAX_FROM_LOGS:,})"
        return [*self.notes, more]

    def add_polls(self, results: Iterable[PollResult], now: float, *, mono: float | None = None) -> None:
        """Fold in one round of ``/status`` answers (``now``: Unix seconds; ``mono``: our
        monotonic clock then, ``_monotonic``). A URL answering as a participant another URL of
        the round answered as first (two servers started with one instance) is shown as that,
        never folded in: their phases and clocks would mix."""
        at = _monotonic(now, mono)
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
        ``mono``: our monotonic clock at ``now`` (``_monotonic``). ``ended``: spans whose end
        was read in a line this version could not decode (``LogFollower.ended``): ended, never
        open (their outcome unknown); the last ``_ENDED_KEPT`` are remembered."""
        read_at = time.time() if now is None else now
        read_mono = _monotonic(now, mono)
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
                line = (
                    f"{escape(event.checkpoint_id or '-')} {escape(event.operation)} {escape(event.outcome)} "
                    f"{_ms(took)}"
                )
                self._arrival += 1
                bisect.insort(seen.outcomes, (event.end_ns, self._arrival, line))
                del seen.outcomes[:-LAST_CHECKPOINTS]
            elif isinstance(event, StageStarted | StageFinished):
                key = (event.trace_id, event.span_id)
                # Its end may be read before its start (two files): an ended stage stays ended.
                still = isinstance(event, StageStarted) and self._stages.get(key, (None, True, ""))[1]
                self._stages[key] = (event.parent_span_id, still, event.stage)
                if len(self._stages) > _ENDED_KEPT:
                    self._stages.popitem(last=False)
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
            ahead = _least_ahead(seen, item)
            if ahead is not None and ahead <= STEP_FORWARD_S:
                item.read_age = max(read_at + ahead - item.start_ns / 1e9, 0.0)

    def _answer(self, caller: tuple[int, int], who: tuple[str, str]) -> None:
        """``who`` answered a call the controller's span ``caller`` made (its operation ended)."""
        answered = self._answered.get(caller)
        if answered is None:
            answered = self._answered[caller] = set()
            if len(self._answered) > _ENDED_KEPT:
                self._answered.popitem(last=False)
        answered.add(who)

    def render(
        self, now: float | None = None, *, rows: bool | None = None, mono: float | None = None
    ) -> _Rendered:
        """The view at ``now`` (Unix seconds), laid out when printed: ``rows`` as in the
        constructor (``None``: the view's own choice); ``mono``: our monotonic clock at ``now``
        (``_monotonic``)."""
        return _Rendered(
            self,
            time.time() if now is None else now,
            self.rows if rows is None else rows,
            _monotonic(now, mono),
        )

    # -- what each participant is --------------------------------------------------------------

    def _keys(self) -> list[tuple[str | None, tuple[str, str] | None]]:
        """(url, participant) of every entry: polled ones in the order given, then those only
        in logs (the controller only while it has open work)."""
        entries: list[tuple[str | None, tuple[str, str] | None]] = []
        shown: set[tuple[str, str]] = set()
        for url in self.urls:
            status = getattr(self.polls.get(url), "status", None)
            key = self.answered.get(url) if status is None else (str(status.kind), status.instance)
            if key is not None:
                shown.add(key)
            entries.append((url, key))
        for key, seen in self.seen.items():
            if key not in shown and (key[0] != Kind.CONTROLLER.value or seen.open):
                entries.append((None, key))
        return entries

    def _age(self, seen: Seen, item: Open, now: float, mono: float, polled: bool) -> _Age:
        if item.cut is not None:
            # Was: aged from when the backlog was read, then STALLED, though it finished in the
            # newer file (not given); a stall report in the rotated file is as stale.
            why = f"read from {escape(item.cut)}, a rotated file: it may have ended in a newer one not given"
            return _Age(None, False, why, "rotated file")
        if item.passed:
            return _Age(None, False, "later work finished since: restarted?", "restarted?")
        if item.stepped or item.back:  # ``back``: of the clock before a step, if one stepped
            why = "its stamps went back since it opened: clock stepped back?"
            return _Age(None, item.stalled, why, "clock back?")
        clock = seen.clock(now - mono) if polled else None
        correction, uncertainty = clock if clock is not None else (0.0, 0.0)
        age = now + correction - item.start_ns / 1e9
        if age < 0:
            if clock is not None and -age <= uncertainty + _FUTURE_SLACK_S:
                return _Age(0.0, item.stalled)
            return _Age(
                None,
                item.stalled,
                f"stamped {_seconds(-age)} in our future: its clock is ahead",
                "clock ahead",
            )
        if clock is None:
            # Its clock against ours is unknown (was: taken as ours, so a clock 60 s behind made
            # work a minute old, STALLED): the least age its own stamps and our reads allow.
            ahead = _least_ahead(seen, item)
            if ahead is None:
                ahead = item.start_ns / 1e9 - now
            least = max(now + ahead - item.start_ns / 1e9, 0.0)
            # What our monotonic clock measured since we read its start: true whatever a wall
            # clock did. Past it by more than a read's lag, ours or its writer's clock stepped
            # forward (was: an hour's step made a commit open 5 s ">=60.1 min STALLED").
            measured = item.read_age + max(mono - item.read_mono, 0.0)
            if least > measured + STEP_FORWARD_S:
                least = measured
            least = max(least, measured)
            return _Age(least, item.stalled or least >= self.stall_after, at_least=True)
        return _Age(age, item.stalled or age - uncertainty >= self.stall_after)

    def _waits(self, span: tuple[int, int], now: float, mono: float) -> _Wait:
        """What the controller's open operation ``span`` (trace, span) waits on, by its calls (a
        participant's operation whose parent is it or one of its stages). A controller waiting
        on a stuck participant is not stalled itself (was: both marked STALLED, so a reader saw
        two stalls); it is only when nothing of it is in flight, and unknown when that is not
        known (its calls' logs not read)."""
        trace, own = span
        stages = {
            s: (still, name) for (t, s), (p, still, name) in self._stages.items() if t == trace and p == own
        }
        callers = {own, *stages}
        polled = {
            (str(r.status.kind), r.status.instance) for r in self.polls.values() if r.status is not None
        }
        on: list[tuple[tuple[str, str], bool]] = []
        for who, seen in self.seen.items():
            if who[0] == Kind.CONTROLLER.value:
                continue
            calls = [i for i in seen.open.values() if i.trace_id == trace and i.parent in callers]
            if calls:
                stalled = any(self._age(seen, i, now, mono, who in polled).stalled for i in calls)
                on.append((who, stalled))
        if on:
            on.sort(key=lambda entry: (not entry[1], entry[0]))  # the stalled first
            return _Wait(on)
        if open_stages := [name for still, name in stages.values() if still]:
            kinds = ", ".join(escape(name) for name in sorted(open_stages))
            return _Wait(why=f"its {kinds} calls are in none of the logs read")
        if stages:
            return _Wait(held=True)  # its stages (its fan-outs) ended: nothing of it in flight
        answered = set().union(*(self._answered.get((trace, c), set()) for c in callers))
        known = {who for who in self.seen if who[0] != Kind.CONTROLLER.value} | polled
        if answered and known <= answered:
            return _Wait(held=True)  # every participant answered its call
        return _Wait(why="none of its calls in flight is in the logs read")

    def _said(self, text: Text, age: _Age, wait: _Wait | None, *, short: bool) -> bool:
        """Append what an overdue open operation's line says after its age: STALLED for the
        party that holds it, what the controller's waits on (``wait``); whether it is a problem
        of its own (a participant it waits on is one of its own line)."""
        if not age.stalled:
            return False
        if wait is None or wait.held:
            text.append(" STALLED", style="bold red")
            return True
        if not wait.on:
            text.append(
                " holder unknown" if short else f", stalled or waiting: unknown ({wait.why})", style="yellow"
            )
            return True
        shown = wait.on[: 1 if short else _BLOCKERS_SHOWN]
        names = ", ".join(
            (self._name(None, who) if short else f"{escape(who[0])}/{escape(who[1])}")
            + (" (stalled)" if stalled else "")
            for who, stalled in shown
        )
        more = len(wait.on) - len(shown)
        tail = (f" +{more}" if short else f" and {more} more") if more else ""
        text.append((" " if short else ", ") + f"waiting on {names}{tail}", style="yellow")
        return False

    def _lease_left(self, seen: Seen, lease_at: float, now: float, mono: float) -> float:
        return max(lease_at - (now + correction(seen, now - mono)), 0.0)

    # -- blocks ---------------------------------------------------------------------------------

    def _block(self, url: str | None, key: tuple[str, str] | None, now: float, mono: float) -> Text:
        result = None if url is None else self.polls.get(url)
        if key is None:
            if result is None:
                return Text(f"{escape(url)}  waiting for the first answer", style="dim")
            return Text(f"{escape(url)}  {escape(result.error)}", style="bold red")
        kind, instance = key
        seen = self.seen.get(key) or Seen()
        text = Text()
        text.append(f"{escape(kind)} {escape(instance)}", style="bold")
        if result is not None:
            text.append(f"  {escape(result.url)}", style="dim")
        if (clock := _clock_note(seen, now - mono)) and result is not None:
            text.append(f"  {clock}", style="yellow")
        status = None if result is None else result.status
        if status is not None:
            text.append(f"\n  phase {escape(status.phase)}")
            text.append(f"  checkpoint {escape(status.checkpoint_id or '-')}")
            text.append(f"  for {'>=' if seen.at_start else ''}{_seconds(max(mono - seen.since, 0.0))}")
            if status.lease_expires_at is not None:
                left = self._lease_left(seen, status.lease_expires_at, now, mono)
                text.append("  lease ")
                text.append(f"{_seconds(left)} left", style="bold red" if self._lease_red(seen, left) else "")
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
            elif status.phase == Phase.PREPARING:
                text.append("\n  readiness not reported yet", style="yellow")
        elif result is not None:  # it answered before: now its error, beside what its logs say
            text.append(f"\n  {escape(result.error or 'no answer')}", style="bold red")
        elif kind != Kind.CONTROLLER.value or instance != CONTROLLER_INSTANCE:
            text.append("\n  (from logs only)", style="dim")
        for span, item in sorted(seen.open.items(), key=lambda entry: entry[1].start_ns):
            age = self._age(seen, item, now, mono, status is not None)
            shown = age.shown()
            what = f"{escape(item.operation)} {escape(item.checkpoint_id or '-')}{_on_worker(item)}"
            text.append(f"\n  open {what} {shown}")
            wait = self._waits(span, now, mono) if age.stalled and kind == Kind.CONTROLLER.value else None
            self._said(text, age, wait, short=False)
        if seen.untracked:
            text.append(f"\n  and {seen.untracked} more open, not tracked", style="yellow")
        if seen.outcomes:
            text.append("\n  last: " + " | ".join(line for _, _, line in seen.outcomes), style="dim")
        return text

    def _lease_red(self, seen: Seen, left: float) -> bool:
        return seen.grace is not None and left < _LEASE_RED * seen.grace

    def blocks(self, now: float, *, mono: float | None = None) -> Group:
        """One block per participant, then the notes: nothing cut, lines wrap. ``mono``: our
        monotonic clock at ``now`` (``_monotonic``)."""
        at = _monotonic(now, mono)
        blocks = [self._block(url, key, now, at) for url, key in self._keys()]
        if not blocks:
            blocks.append(Text("nothing to watch yet", style="dim"))
        blocks.extend(Text(escape(note), style="yellow") for note in self._notes())
        return Group(*blocks)

    # -- rows -----------------------------------------------------------------------------------

    def _row(
        self, url: str | None, key: tuple[str, str] | None, now: float, mono: float, name_width: int
    ) -> tuple[Text, bool]:
        """One participant's line, and whether it has a problem (unreachable, not ready, a red
        lease, stalled work)."""
        result = None if url is None else self.polls.get(url)
        text = Text(no_wrap=True, overflow="ellipsis")
        if key is None:
            text.append(_middle(self._name(url, key), name_width).ljust(name_width), style="bold")
            if result is None:
                text.append("  waiting for the first answer", style="dim")
                return text, False
            text.append(f"  {escape(result.error)}", style="bold red")
            return text, True
        kind, instance = key
        seen = self.seen.get(key) or Seen()
        text.append(_middle(self._name(url, key), name_width).ljust(name_width), style="bold")
        # What is wrong comes first, so that a line cut at the width keeps it: readiness, stalled
        # work, the lease; then the checkpoint, the clock and the last outcome.
        problem = False
        status = None if result is None else result.status
        report = None if status is None else status.report
        if status is not None:
            text.append(f"  {escape(status.phase)}")
            if report is not None and not report.ready:
                text.append(f"  NOT READY {report.blocker_count}", style="bold red")
                problem = True
            elif report is not None and status.phase != Phase.IDLE:
                text.append("  ready", style="green")
        elif result is not None:  # it answered before: now its error, beside what its logs say
            text.append(f"  {escape(result.error or 'no answer')}", style="bold red")
            problem = True
        elif kind != Kind.CONTROLLER.value or instance != CONTROLLER_INSTANCE:
            text.append("  (logs only)", style="dim")
        spans = sorted(seen.open.items(), key=lambda entry: entry[1].start_ns)
        items = [item for _, item in spans]
        ages = [self._age(seen, item, now, mono, status is not None) for item in items]
        if items:
            first = next((i for i, a in enumerate(ages) if a.stalled), 0)
            item = items[first]
            age = ages[first]
            shown = age.shown(short=True)
            text.append(f"  open {escape(item.operation)}{_on_worker(item)} {shown}")
            controller = age.stalled and kind == Kind.CONTROLLER.value
            wait = self._waits(spans[first][0], now, mono) if controller else None
            problem |= self._said(text, age, wait, short=True)
            if len(items) + seen.untracked > 1:
                text.append(f" +{len(items) + seen.untracked - 1}")
        if status is not None:
            if status.lease_expires_at is not None:
                left = self._lease_left(seen, status.lease_expires_at, now, mono)
                red = self._lease_red(seen, left)
                problem |= red
                text.append(f"  lease {_seconds(left)}", style="bold red" if red else "")
            if status.checkpoint_id is not None:
                text.append(f"  {_middle(escape(status.checkpoint_id), 24)}")
            if clock := _clock_note(seen, now - mono, short=True):
                text.append(f"  {clock}", style="yellow")
        if seen.outcomes:
            text.append(f"  last {seen.outcomes[-1][2]}", style="dim")
        return text, problem

    def rows_of(self, now: float, width: int, height: int | None, *, mono: float | None = None) -> Group:
        """A summary line and one line per participant, cut at ``width``; with ``height``, those
        with a problem first and the rest counted in one line when they are more than fit."""
        entries = self._keys()
        names = [self._name(url, key) for url, key in entries]
        name_width = min(max((len(n) for n in names), default=8), max(12, min(32, width // 4)))
        at = _monotonic(now, mono)
        rows = [self._row(url, key, now, at, name_width) for url, key in entries]
        phases = collections.Counter(
            escape(r.status.phase) for r in self.polls.values() if r.status is not None and r.url in self.urls
        )
        failed = sum(1 for url in self.urls if getattr(self.polls.get(url), "failure", None) is not None)
        problems = sum(1 for _, bad in rows if bad)
        summary = Text(no_wrap=True, overflow="ellipsis")
        summary.append(f"{len(entries)} participants: ", style="bold")
        summary.append(
            ", ".join(f"{count} {phase}" for phase, count in sorted(phases.items())) or "none polled"
        )
        if failed:
            summary.append(f", {failed} not read", style="bold red")
        summary.append(
            f"; {problems} with a problem" if problems else "; no problem",
            style="bold red" if problems else "green",
        )
        notes = [
            Text(escape(note), style="yellow", no_wrap=True, overflow="ellipsis") for note in self._notes()
        ]
        lines = [text for text, _ in rows]
        if height is not None and 1 + len(lines) + len(notes) > height:
            notes = notes[: max(height // 4, 1)]
            room = max(height - 2 - len(notes), 1)
            ordered = [text for text, bad in rows if bad] + [text for text, bad in rows if not bad]
            left = ordered[room:]
            lines = ordered[:room]
            if left:
                hidden = problems - min(problems, room)
                what = f", {hidden} of them with a problem" if hidden else ", none with a problem"
                lines.append(Text(f"... and {len(left)} more participants{what}", style="dim"))
        out = [summary, *lines, *notes]
        for text in out:
            text.truncate(width, overflow="ellipsis")
        return Group(*out)

    def _name(self, url: str | None, key: tuple[str, str] | None) -> str:
        if key is None:  # a URL: without its scheme, the width goes to its host and port
            return escape(str(url).split("://", 1)[-1])
        kind, instance = key
        if kind == Kind.CONTROLLER.value and instance == CONTROLLER_INSTANCE:
            return "controller"
        return escape(instance if instance.startswith(kind) else f"{kind} {instance}")


class _Rendered:
    """The view at one instant, laid out for the console it is printed on."""

    def __init__(self, view: FleetView, now: float, rows: bool | None, mono: float) -> None:
        self.view = view
        self.now = now
        self.mono = mono
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        view = self.view
        width = options.max_width
        # A terminal's live view cannot scroll: rows when the blocks are taller than it. A pipe
        # has no height: rows only past ROWS_OVER participants, and every row is printed.
        height = console.height - 2 if console.is_terminal else None  # less the title's line
        rows = self.rows
        if rows is None:
            rows = len(view._keys()) > ROWS_OVER
            if not rows and height is not None:
                blocks = view.blocks(self.now, mono=self.mono)
                if len(console.render_lines(blocks, options, pad=False)) <= height:
                    yield blocks
                    return
                rows = True
        if rows:
            yield view.rows_of(self.now, width, height, mono=self.mono)
        else:
            yield view.blocks(self.now, mono=self.mono)


def _monotonic(now: float | None, mono: float | None) -> float:
    """Our monotonic clock at ``now``: ``mono``; not given, ``time.monotonic()`` moved by as much
    as ``now`` is from ``time.time()`` (a caller's own instant, as tests give one). Open work is at
    least as old as this clock measured since its start was read (``Open.read_mono``)."""
    if mono is not None:
        return mono
    return time.monotonic() + (0.0 if now is None else now - time.time())


def _least_ahead(seen: Seen, item: Open) -> float | None:
    """The least its clock can be ahead of ours for ``item``, by its logs. Opened since its
    stamps went back: by the stamps since, the least of what a step or a batch written late
    would make it."""
    back = seen.ahead_since_back(item.worker)
    return seen.ahead(item.worker) if back is None else back


def _clock_note(seen: Seen, base: float, *, short: bool = False) -> str:
    """What the participant's line says of its clock, when it is off ours past ``CLOCK_NOTE_S``
    (``base``: our wall clock minus our monotonic clock now)."""
    clock = seen.clock(base)
    if clock is None or abs(clock[0]) < CLOCK_NOTE_S:
        return ""
    offset = clock[0]
    if short:
        return f"clock {offset:+.0f} s"
    side = "behind" if offset < 0 else "ahead of"
    return f"clock {_seconds(abs(offset))} {side} ours: ages corrected"


def _middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` in its middle, keeping its start and its distinct end."""
    if len(text) <= width:
        return text
    end = min(8, max(width // 3, 1))
    return text[: max(width - end - 1, 0)] + "…" + text[-end:]


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else _seconds(value / 1000)
