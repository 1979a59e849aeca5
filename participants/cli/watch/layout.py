"""How ``watch`` draws a ``FleetView`` at an instant: what each participant's open work is (its
age by the participant's clock, what the controller's waits on), laid out in one of two layouts:

- **blocks** (a few participants): one block of short lines per participant; lines wrap at the
  console's width and nothing is cut;
- **rows** (more than ``ROWS_OVER`` participants, or blocks taller than the terminal): a summary
  line, then one line per participant, cut at the width with an ellipsis (long names and ids are
  cut in the middle, keeping their distinct end); when the rows are taller than the terminal,
  those with a problem come first and the rest are counted.

Every string from a participant or a log is shown with its control characters escaped (rich
``Text``, no markup), so it cannot move the cursor or recolour the terminal. What is drawn is
folded in by ``view``; this module reads it and changes nothing.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from rich.console import Group
from rich.text import Text

from ckpt_events.participants.cli.text import escape
from ckpt_events.participants.cli.watch.seen import STEP_FORWARD_S, Open, Seen, correction
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Phase

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from ckpt_events.participants.cli.watch.view import FleetView

__all__ = [
    "CLOCK_NOTE_S",
    "ROWS_OVER",
    "Rendered",
    "draw_blocks",
    "draw_rows",
    "least_ahead",
    "monotonic",
    "ms",
    "on_worker",
    "seconds",
]


#: Past this many participants the view is one row each.
ROWS_OVER: Final = 12
#: A participant's clock off ours by more than this (seconds) is said on its line.
CLOCK_NOTE_S: Final = 1.0
#: At most this many blockers are named; the count says how many there are.
_BLOCKERS_SHOWN: Final = 3
#: The lease turns red under this fraction of the lease it was given.
_LEASE_RED: Final = 0.2
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
        return (">=" if self.at_least else "") + seconds(self.seconds)


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


def on_worker(worker: int | None) -> str:
    """`` on worker N`` for a ``serve --workers`` worker's work, else nothing: its main process
    and a worker may each hold the same checkpoint's operation open (or end it), and which one
    hung matters."""
    return "" if worker is None else f" on worker {worker}"


# -- what each participant is --------------------------------------------------------------


def _entries(view: FleetView) -> list[tuple[str | None, tuple[str, str] | None]]:
    """(url, participant) of every entry: polled ones in the order given, then those only
    in logs (the controller only while it has open work)."""
    entries: list[tuple[str | None, tuple[str, str] | None]] = []
    shown: set[tuple[str, str]] = set()
    for url in view.urls:
        status = getattr(view.polls.get(url), "status", None)
        key = view.answered.get(url) if status is None else (str(status.kind), status.instance)
        if key is not None:
            shown.add(key)
        entries.append((url, key))
    for key, seen in view.seen.items():
        if key not in shown and (key[0] != Kind.CONTROLLER.value or seen.open):
            entries.append((None, key))
    return entries


def _age(view: FleetView, seen: Seen, item: Open, now: float, mono: float, polled: bool) -> _Age:
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
            f"stamped {seconds(-age)} in our future: its clock is ahead",
            "clock ahead",
        )
    if clock is None:
        # Its clock against ours is unknown (was: taken as ours, so a clock 60 s behind made
        # work a minute old, STALLED): the least age its own stamps and our reads allow.
        ahead = least_ahead(seen, item)
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
        return _Age(least, item.stalled or least >= view.stall_after, at_least=True)
    return _Age(age, item.stalled or age - uncertainty >= view.stall_after)


def _waits(view: FleetView, span: tuple[int, int], now: float, mono: float) -> _Wait:
    """What the controller's open operation ``span`` (trace, span) waits on, by its calls (a
    participant's operation whose parent is it or one of its stages). A controller waiting
    on a stuck participant is not stalled itself (was: both marked STALLED, so a reader saw
    two stalls); it is only when nothing of it is in flight, and unknown when that is not
    known (its calls' logs not read)."""
    trace, own = span
    stages = {s: (still, name) for (t, s), (p, still, name) in view.stages.items() if t == trace and p == own}
    callers = {own, *stages}
    polled = {(str(r.status.kind), r.status.instance) for r in view.polls.values() if r.status is not None}
    on: list[tuple[tuple[str, str], bool]] = []
    for who, seen in view.seen.items():
        if who[0] == Kind.CONTROLLER.value:
            continue
        calls = [i for i in seen.open.values() if i.trace_id == trace and i.parent in callers]
        if calls:
            stalled = any(_age(view, seen, i, now, mono, who in polled).stalled for i in calls)
            on.append((who, stalled))
    if on:
        on.sort(key=lambda entry: (not entry[1], entry[0]))  # the stalled first
        return _Wait(on)
    if open_stages := [name for still, name in stages.values() if still]:
        kinds = ", ".join(escape(name) for name in sorted(open_stages))
        return _Wait(why=f"its {kinds} calls are in none of the logs read")
    if stages:
        return _Wait(held=True)  # its stages (its fan-outs) ended: nothing of it in flight
    answered = set().union(*(view.answered_calls.get((trace, c), set()) for c in callers))
    known = {who for who in view.seen if who[0] != Kind.CONTROLLER.value} | polled
    if answered and known <= answered:
        return _Wait(held=True)  # every participant answered its call
    return _Wait(why="none of its calls in flight is in the logs read")


def _said(view: FleetView, text: Text, age: _Age, wait: _Wait | None, *, short: bool) -> bool:
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
        (_name(None, who) if short else f"{escape(who[0])}/{escape(who[1])}")
        + (" (stalled)" if stalled else "")
        for who, stalled in shown
    )
    more = len(wait.on) - len(shown)
    tail = (f" +{more}" if short else f" and {more} more") if more else ""
    text.append((" " if short else ", ") + f"waiting on {names}{tail}", style="yellow")
    return False


def _lease_left(view: FleetView, seen: Seen, lease_at: float, now: float, mono: float) -> float:
    return max(lease_at - (now + correction(seen, now - mono)), 0.0)


# -- blocks ---------------------------------------------------------------------------------


def _block(view: FleetView, url: str | None, key: tuple[str, str] | None, now: float, mono: float) -> Text:
    result = None if url is None else view.polls.get(url)
    if key is None:
        if result is None:
            return Text(f"{escape(url)}  waiting for the first answer", style="dim")
        return Text(f"{escape(url)}  {escape(result.error)}", style="bold red")
    kind, instance = key
    seen = view.seen.get(key) or Seen()
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
        text.append(f"  for {'>=' if seen.at_start else ''}{seconds(max(mono - seen.since, 0.0))}")
        if status.lease_expires_at is not None:
            left = _lease_left(view, seen, status.lease_expires_at, now, mono)
            text.append("  lease ")
            text.append(f"{seconds(left)} left", style="bold red" if _lease_red(view, seen, left) else "")
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
        age = _age(view, seen, item, now, mono, status is not None)
        shown = age.shown()
        what = f"{escape(item.operation)} {escape(item.checkpoint_id or '-')}{on_worker(item.worker)}"
        text.append(f"\n  open {what} {shown}")
        wait = _waits(view, span, now, mono) if age.stalled and kind == Kind.CONTROLLER.value else None
        _said(view, text, age, wait, short=False)
    if seen.untracked:
        text.append(f"\n  and {seen.untracked} more open, not tracked", style="yellow")
    if seen.outcomes:
        text.append("\n  last: " + " | ".join(line for _, _, line in seen.outcomes), style="dim")
    return text


def _lease_red(view: FleetView, seen: Seen, left: float) -> bool:
    return seen.grace is not None and left < _LEASE_RED * seen.grace


def draw_blocks(view: FleetView, now: float, *, mono: float | None = None) -> Group:
    """One block per participant, then the notes: nothing cut, lines wrap. ``mono``: our
    monotonic clock at ``now`` (``monotonic``)."""
    at = monotonic(now, mono)
    blocks = [
        _block(view, url, key, now, at)
        for url, key in _entries(
            view,
        )
    ]
    if not blocks:
        blocks.append(Text("nothing to watch yet", style="dim"))
    blocks.extend(Text(escape(note), style="yellow") for note in view.shown_notes())
    return Group(*blocks)


# -- rows -----------------------------------------------------------------------------------


def _row(
    view: FleetView, url: str | None, key: tuple[str, str] | None, now: float, mono: float, name_width: int
) -> tuple[Text, bool]:
    """One participant's line, and whether it has a problem (unreachable, not ready, a red
    lease, stalled work)."""
    result = None if url is None else view.polls.get(url)
    text = Text(no_wrap=True, overflow="ellipsis")
    if key is None:
        text.append(_middle(_name(url, key), name_width).ljust(name_width), style="bold")
        if result is None:
            text.append("  waiting for the first answer", style="dim")
            return text, False
        text.append(f"  {escape(result.error)}", style="bold red")
        return text, True
    kind, instance = key
    seen = view.seen.get(key) or Seen()
    text.append(_middle(_name(url, key), name_width).ljust(name_width), style="bold")
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
    ages = [_age(view, seen, item, now, mono, status is not None) for item in items]
    if items:
        first = next((i for i, a in enumerate(ages) if a.stalled), 0)
        item = items[first]
        age = ages[first]
        shown = age.shown(short=True)
        text.append(f"  open {escape(item.operation)}{on_worker(item.worker)} {shown}")
        controller = age.stalled and kind == Kind.CONTROLLER.value
        wait = _waits(view, spans[first][0], now, mono) if controller else None
        problem |= _said(view, text, age, wait, short=True)
        if len(items) + seen.untracked > 1:
            text.append(f" +{len(items) + seen.untracked - 1}")
    if status is not None:
        if status.lease_expires_at is not None:
            left = _lease_left(view, seen, status.lease_expires_at, now, mono)
            red = _lease_red(view, seen, left)
            problem |= red
            text.append(f"  lease {seconds(left)}", style="bold red" if red else "")
        if status.checkpoint_id is not None:
            text.append(f"  {_middle(escape(status.checkpoint_id), 24)}")
        if clock := _clock_note(seen, now - mono, short=True):
            text.append(f"  {clock}", style="yellow")
    if seen.outcomes:
        text.append(f"  last {seen.outcomes[-1][2]}", style="dim")
    return text, problem


def draw_rows(
    view: FleetView, now: float, width: int, height: int | None, *, mono: float | None = None
) -> Group:
    """A summary line and one line per participant, cut at ``width``; with ``height``, those
    with a problem first and the rest counted in one line when they are more than fit."""
    entries = _entries(
        view,
    )
    names = [_name(url, key) for url, key in entries]
    name_width = min(max((len(n) for n in names), default=8), max(12, min(32, width // 4)))
    at = monotonic(now, mono)
    rows = [_row(view, url, key, now, at, name_width) for url, key in entries]
    phases = collections.Counter(
        escape(r.status.phase) for r in view.polls.values() if r.status is not None and r.url in view.urls
    )
    failed = sum(1 for url in view.urls if getattr(view.polls.get(url), "failure", None) is not None)
    problems = sum(1 for _, bad in rows if bad)
    summary = Text(no_wrap=True, overflow="ellipsis")
    summary.append(f"{len(entries)} participants: ", style="bold")
    summary.append(", ".join(f"{count} {phase}" for phase, count in sorted(phases.items())) or "none polled")
    if failed:
        summary.append(f", {failed} not read", style="bold red")
    summary.append(
        f"; {problems} with a problem" if problems else "; no problem",
        style="bold red" if problems else "green",
    )
    notes = [
        Text(escape(note), style="yellow", no_wrap=True, overflow="ellipsis") for note in view.shown_notes()
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


def _name(url: str | None, key: tuple[str, str] | None) -> str:
    if key is None:  # a URL: without its scheme, the width goes to its host and port
        return escape(str(url).split("://", 1)[-1])
    kind, instance = key
    if kind == Kind.CONTROLLER.value and instance == CONTROLLER_INSTANCE:
        return "controller"
    return escape(instance if instance.startswith(kind) else f"{kind} {instance}")


class Rendered:
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
            rows = len(_entries(view)) > ROWS_OVER
            if not rows and height is not None:
                blocks = draw_blocks(view, self.now, mono=self.mono)
                if len(console.render_lines(blocks, options, pad=False)) <= height:
                    yield blocks
                    return
                rows = True
        if rows:
            yield draw_rows(view, self.now, width, height, mono=self.mono)
        else:
            yield draw_blocks(view, self.now, mono=self.mono)


def monotonic(now: float | None, mono: float | None) -> float:
    """Our monotonic clock at ``now``: ``mono``; not given, ``time.monotonic()`` moved by as much
    as ``now`` is from ``time.time()`` (a caller's own instant, as tests give one). Open work is at
    least as old as this clock measured since its start was read (``Open.read_mono``)."""
    if mono is not None:
        return mono
    return time.monotonic() + (0.0 if now is None else now - time.time())


def least_ahead(seen: Seen, item: Open) -> float | None:
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
    return f"clock {seconds(abs(offset))} {side} ours: ages corrected"


def _middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` in its middle, keeping its start and its distinct end."""
    if len(text) <= width:
        return text
    end = min(8, max(width // 3, 1))
    return text[: max(width - end - 1, 0)] + "…" + text[-end:]


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else seconds(value / 1000)
