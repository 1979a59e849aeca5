"""``ckpt-events report``, ``replay`` and ``bench``: work on recorded logs and benchmarks.

None of them starts a server. Each user mistake (a missing file, a bad endpoint, a corrupt
line) is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from participants._command import Command, CommandError

__all__ = ["BENCH", "DEMO", "REPLAY", "REPORT", "load_events"]


def _existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value!r} is not a readable file")
    return path


def _writable(value: str) -> Path:
    path = Path(value)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {value!r} does not exist")
    return path


def console() -> Any:
    """A rich console; piped output gets a wide fixed width so the tables stay readable."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=170)


def load_events(path: Path) -> list[Any]:
    """Every event of a JSON-lines log; corrupt lines are reported (with their number) and skipped."""
    from sinks import CorruptLine, read_events

    events: list[Any] = []
    try:
        for _, item in read_events(path):
            if isinstance(item, CorruptLine):
                print(f"{path}:{item.line}: corrupt line skipped: {item.error}", file=sys.stderr)
            else:
                events.append(item)
    except OSError as exc:
        raise CommandError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return events


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be at least 1")
    return number


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0.0 < number < 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return number


def _endpoint(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL, e.g. http://127.0.0.1:4318")
    return value


async def check_reachable(url: str, timeout: float = 3.0) -> None:
    """Fail fast with one line when nothing listens at an endpoint's host and port."""
    parsed = urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_tcp(parsed.hostname or "127.0.0.1", port)
    except (OSError, TimeoutError):
        raise CommandError(
            f"nothing answers at {url}: start a collector there, or fix the endpoint"
        ) from None
    await stream.aclose()


# -- demo ----------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=_positive_int, default=1000, help="rollouts to run (1000)")
    parser.add_argument("--steps", type=_positive_int, default=2, help="steps per rollout (2)")
    parser.add_argument("--concurrency", type=_positive_int, default=16, help="rollouts in flight (16)")
    parser.add_argument(
        "--checkpoint-at", type=_fraction, default=0.4, help="checkpoint when this share is done (0.4)"
    )
    parser.add_argument(
        "--processes", action="store_true", help="run the servers as real processes, killed with SIGKILL"
    )
    parser.add_argument(
        "--jsonl", type=_writable, metavar="PATH", help="also write every event as JSON lines"
    )
    parser.add_argument(
        "--report", type=_writable, metavar="PATH", help="also write the timeline (.svg or .html)"
    )
    parser.add_argument(
        "--otlp-endpoint",
        type=_endpoint,
        metavar="URL",
        default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        help="export spans and metrics to this OTLP/HTTP collector ($OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    parser.add_argument(
        "--workdir", type=Path, metavar="DIR", help="keep checkpoints and logs here (default: temp)"
    )


def _demo(args: argparse.Namespace) -> int:
    from participants._demo import DemoFailed, DemoOptions, run_demo

    options = DemoOptions(
        rollouts=args.rollouts,
        steps=args.steps,
        concurrency=args.concurrency,
        checkpoint_at=args.checkpoint_at,
        processes=args.processes,
        workdir=args.workdir,
        jsonl=args.jsonl,
        report=args.report,
        otlp_endpoint=args.otlp_endpoint,
    )
    if args.otlp_endpoint:
        anyio.run(check_reachable, args.otlp_endpoint)
    try:
        result = anyio.run(run_demo, options, console())
    except DemoFailed as exc:
        raise CommandError(f"the run finished with a wrong result: {exc}") from None
    if result.spans_not_exported:
        raise CommandError(
            f"{result.spans_not_exported} spans could not be exported to {args.otlp_endpoint}: "
            "is a collector listening there?"
        )
    return 0


DEMO = Command(
    "demo",
    "run rollouts, checkpoint mid-flight, kill, restore, finish, and show where the time went",
    _demo_arguments,
    _demo,
)


# -- report --------------------------------------------------------------------------------


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=_existing_file, help="a JSON-lines log written by the jsonl sink")
    parser.add_argument(
        "--report", type=_writable, metavar="PATH", help="also write the timeline (.svg or .html)"
    )


def _report(args: argparse.Namespace) -> int:
    from participants._report import render, spans_of, write_timeline

    events = load_events(args.log)
    if not events:
        raise CommandError(f"{str(args.log)!r} holds no checkpoint events")
    render(console(), events, title=str(args.log))
    if args.report is not None:
        write_timeline(args.report, spans_of(events))
        print(f"timeline written to {args.report}")
    return 0


REPORT = Command(
    "report", "breakdown, timeline and counts from a recorded JSON-lines log", _report_arguments, _report
)


# -- replay --------------------------------------------------------------------------------


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=_existing_file, help="a JSON-lines log written by the jsonl sink")
    parser.add_argument(
        "--otlp-endpoint", required=True, metavar="URL", help="OTLP/HTTP base URL of a collector"
    )
    parser.add_argument(
        "--span-groups", default="default,checkpoint", help="span groups (default,checkpoint)"
    )
    parser.add_argument("--service-name", default="ckpt-events-replay", help="OTel service.name")


async def _replay_async(args: argparse.Namespace) -> int:
    import sinks
    from ckpt_events import Bus

    await check_reachable(args.otlp_endpoint)
    async with Bus() as bus:
        configured = sinks.configure(
            bus,
            otlp_endpoint=args.otlp_endpoint,
            span_groups=args.span_groups,
            service_name=args.service_name,
            environ={},
        )
        try:
            result = await sinks.replay(args.log, bus)
        finally:
            await configured.aclose()
    for corrupt in result.corrupt:
        print(f"{args.log}:{corrupt.line}: corrupt line skipped: {corrupt.error}", file=sys.stderr)
    span_stats = configured.span_sink.stats() if configured.span_sink is not None else None
    if span_stats is not None and span_stats.export_failures:
        raise CommandError(
            f"{span_stats.dropped} spans could not be exported to {args.otlp_endpoint} "
            f"({span_stats.export_failures} failed exports): is a collector listening there?"
        )
    exported = span_stats.exported if span_stats is not None else 0
    print(f"replayed {result.events} events: {exported} spans exported to {args.otlp_endpoint}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    return anyio.run(_replay_async, args)


REPLAY = Command(
    "replay", "export a recorded JSON-lines log to an OTLP collector", _replay_arguments, _replay
)


# -- bench ---------------------------------------------------------------------------------


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller scale run")
    parser.add_argument(
        "--json", type=_writable, default=Path("benchmark-results.json"), help="where to write the figures"
    )
    parser.add_argument("--only", choices=("core", "sinks", "scale"), action="append", help="run only these")


def _bench(args: argparse.Namespace) -> int:
    # The benchmarks live beside the packages in a source checkout, not in the wheel.
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "bench_core.py").is_file():
        raise CommandError("bench needs a source checkout of ckpt-events (benchmarks/ not found)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import importlib

    from benchmarks import report

    chosen = args.only or ["core", "sinks", "scale"]
    rows: list[Any] = []
    figures: dict[str, Any] = {}
    for name in chosen:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"running {name} benchmarks...", file=sys.stderr)
        result = module.run(quick=args.quick)
        rows.extend(result.pop("rows"))
        figures[name] = result
    report.print_table("ckpt-events benchmarks (ratios measured side by side in one run)", rows)
    report.write_json(args.json, figures)
    print(f"figures written to {args.json}")
    return 0


BENCH = Command("bench", "run the benchmark suite and print one table of ratios", _bench_arguments, _bench)
