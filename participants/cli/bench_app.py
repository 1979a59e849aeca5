"""``ckpt-events bench --app MODULE:ATTR --request 'METHOD /path'``: your own app, telemetry on and off.

The options live here and ``bench`` hands over to ``run`` when ``--app`` is given; the
measurement is ``ckpt_events.benchmarks.bench_app`` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import shlex
from pathlib import Path
from typing import Any, Final

from ckpt_events.benchmarks.app_choices import DRIVERS, MAX_CONNECTIONS, SINKS
from ckpt_events.participants.cli.text import say
from ckpt_events.participants.errors import CommandError, shown

__all__ = ["add_arguments", "run"]

_SINKS = tuple(SINKS)


def _sinks(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in _SINKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"choose from {', '.join(_SINKS)} (comma-separated), not {shown(value)}"
        )
    return names


def _at_least(minimum: int, maximum: int | None = None) -> Any:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"a whole number >= {minimum}, not {shown(value)}")
        if maximum is not None and number > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,}, not {shown(value)}")
        return number

    return parse


def _json_body(value: str) -> str:
    try:
        json.loads(value)
    except ValueError as exc:
        # curl's "-d @body.json" habit was told only "not JSON (Expecting value: ...)".
        if value.startswith("@"):
            raise argparse.ArgumentTypeError(
                f'takes the JSON itself, not a file: --body "$(cat {shlex.quote(value[1:])})"'
            ) from None
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    return value


def _app_spec(value: str) -> str:
    # Checked when parsed: ``--app ''`` was taken for no --app ("add --app"), and ``--app
    # nocolon`` was refused only once both servers of the first round had started.
    module, _, attribute = value.partition(":")
    if not module.strip() or not attribute.strip():
        raise argparse.ArgumentTypeError(f"takes MODULE:ATTR (as uvicorn does), not {shown(value)}")
    # './app.py:app' was a TypeError traceback from importlib, 'app.py:app' "no module named
    # 'app.py'", both once the first round's servers had started. ('app.py' is a dotted name
    # too, module 'py' of package 'app': taken for the file when the file is there.)
    if not all(part.isidentifier() for part in module.split(".")) or (
        module.endswith(".py") and Path(module).is_file()
    ):
        name = module.removesuffix(".py").replace("/", ".").strip(".")
        where = ""
        # '/srv/app.py:app' was told "--app srv.app:app" and '../api/app.py:app' "--app
        # api.app:app", neither of which imports from where it was run: the file's own folder.
        if (file := Path(module.removesuffix(".py"))).is_absolute() or ".." in file.parts:
            name, where = file.name, f" (cd {shlex.quote(str(file.parent))})"
        if name != module and all(part.isidentifier() for part in name.split(".")):
            raise argparse.ArgumentTypeError(
                f"takes MODULE:ATTR with MODULE a module's name, as uvicorn does, not a file path "
                f"({shown(value)}): run from the folder that holds it{where}, with --app {name}:{attribute}"
            )
        raise argparse.ArgumentTypeError(
            f"takes MODULE:ATTR with MODULE a module's dotted name, not {shown(value)}"
        )
    return value


#: File descriptors a server or the driver needs beside its connections (its imports, its
#: sinks' files and sockets, a collector's).
_SPARE_FILES: Final = 64


def _file_descriptors_for(connections: int) -> None:
    """Refuse ``connections`` past the open-file limit the servers and the driver inherit: wrk
    failed its connects past it and the bench blamed the route ("failed 748 of 2183 times")."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and connections + _SPARE_FILES > soft:
        raise CommandError(
            f"--connections {connections} opens {connections:,} sockets in the load driver and in each "
            f"server, but this shell's open-file limit is {soft} (ulimit -n): raise it (ulimit -n "
            f"{connections + _SPARE_FILES}), or use --connections {max(soft - _SPARE_FILES, 1)} or fewer"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--app`` options of ``bench``."""
    group = parser.add_argument_group(
        "your own app (--app)", "server CPU per request of your instrument()ed app, telemetry off and on"
    )
    group.add_argument(
        "--app",
        type=_app_spec,
        metavar="MODULE:ATTR",
        help="your FastAPI app built with instrument(), importable from the current directory",
    )
    group.add_argument("--request", metavar="'METHOD /path'", help="the route to drive, e.g. 'POST /items'")
    group.add_argument("--body", type=_json_body, metavar="JSON", help="the request's JSON body")
    group.add_argument(
        "--header", action="append", default=[], metavar="'Name: value'", help="a request header (repeatable)"
    )
    group.add_argument(
        "--sinks",
        type=_sinks,
        default=_SINKS,
        metavar="jsonl,otlp,prometheus",
        help="the sinks of the 'on' servers (default: all three; otlp goes to a rotel collector)",
    )
    group.add_argument(
        "--export-process",
        action="store_true",
        help="run the 'on' servers' sinks in configure()'s export process (its CPU has rows of its own)",
    )
    group.add_argument(
        "--rounds", type=_at_least(3), metavar="N", help="rounds, order rotated (default 5, --quick 3)"
    )
    group.add_argument(
        "--duration",
        type=_at_least(1),
        metavar="SECONDS",
        help="seconds of load per variant and round (default 10, --quick 2)",
    )
    group.add_argument(
        "--connections",
        type=_at_least(1, MAX_CONNECTIONS),
        default=32,
        help=f"keep-alive connections (default 32, at most {MAX_CONNECTIONS:,})",
    )
    group.add_argument(
        "--driver",
        choices=DRIVERS,
        default="auto",
        help="load generator (auto: wrk if installed)",
    )


def run(args: argparse.Namespace) -> int:
    """Measure ``args.app``: print the table, write the JSON; ``CommandError`` for bad options."""
    bench_app = importlib.import_module("ckpt_events.benchmarks.bench_app")
    load = importlib.import_module("ckpt_events.benchmarks.load")
    if args.only:
        raise CommandError("--app measures your app: leave out --only")
    if not args.request:
        raise CommandError("--app needs --request 'METHOD /path'")
    try:
        method, path = bench_app.parse_request(args.request)
        headers = [bench_app.parse_header(h) for h in args.header]
        # wrk reads a HEAD answer's Content-Length as a body to wait for: every request timed out
        # and the bench said the route was too slow. httpx knows a HEAD answer has none.
        if method == "HEAD" and args.driver == "wrk":
            raise ValueError(
                "--request HEAD cannot be driven by wrk (it waits for a body): use --driver httpx"
            )
        driver = load.pick_driver("httpx" if method == "HEAD" else args.driver)
    except (ValueError, FileNotFoundError) as exc:
        raise CommandError(str(exc)) from None
    _file_descriptors_for(args.connections)
    body = (args.body or "").encode()
    if args.body is not None and not any(name.lower() == "content-type" for name, _ in headers):
        headers.append(("Content-Type", "application/json"))
    bench = bench_app.AppBench(
        app=args.app,
        request=load.Request(method, path, body, tuple(headers)),
        sinks=args.sinks,
        export_process=args.export_process,
        rounds=args.rounds or (3 if args.quick else 5),
        seconds=args.duration or (2 if args.quick else 10),
        connections=args.connections,
        driver=driver,
    )
    say(f"measuring {bench.app} ({bench.request}), telemetry off and on...")
    try:
        figures = bench_app.run(bench)
    except bench_app.BenchAppError as exc:
        say(f"ckpt-events bench: {exc}")
        return 1
    bench_app.print_report(bench, figures, args.json)
    print(f"figures written to {args.json}")
    return 0
