"""``ckpt-events``: the command line. One ``Command`` per subcommand; ``commands.COMMANDS`` lists them.

This is the module the ``ckpt-events`` script imports before it calls ``main``, so it imports
little: the commands' modules (anyio, rich, the server stack: a tenth of a second) are imported
inside ``main``, where a Ctrl-C that lands in them is one line, not a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import difflib
import importlib.util
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

from ckpt_events.participants.cli.text import escape, say
from ckpt_events.participants.cli.words import close_choice

if TYPE_CHECKING:
    from ckpt_events import CkptEventsError
    from ckpt_events.participants.cli.command import Command
    from ckpt_events.participants.cli.commands import COMMANDS
    from ckpt_events.participants.errors import CommandError, CommandLineError

__all__ = ["COMMANDS", "Command", "CommandError", "build_parser", "main"]


def __getattr__(name: str) -> Any:
    # ``COMMANDS``, ``Command`` and ``CommandError`` are still importable from here, on first use.
    if name == "COMMANDS":
        from ckpt_events.participants.cli.commands import COMMANDS

        return COMMANDS
    if name == "Command":
        from ckpt_events.participants.cli.command import Command

        return Command
    if name == "CommandError":
        from ckpt_events.participants.errors import CommandError

        return CommandError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations, for every subcommand too: --check was taken as --checkpoint-root,
        # and a flag added later could change what an abbreviation in a user's script meant.
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        # argparse's own, but an unknown option is said with the one meant: ``--chekpoint``,
        # or an abbreviation refused (``--checkp``), named ``--checkpoint``.
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{_meant(self, parsed, extras)}")
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A typo of a choice (``reprot``, ``--only sink``) is said with the choice meant.
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            close = close_choice(value, action.choices or ())
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{exc.message}: did you mean {close!r}?") from None

    # One line, no usage dump: the message says what is wrong and which flag to fix.
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if sys.stdout is not None:  # None when started with stdout closed (``>&-``)
            sys.stdout.flush()  # --help, --version: a reader gone is caught in main, not at exit
        super().exit(status, message)


class _VersionWhenAsked(argparse._VersionAction):
    """``--version``, the version looked up when it is asked for: read while the parser was
    built, it imported importlib.metadata (email, zipfile) and searched the installed
    distributions on every start, ``serve`` and ``--help`` too."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.version = f"ckpt-events {_version()}"
        super().__call__(parser, namespace, values, option_string)


def _meant(parser: argparse.ArgumentParser, parsed: argparse.Namespace, extras: list[str]) -> str:
    """`` (did you mean --checkpoint?)`` for unknown options that one of the subcommand's (or
    the program's) options begins with or resembles; ``""`` when none does."""
    options = list(parser._option_string_actions)  # argparse has no public list of them
    # A subcommand's options taking logs (watch's --follow) and participants' URLs (--participant).
    taking: dict[str, list[str]] = {"LOG": [], "URL": []}
    for action in parser._actions:  # nor of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
            if chosen is not None:
                options += list(chosen._option_string_actions)
                for a in chosen._actions:
                    if isinstance(a.metavar, str) and a.metavar in taking:
                        taking[a.metavar] += a.option_strings
    stray = [extra for extra in extras if extra != "--"]  # ``watch -- events.jsonl``
    if taking["LOG"] and stray and not any(extra.startswith("-") for extra in stray):
        # ``watch --once events.jsonl``, as ``report events.jsonl`` takes a log: said with the flag.
        # A URL is a participant's (``watch --once http://h:9000`` was told ``--follow`` it).
        log_flag = taking["LOG"][0]
        urls = [extra for extra in stray if "://" in extra]
        logs = [extra for extra in stray if "://" not in extra]
        if not urls:
            return f" (logs are given with {log_flag}: {log_flag} {' '.join(logs)})"
        if taking["URL"]:
            url_flag = taking["URL"][0]
            what = f"participants are given with {url_flag}"
            said = [f"{url_flag} {url}" for url in urls]
            if logs:
                what += f", logs with {log_flag}"
                said.append(f"{log_flag} {' '.join(logs)}")
            return f" ({what}: {' '.join(said)})"
    meant = []
    for extra in extras:
        given = extra.partition("=")[0]
        if not given.startswith("--") or given in options:
            continue
        longer = [o for o in options if o.startswith(given)]
        found = longer if len(longer) == 1 else difflib.get_close_matches(given, options, 1)
        meant += [(found[0], given)] if found else []
    if len(meant) == 1:
        return f" (did you mean {meant[0][0]}?)"
    return f" (did you mean {', '.join(f'{o} for {g}' for o, g in meant)}?)" if meant else ""


#: The top-level modules the ``cli`` extra installs (``rich`` and the ``otel``, ``server`` and
#: ``prometheus`` extras'): a command that misses one says which extra to install.
CLI_EXTRA_MODULES: Final = frozenset(
    {"rich", "fastapi", "starlette", "uvicorn", "httpx", "sniffio", "opentelemetry", "prometheus_client"}
)
CLI_EXTRA_HINT: Final = "pip install 'ckpt-events[cli]'"
#: The top-level modules each extra a command may name (``Command.extra``) installs; a module
#: missing outside the command's extra is named with ``cli``, which holds every one.
EXTRA_MODULES: Final = {
    "server": frozenset({"fastapi", "starlette", "uvicorn", "httpx", "sniffio"}),
    "cli": CLI_EXTRA_MODULES,
}


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The argument parser with one subparser per registered command."""
    from ckpt_events.participants.cli.commands import COMMANDS

    parser = _Parser(prog="ckpt-events", description="Telemetry for partial-rollout checkpoints.")
    parser.add_argument("--version", action=_VersionWhenAsked)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS if commands is None else commands:
        command.add_arguments(sub.add_parser(command.name, help=command.help, description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns (and as a script exits with) the exit status.

    A stop signal's line said, the stop signals stay ignored if ``argv`` is ``None`` (``main``
    is the process's own command: the ``ckpt-events`` script, ``python -m``, which exit with
    the status), else they are given back as found (a process calling ``main`` goes on)."""
    # Ignored while the line of a stop is said (by ``_interrupted``, and by ``serve`` from its
    # server's end: SIGTERM too).
    found = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(argv)
    finally:
        if argv is None:
            # Given back, a second Ctrl-C 0.1 s after serve's line landed in the interpreter's
            # exit (0.17 s of it after the line, measured), whose end sets Python's handlers to
            # the default: the process died of SIGINT (-2), not 130. The stop is said: it ends.
            found = {}
        for signum, handler in found.items():
            # Whatever a command left, not only an ignored signal: ``demo``'s signal receiver
            # (asyncio's ``remove_signal_handler``) leaves SIGTERM at SIG_DFL and SIGINT at
            # Python's default, so a caller's own handlers were lost (SIGTERM then killed it).
            if _in_main_thread() and signal.getsignal(signum) is not handler:
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _main(argv: Sequence[str] | None) -> int:
    command: str | None = None
    try:
        _escape_what_stdout_cannot_encode()
        # Imports every command's module: a Ctrl-C here (or in a command, caught in ``_run``
        # with its name) is one line too.
        args = build_parser().parse_args(argv)
        command = args.command
        status = _run(args)
        # Here, where a reader gone is caught, not at the interpreter's exit. Started with
        # stdout closed (``ops --write DIR >&-``), Python has none: an AttributeError traceback.
        if sys.stdout is not None:
            sys.stdout.flush()
        return status
    except KeyboardInterrupt as exc:
        return _interrupted(command, exc)
    except BrokenPipeError:
        # ``ckpt-events ops --write DIR | head -1`` was a traceback: the reader has gone, so the
        # rest goes nowhere and the exit is quiet, as rich does for the tables (exit status 1).
        if not _output_closed():
            raise  # a socket's, not our output's
        return 1


def _run(args: argparse.Namespace) -> int:
    from ckpt_events import CkptEventsError
    from ckpt_events.participants.cli.commands import COMMANDS
    from ckpt_events.participants.errors import CommandLineError

    command = {c.name: c for c in COMMANDS}[args.command]
    try:
        for module in command.needs:
            _find(module)
        return command.run(args)
    except KeyboardInterrupt as exc:
        return _interrupted(args.command, exc)
    except (CkptEventsError, CommandLineError) as exc:
        return _failed(args.command, exc)
    except ModuleNotFoundError as exc:
        if not _missing_extra(exc):
            raise
        return _needs_extra(command, exc)
    except BaseExceptionGroup as group:
        # Errors out of task groups come wrapped, often several times over: report the first
        # of ours (or the interrupt) once, as a plain one would be.
        leaf = _first_leaf(group)
        if isinstance(leaf, KeyboardInterrupt):
            return _interrupted(args.command, leaf)
        if isinstance(leaf, BrokenPipeError):
            raise leaf from None  # ended in ``main`` if it is stdout's
        if isinstance(leaf, (CkptEventsError, CommandLineError)):
            return _failed(args.command, leaf)
        if isinstance(leaf, ModuleNotFoundError) and _missing_extra(leaf):
            return _needs_extra(command, leaf)
        raise


def _version() -> str:
    """The installed distribution's version; a bare checkout on the path has the package's own."""
    import importlib.metadata  # here, not at the script's start: it imports email and zipfile

    try:
        return importlib.metadata.version("ckpt-events")
    except importlib.metadata.PackageNotFoundError:
        from ckpt_events import __version__

        return __version__


def _interrupted(command: str | None, exc: KeyboardInterrupt) -> int:
    """One line for a Ctrl-C (or a command's ``Interrupted``: by SIGTERM, or forced by a second
    signal); ``command`` is ``None`` before one was parsed (while importing)."""
    from ckpt_events.participants.errors import Interrupted

    if _in_main_thread():
        # A second Ctrl-C while this is said (pressed twice quickly) is the same interrupt: it
        # landed in the handler, a KeyboardInterrupt traceback, or the line said twice.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    name = f"ckpt-events{'' if command is None else ' ' + command}"
    if not isinstance(exc, Interrupted):
        say(f"{name}: interrupted")
        return 130  # 128 + SIGINT, as a shell reports it
    stopped = "" if exc.stopped is None else f"; {escape(exc.stopped)}"
    cut = "" if exc.cut is None else f"; a second signal forced the exit: {escape(exc.cut)}"
    say(f"{name}: interrupted{stopped}{cut}")
    return 128 + exc.signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports it


def _in_main_thread() -> bool:
    """Whether this is the main thread, the only one that may set a signal's handler (``main``
    is run in threads by tests)."""
    return threading.current_thread() is threading.main_thread()


def _failed(command: str, exc: CkptEventsError | CommandLineError) -> int:
    # One line, inert: a message may carry a log's strings (a checkpoint id, an instance name).
    say(f"ckpt-events {command}: error: {escape(exc)}")
    return 2


def _escape_what_stdout_cannot_encode() -> None:
    """A stdout that is not UTF-8 (``PYTHONIOENCODING=ascii``, a Latin-1 locale) shows what it
    cannot encode as its escape, as stderr does: the report's bars and ``▶``, or an ``é`` in a
    checkpoint id, were a UnicodeEncodeError traceback half way through its output."""
    out = sys.stdout
    if (
        isinstance(out, io.TextIOWrapper)
        and out.errors == "strict"
        and codecs.lookup(out.encoding).name != "utf-8"
    ):
        out.reconfigure(errors="backslashreplace")


def _output_closed() -> bool:
    """Whether stdout's reader has gone (a ``BrokenPipeError`` may be a socket's or a child's);
    if so, stdout is pointed at the null device, so the interpreter's last flush is quiet too.
    Asked of the pipe itself: with ``PYTHONUNBUFFERED`` nothing is left to fail a flush."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # not a file (captured), or closed
        return False
    if gone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return gone


def _find(module: str) -> None:
    """Raise ``ModuleNotFoundError`` (as importing would) if ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def _missing_extra(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").partition(".")[0] in CLI_EXTRA_MODULES


def _needs_extra(command: Command, exc: ModuleNotFoundError) -> int:
    top = (exc.name or "").partition(".")[0]
    extra = command.extra if top in EXTRA_MODULES.get(command.extra, ()) else "cli"
    say(
        f"ckpt-events {command.name}: error: {exc.name!r} is not installed: this command needs the "
        f"{extra} extra: pip install 'ckpt-events[{extra}]'",
    )
    return 2


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The interrupt if there is one, else the first of our errors (or of a missing module, or
    stdout's reader gone), anywhere in nested groups."""
    from ckpt_events import CkptEventsError
    from ckpt_events.participants.errors import CommandLineError

    for kind in (KeyboardInterrupt, CkptEventsError, CommandLineError, ModuleNotFoundError, BrokenPipeError):
        found: BaseException | None = group.split(kind)[0]
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        if found is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
