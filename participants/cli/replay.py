"""``ckpt-events replay``: export a recorded JSON-lines log to an OTLP collector."""

from __future__ import annotations

import argparse
import sys

import anyio

from participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    existing_file,
    otel_environ,
)

__all__ = ["REPLAY"]


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=existing_file, help="a JSON-lines log written by the jsonl sink")
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
    from sinks.replay import replay

    await check_reachable(args.otlp_endpoint)
    async with Bus() as bus:
        configured = sinks.configure(
            bus,
            otlp_endpoint=args.otlp_endpoint,
            span_groups=args.span_groups,
            service_name=args.service_name,
            environ=otel_environ(),
        )
        try:
            # The function from its module: `sinks.replay` turns into the submodule once anything
            # has imported `sinks.replay` (Python sets a package attribute per submodule).
            result = await replay(args.log, bus)
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
