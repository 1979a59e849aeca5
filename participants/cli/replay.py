"""``ckpt-events replay``: export a recorded JSON-lines log to an OTLP collector."""

from __future__ import annotations

import argparse
import sys

import anyio

from participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    otel_environ,
)

__all__ = ["REPLAY"]

_BATCH = 4096


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="JSON-lines logs written by the jsonl sink: files, globs or directories, merged in time order",
    )
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
    from participants.cli.run_logs import LogProblems, expand_logs, merged_events

    paths, missing = expand_logs(args.logs)
    if missing:
        raise CommandError("; ".join(missing))
    await check_reachable(args.otlp_endpoint)
    problems = LogProblems()
    async with Bus() as bus:
        configured = sinks.configure(
            bus,
            otlp_endpoint=args.otlp_endpoint,
            span_groups=args.span_groups,
            service_name=args.service_name,
            environ=otel_environ(),
        )
        try:
            for count, event in enumerate(merged_events(paths, problems), 1):
                bus.emit(event)
                if count % _BATCH == 0:
                    await bus.flush()  # bounded: the bus never holds more than one batch of a log
            await bus.flush()
        finally:
            await configured.aclose()
    for line in problems.summary():
        print(line, file=sys.stderr)
    if problems.events == 0:
        raise CommandError(f"{', '.join(args.logs)} holds no checkpoint events ({len(paths)} file(s) read)")
    span_stats = configured.span_sink.stats() if configured.span_sink is not None else None
    if span_stats is not None and span_stats.export_failures:
        raise CommandError(
            f"{span_stats.dropped} spans could not be exported to {args.otlp_endpoint} "
            f"({span_stats.export_failures} failed exports): is a collector listening there?"
        )
    exported = span_stats.exported if span_stats is not None else 0
    print(f"replayed {problems.events} events: {exported} spans exported to {args.otlp_endpoint}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    return anyio.run(_replay_async, args)


REPLAY = Command(
    "replay", "export a recorded JSON-lines log to an OTLP collector", _replay_arguments, _replay
)
