"""``ckpt-events replay``: export a recorded JSON-lines log to an OTLP collector.

Work a process left open (killed mid-operation: ``operation_started`` and nothing more) is
exported too, as a span ended at that process's last event, status ERROR and marked
``nemo.gym.checkpoint.truncated=true`` (``sinks.jsonl.OpenSpans``), so the checkpoint's trace
shows the participant that never answered. Work open at the end of a rotated file given without
the newer files of its rotation is not: its process went on writing there, where that work may
well end, so it is not exported, and one line says how many spans and why.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from ckpt_events.participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    filtered,
    otel_environ,
    otlp_base_url,
)
from ckpt_events.participants.cli.text import say
from ckpt_events.participants.cli.words import clipped, counted
from ckpt_events.participants.errors import shown

if TYPE_CHECKING:
    from ckpt_events import BusStats
    from ckpt_events.participants.cli.report.events import FinishedSpan
    from ckpt_events.sinks import Configured, OtelSettings

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
    from ckpt_events.participants.cli.report.log_files import expand_logs
    from ckpt_events.participants.cli.report.logs import LogProblems, merged_events, nothing_read
    from ckpt_events.sinks.jsonl import OpenSpans

    paths, missing = expand_logs(args.logs)
    if missing:
        raise CommandError("; ".join(missing))
    # The flag wins; without it the OpenTelemetry variables say where, by their own rules.
    settings = sinks.read_otel_env(otel_environ(), otlp_endpoint=args.otlp_endpoint)
    if settings.traces_otlp is None:
        raise CommandError(_no_collector(settings, otel_environ()))
    endpoint = settings.traces_otlp.endpoint
    await check_reachable(endpoint)
    # Each event is exported as it is read, so nothing read can be taken back: a first read,
    # exporting nothing, finds the files out of time order (halves joined in the wrong order,
    # a reversed file), which the export then reads sorted, as ``report`` reads them again.
    # Without it, a reversed log exported each span twice and 63 as left open.
    probe = LogProblems()
    for _ in merged_events(paths, probe):
        pass
    sort = dict(probe.back_ns)
    problems = LogProblems()
    open_spans = OpenSpans()
    # The OTLP sinks warn at their first failed export; replay says it in its own one line.
    quiet = logging.getLogger("ckpt_events.sinks.otel")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    truncated = 0
    cut: list[tuple[Path, int]] = []
    # And the bus's traceback of a sink that raised (or failed to close): said in one line below.
    raised = _SinkFailures()
    behind: set[int] = set()  # the span sinks not waited for again (see _handed_over)
    with filtered(raised, "ckpt_events"):
        async with Bus() as bus:
            configured = sinks.configure(
                bus,
                otlp_endpoint=args.otlp_endpoint,
                span_groups=args.span_groups,
                service_name=args.service_name,
                environ=otel_environ(),
            )
            try:
                # Each event is exported as it is read, so no second read can take a copy back:
                # several files are read exactly from the start (an event's copy in another file
                # is dropped whatever their order, as ``report`` finds it reading again).
                exact = len(paths) > 1
                for count, event in enumerate(merged_events(paths, problems, exact=exact, sort=sort), 1):
                    bus.emit(event)
                    open_spans.add(event)
                    if count % _BATCH == 0:
                        await bus.flush()  # bounded: the bus never holds more than one batch of a log
                        await _handed_over(configured, behind)
                closed = open_spans.close()
                if closed:  # ended at their own process's last event: its files, not its successor's
                    closed, cut = _closed_per_process(paths, {(e.trace_id, e.span_id) for e in closed})
                truncated = len(closed)
                for event in closed:
                    bus.emit(event)
                await bus.flush()
            finally:
                await configured.aclose()
                quiet.setLevel(level)
    for line in problems.summary():
        say(line)
    if problems.events == 0:
        raise CommandError(nothing_read(args.logs, paths, problems))
    failure = _sink_failure(bus.stats(), raised)
    if failure is not None:
        # Was: the bus's traceback, then "replayed ...: 0 spans exported" and exit status 0.
        raise CommandError(failure)
    span_stats = configured.span_sink.stats() if configured.span_sink is not None else None
    if span_stats is not None and span_stats.export_failures:
        how = getattr(span_stats, "last_failure", None) or "failed"  # our OTLP sink says how
        hint = (
            "is a collector listening there?"
            if how == "got no answer"
            else "is that a collector's OTLP/HTTP base URL (e.g. http://127.0.0.1:4318)?"
            # A redirect too: an endpoint that moved (to https, another path) is not followed.
            if how.startswith(
                ("answered 3", "answered 4", "gave a reply that is not HTTP", "failed the TLS handshake")
            )
            else "see the collector's own log"
        )
        raise CommandError(
            f"{counted(span_stats.dropped, 'span')} could not be exported to {endpoint}: it {how} "
            f"({counted(span_stats.export_failures, 'failed export')}); {hint}"
        )
    if span_stats is not None and span_stats.dropped:
        # Every export taken, yet spans lost: a collector's partial success rejected them (the
        # sink's warning is quieted here), which replay reported as a clean, smaller export.
        said = getattr(span_stats, "last_failure", None)  # our OTLP sink says how
        # No failure said: the collector took every export, so they were lost here (was: "see
        # the collector's own log", of spans it never saw).
        why = (
            f"it {said}; see the collector's own log"
            if said
            else "they were dropped here, before export (the collector accepted every export)"
        )
        raise CommandError(
            f"{span_stats.dropped} of {counted(span_stats.dropped + span_stats.exported, 'span')} could "
            f"not be exported to {endpoint}: {why}"
        )
    exported = span_stats.exported if span_stats is not None else 0
    print(f"replayed {counted(problems.events, 'event')}: {counted(exported, 'span')} exported to {endpoint}")
    if truncated:
        print(f"{counted(truncated, 'span')} left open by a stopped process: exported as truncated (ERROR)")
    for newest, spans in cut:
        print(
            f"{counted(spans, 'span')} open at the end of {newest.name} not exported: a rotated file "
            f"whose newer file ({_newer_than(newest)}) was not given, so where they end is not known "
            f"(replay the files together to export them)"
        )
    return 0


def _no_collector(settings: OtelSettings, environ: dict[str, str]) -> str:
    """Why no span would go to a collector: a variable that turns traces off is named (with
    --otlp-endpoint given, "pass --otlp-endpoint" was the advice), else where to say where."""
    if settings.sdk_disabled:
        return (
            "no collector to replay to: OTEL_SDK_DISABLED turns every export off; unset it for this command"
        )
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if exporters:
        return (
            f"no collector to replay to: OTEL_TRACES_EXPORTER={shown(exporters)} leaves out otlp; "
            "unset it for this command, or set it to otlp"
        )
    return "no collector to replay to: pass --otlp-endpoint URL or set $OTEL_EXPORTER_OTLP_ENDPOINT"


async def _handed_over(configured: Configured, behind: set[int]) -> None:
    """Wait (in a thread, each within its sink's export timeout) until the span sinks exported
    what they queued: the log is read far faster than a collector takes it, and the sinks' queue
    (8,192 spans) dropped the rest. Was: 25,600 of 80,000 spans dropped, a collector accepting all.
    A sink whose flush did not end in time joins ``behind`` and is not waited for again: a
    collector that takes connections and never answers held each 4,096 events for the whole
    timeout (20,000 events: 51 s, for the same one-line error)."""
    for sink in configured.span_sinks:
        if id(sink) in behind:
            continue
        if not await anyio.to_thread.run_sync(sink.force_flush):
            behind.add(id(sink))  # what it cannot export it counts; the error line says it


class _SinkFailures(logging.Filter):
    """On the bus's logger (``ckpt_events``): holds back its records that carry a traceback (a
    sink's ``handle`` or ``aclose`` raised), keeping the first few as one-line texts."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        if len(self.said) < 8:  # the first is said; a bound, whatever a sink does
            try:
                text = clipped(str(error), 200)
            except Exception:  # its own __str__ raised: a filter must not raise into the bus
                text = "its message could not be read"
            self.said.append(f"{record.getMessage()} ({type(error).__name__}: {text})")
        return False


def _sink_failure(stats: BusStats, raised: _SinkFailures) -> str | None:
    """The command's one line when a sink raised: the first that did, with what it raised and on
    how much, from the bus's counters (a failed ``aclose``: its ``close_error``; anything else
    the bus logged with a traceback: from its log record)."""
    failed = [sink for sink in stats.sinks if sink.failed]
    if failed:
        first = failed[0]
        more = f"; {counted(len(failed) - 1, 'other sink')} failed too" if len(failed) > 1 else ""
        return (
            f"sink {shown(first.name)} raised on {counted(first.failed, 'event')} of {first.emitted:,} "
            f"replayed to it ({first.error}): those may not have been exported{more}"
        )
    closing = next((sink for sink in stats.sinks if sink.close_error), None)
    if closing is not None:
        return (
            f"sink {shown(closing.name)} failed to close ({closing.close_error}), so what it held "
            f"may not have been exported"
        )
    if raised.said:
        return f"{raised.said[0]}, so what it held may not have been exported"
    return None


def _newer_than(rotated: Path) -> str:
    """The name of the file a rotated file's writer went on in: ``x.jsonl`` after ``x.jsonl.1``,
    ``x.jsonl.1`` after ``x.jsonl.2``; after a dated one (``x.jsonl-20261203``), a later
    rotation's date is not known, so either is named."""
    from ckpt_events.sinks.jsonl import rotated_name

    name = rotated_name(rotated)
    if name is None:  # not named as a rotation: not asked for
        return "unknown"
    log = Path(name.log).name
    if name.number is None:
        return f"a later rotation, or {log}"
    return log if name.number <= 1 else f"{log}.{name.number - 1}"


def _process_files(paths: list[Path]) -> list[list[Path]]:
    """The files grouped by the process that wrote them: a log and its rotated copies (``x.jsonl``
    with ``x.jsonl.1``, ``x.jsonl.2``, or ``x.jsonl-20261203``), oldest first."""
    from ckpt_events.sinks.jsonl import oldest_first, rotated_name

    groups: dict[str, list[Path]] = {}
    for path in paths:
        rotated = rotated_name(path)
        groups.setdefault(str(path) if rotated is None else rotated.log, []).append(path)
    return [sorted(group, key=oldest_first) for group in groups.values()]


def _closed_per_process(
    paths: list[Path], still_open: set[tuple[int, int]]
) -> tuple[list[FinishedSpan], list[tuple[Path, int]]]:
    """The spans of ``still_open`` (open at the end of the merged logs), each closed at the last
    event of the process (group of files) that started it; a span in two copies of a log once.
    And, per group whose newest file given is a rotated one (``x.jsonl.1`` or ``x.jsonl-20261203``,
    without ``x.jsonl``), that file and how many of them it leaves open: cut, not closed (they may
    end in ``x.jsonl``)."""
    from ckpt_events.sinks import CorruptLine, read_events
    from ckpt_events.sinks.jsonl import OpenSpans
    from ckpt_events.sinks.otlp import looks_like_otlp
    from ckpt_events.sinks.replay import is_rotated

    closed: dict[tuple[int, int], FinishedSpan] = {}
    cut: dict[tuple[int, int], Path] = {}
    for group in _process_files(paths):
        spans = OpenSpans()
        for path in group:
            try:
                with open(path, "rb") as head:
                    if looks_like_otlp(head.readline(4096)):
                        continue  # a collector's file holds finished spans only
                for _, item in read_events(path):
                    if not isinstance(item, CorruptLine):
                        spans.add(item)
                    elif item.ended is not None:  # another version's end: ended, not truncated
                        spans.end(*item.ended[:2])
            except OSError:
                continue  # said once already by the merged read
        newest = group[-1]
        for event in spans.close():
            key = (event.trace_id, event.span_id)
            if key not in still_open:
                continue
            if is_rotated(newest):
                cut.setdefault(key, newest)
            else:
                closed.setdefault(key, event)
    for key in closed:  # a copy of the log that is its newest file says it was left open
        cut.pop(key, None)
    per_file: dict[Path, int] = {}
    for newest in cut.values():
        per_file[newest] = per_file.get(newest, 0) + 1
    return list(closed.values()), sorted(per_file.items())


def _replay(args: argparse.Namespace) -> int:
    return anyio.run(_replay_async, args)


REPLAY = Command(
    "replay", "export a recorded JSON-lines log to an OTLP collector", _replay_arguments, _replay
)
