"""``ckpt-events watch``: a live view of a fleet, refreshed once a second.

Polls every ``--participant``'s ``GET /status`` (so it works with telemetry off) and follows
``--follow`` JSON-lines logs for open operations (``follow.LogFollower``). On a terminal the view
redraws in place; piped (or on ``TERM=dumb``), it prints one plain snapshot per interval;
``--once`` prints one and exits with ``EXIT_UNREACHABLE`` or ``EXIT_REFUSED`` when a participant
could not be read, so it serves as a health check.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import anyio

from ckpt_events.participants.cli.command import (
    Command,
    CommandError,
    console,
    given_path,
    seconds_in,
    sigterm_as_interrupt,
)
from ckpt_events.participants.cli.serve import ENV_TOKEN
from ckpt_events.participants.cli.text import escape, say
from ckpt_events.participants.errors import shown

if TYPE_CHECKING:
    # The view draws with rich, the `cli` extra: imported when a watch runs, so that
    # `ckpt-events --help` (and its one-line "install the cli extra") works without it.
    from rich.console import RenderableType

    from ckpt_events.participants.cli.watch.sources import EventSource, PollResult
    from ckpt_events.participants.cli.watch.view import FleetView

__all__ = ["EXIT_REFUSED", "EXIT_UNREACHABLE", "WATCH", "live", "once_status", "plain", "show", "snapshot"]

_ENV_STALL_AFTER: Final = "CKPT_EVENTS_STALL_AFTER"
#: ``--once``: a participant could not be read (no connection, no answer in time, a failed TLS
#: handshake, not a status, or the status of a participant another URL answered as), or a log
#: named by ``--follow`` as a file.
EXIT_UNREACHABLE: Final = 2
#: ``--once``: a participant refused the token (401/403); wins over ``EXIT_UNREACHABLE``.
EXIT_REFUSED: Final = 3
_UNREACHABLE_FIX: Final = " (check the URL and that it runs; --timeout for a slow one)"


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--participant",
        action="append",
        default=[],
        metavar="URL",
        help="a participant's base URL (repeatable)",
    )
    parser.add_argument("--participants-file", type=given_path, help="a file with one participant URL a line")
    parser.add_argument(
        "--follow",
        nargs="+",
        default=[],
        metavar="LOG",
        help="JSON-lines logs to tail: files, globs, folders",
    )
    parser.add_argument(
        "--token-file", type=given_path, help=f"file holding the control token (else ${ENV_TOKEN})"
    )
    parser.add_argument(
        "--interval",
        type=seconds_in(0.05, 3600),
        default=1.0,
        help="seconds between refreshes (1; 0.05-3600)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds_in(0.01, 300),
        default=0.8,
        help="seconds each /status poll may take while this process runs (0.8; at most 300)",
    )
    parser.add_argument(
        "--stall-after",
        type=seconds_in(0.01, 86_400),
        default=None,
        help=f"mark open work older than this stalled (else ${_ENV_STALL_AFTER}, else 30)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help=f"print one snapshot and exit: 0, or {EXIT_UNREACHABLE} when a participant or a log could not "
        f"be read, {EXIT_REFUSED} when a participant refused the token (a health check)",
    )


def _urls(args: argparse.Namespace) -> list[str]:
    if any(not spec.strip() for spec in args.follow):
        # As report refuses it: '' was followed as a file that never appears, waited for forever.
        raise CommandError("--follow: an empty log name (a stray comma or quotes?)")
    urls = list(args.participant)
    if args.participants_file is not None:
        try:
            text = args.participants_file.read_text(errors="replace")
        except OSError as exc:
            raise CommandError(
                f"cannot read {shown(str(args.participants_file))}: {exc.strerror or exc}"
            ) from None
        urls += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"participant {shown(escape(url))} is not an http:// or https:// URL")
    if not urls and not args.follow:
        raise CommandError("nothing to watch: pass --participant URL, --participants-file or --follow LOG")
    return list(dict.fromkeys(urls))


def _token(args: argparse.Namespace, needed: bool) -> str | None:
    token: str
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(errors="replace").strip()
        except OSError as exc:
            raise CommandError(
                f"cannot read the token file {shown(str(args.token_file))}: {exc.strerror or exc}"
            ) from None
    else:
        token = os.environ.get(ENV_TOKEN, "").strip()
    if not token:
        if needed:
            raise CommandError(f"no control token: pass --token-file PATH or set ${ENV_TOKEN}")
        return None
    if not (token.isascii() and token.isprintable()):
        raise CommandError("the control token must be printable ASCII (it goes into an HTTP header)")
    return token


def _stall_after(args: argparse.Namespace) -> float:
    if args.stall_after is not None:
        return float(args.stall_after)
    raw = os.environ.get(_ENV_STALL_AFTER, "").strip()
    try:
        value = float(raw) if raw else 30.0
    except ValueError:
        raise CommandError(f"${_ENV_STALL_AFTER} must be a number of seconds, not {shown(raw)}") from None
    if not 0 < value < float("inf"):
        raise CommandError(f"${_ENV_STALL_AFTER} must be a number of seconds > 0, not {shown(raw)}")
    return value


async def snapshot(view: FleetView, client: Any, source: EventSource | None, timeout: float) -> None:
    """One refresh: a poll round and whatever ``source`` gained, folded into ``view``."""
    # Here, not at the top: the parser imports this module on every start (``serve`` too), and
    # the follower brings the JSON-lines reader (its wire decoders are built at import).
    from ckpt_events.participants.cli.watch.follow import LogFollower
    from ckpt_events.participants.cli.watch.sources import poll_all

    results = await poll_all(client, view.urls, timeout) if view.urls else []
    view.add_polls(results, time.time(), mono=time.monotonic())
    if source is not None:
        # Logs a chunk at a time: a multi-GB backlog held Ctrl-C off until it was read to its end.
        if isinstance(source, LogFollower):
            events = await source.aread()
            # read by now: bounds a log-only clock; and our monotonic clock, whatever ours does
            view.add_events(events, time.time(), cut=source.cut, mono=time.monotonic(), ended=source.ended)
        else:
            events = source.read()
            view.add_events(events, time.time(), mono=time.monotonic())
        view.notes = list(source.notes.values())


def _framed(view: FleetView, title: Callable[[], str] | None) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    rendered = view.render(time.time(), mono=time.monotonic())
    return rendered if title is None else Group(Text(escape(title()), style="bold"), rendered)


async def live(
    view: FleetView,
    client: Any,
    source: EventSource | None,
    out: Any,
    *,
    interval: float = 1.0,
    timeout: float = 0.8,
    until: anyio.Event | None = None,
    title: Callable[[], str] | None = None,
) -> None:
    """Redraw ``view`` in place on the console ``out`` every ``interval`` seconds until ``until``
    is set (``None``: until cancelled), then once more, so the last frame is the final state.
    ``title()``, if given, heads every frame."""
    from rich.live import Live

    with Live(_framed(view, title), console=out, auto_refresh=False, transient=False) as screen:
        await _rounds(
            view,
            client,
            source,
            timeout,
            interval,
            until,
            lambda: screen.update(_framed(view, title), refresh=True),
        )


async def plain(
    view: FleetView,
    client: Any,
    source: EventSource | None,
    out: Any,
    *,
    interval: float = 1.0,
    timeout: float = 0.8,
    until: anyio.Event | None = None,
    once: bool = False,
    title: Callable[[], str] = lambda: "ckpt-events watch",
) -> None:
    """What a pipe gets: one snapshot every ``interval`` seconds, each headed by a line with
    ``title()`` and the time, until ``until`` is set (then one last), or just one with ``once``."""

    def draw() -> None:
        out.print(f"-- {escape(title())} {time.strftime('%H:%M:%S')} --", markup=False, highlight=False)
        out.print(view.render(time.time(), mono=time.monotonic()))

    await _rounds(view, client, source, timeout, interval, until, draw, once=once)


async def show(
    view: FleetView,
    client: Any,
    source: EventSource | None,
    out: Any,
    *,
    interval: float = 1.0,
    timeout: float = 0.8,
    until: anyio.Event | None = None,
    title: Callable[[], str] | None = None,
) -> None:
    """``live`` on a terminal, else ``plain``: the view of ``watch`` and of ``demo --watch``. A dumb
    terminal (``TERM=dumb``) gets ``plain``: a live display there draws nothing until it ends."""
    if out.is_terminal and not out.is_dumb_terminal:
        await live(view, client, source, out, interval=interval, timeout=timeout, until=until, title=title)
    else:
        heading = title if title is not None else (lambda: "ckpt-events watch")
        await plain(view, client, source, out, interval=interval, timeout=timeout, until=until, title=heading)


async def _rounds(
    view: FleetView,
    client: Any,
    source: EventSource | None,
    timeout: float,
    interval: float,
    until: anyio.Event | None,
    draw: Callable[[], None],
    *,
    once: bool = False,
) -> None:
    """Poll into ``view`` and ``draw()`` it every ``interval`` seconds, until ``until`` is set
    (then one last round) or after the first with ``once``."""
    while True:
        started = time.monotonic()
        await snapshot(view, client, source, timeout)
        draw()
        if once or (until is not None and until.is_set()):
            return
        await _pause(interval - (time.monotonic() - started), until)


async def _pause(seconds: float, until: anyio.Event | None) -> None:
    """Sleep ``seconds`` (if positive), waking early when ``until`` is set."""
    with anyio.move_on_after(max(0.0, seconds)):
        if until is not None:
            await until.wait()
        else:
            await anyio.sleep_forever()


def once_status(polls: list[PollResult]) -> int:
    """``--once``'s exit status for its poll round, each failure one line on stderr."""
    code = 0
    for result in polls:
        if result.failure is not None:
            why = escape(result.error or "no answer")
            if result.failure == "unreachable":  # a refusal's, a TLS failure's or a twin's names its fix
                why += _UNREACHABLE_FIX
            say(f"ckpt-events watch: {escape(result.url)}: {why}")
            code = max(code, EXIT_REFUSED if result.failure == "refused" else EXIT_UNREACHABLE)
    return code


async def _watch_async(args: argparse.Namespace) -> int:
    from ckpt_events.participants.cli.watch.follow import MAX_READ, LogFollower
    from ckpt_events.participants.cli.watch.sources import status_client
    from ckpt_events.participants.cli.watch.view import FleetView

    urls = _urls(args)
    token = _token(args, needed=bool(urls))
    view = FleetView(urls, stall_after=_stall_after(args))
    # --once reads each log's backlog to its end at once (in bounded memory): one true snapshot.
    follower = LogFollower(args.follow, budget=None if args.once else MAX_READ) if args.follow else None
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    out = console()
    try:
        async with status_client(urls, headers=headers, timeout=args.timeout) as client:
            if args.once:
                await plain(view, client, follower, out, timeout=args.timeout, once=True)
                code = once_status([view.polls[url] for url in urls if url in view.polls])
                for path, why in ({} if follower is None else follower.unreadable).items():
                    # a health check that read nothing of a log it was given has not passed
                    say(f"ckpt-events watch: {escape(path)}: cannot read ({escape(why)})")
                    code = max(code, EXIT_UNREACHABLE)
                return code
            # until Ctrl-C, reported by main in one line
            await show(view, client, follower, out, interval=args.interval, timeout=args.timeout)
    finally:
        if follower is not None:
            follower.close()
    return 0


def _run(args: argparse.Namespace) -> int:
    # SIGTERM (``kill``, ``timeout``, a supervisor) ends the view as Ctrl-C does: it killed the
    # process mid-frame, and a terminal's live view left its cursor hidden.
    with sigterm_as_interrupt():
        return anyio.run(_watch_async, args)


WATCH: Final = Command(
    name="watch",
    help="live view of a fleet: phases, leases, blockers, open operations",
    add_arguments=_watch_arguments,
    run=_run,
    needs=("rich", "httpx"),
)
