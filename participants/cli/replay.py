"""``ckpt-events replay``: export a recorded JSON-lines log to an OTLP collector."""

from __future__ import annotations

import argparse
import sys

import anyio

from ckpt_events.participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    otel_environ,
    otlp_base_url,
)
from ckpt_events.participants.cli.words import counted

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
        "--otlp-endpoint",
        type=otlp_base_url,
        metavar="URL",
        help="the collector's OTLP/HTTP base URL, to which /v1/traces is appended (default: "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, or $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT used as is)",
    )
    parser.add_argument(
        "--span-groups", default="default,checkpoint", help="span groups (default,checkpoint)"
    )
    parser.add_argument("--service-name", default="ckpt-events-replay", help="OTel service.name")


async def _replay_async(args: argparse.Namespace) -> int:
    from ckpt_events import Bus, sinks
    from ckpt_events.participants.cli.run_logs import LogProblems, expand_logs, merged_events

    paths, missing = expand_logs(args.logs)
    if missing:
        raise CommandError("; ".join(missing))
    # The flag wins; without it the OpenTelemetry variables say where, by their own rules.
    settings = sinks.read_otel_env(otel_environ(), otlp_endpoint=args.otlp_endpoint)
    if settings.traces_otlp is None:
        raise CommandError(
            "no collector to replay to: pass --otlp-endpoint URL or set $OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    endpoint = settings.traces_otlp.endpoint
    await check_reachable(endpoint)
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
        raise CommandError(
            f"{', '.join(args.logs)} holds no checkpoint events ({counted(len(paths), 'file')} read)"
        )
    span_stats = configured.span_sink.stats() if configured.span_sink is not None else None
    if span_stats is not None and span_stats.export_failures:
        raise CommandError(
            f"{counted(span_stats.dropped, 'span')} could not be exported to {endpoint} "
            f"({counted(span_stats.export_failures, 'failed export')}): is a collector listening there?"
        )
    exported = span_stats.exported if span_stats is not None else 0
    print(f"replayed {counted(problems.events, 'event')}: {counted(exported, 'span')} exported to {endpoint}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    return anyio.run(_replay_async, args)


REPLAY = Command(
    "replay", "export a recorded JSON-lines log to an OTLP collector", _replay_arguments, _replay
)
