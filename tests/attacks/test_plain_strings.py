"""Events built by keyword with plain strings (``kind="environment"``, ``outcome="error"``) are the
same events to every consumer: the same JSON line, the same report, watch view and metrics.

A user's own code may build events by hand (a replayer, a bridge from another system) and emit them
with ``bus.emit``; kinds and steps are open strings, and a consumer that calls ``.value`` on a field
or compares it with ``is`` crashes or silently miscounts (issue #29: ``FleetView.add_events``
raised ``AttributeError: 'str' object has no attribute 'value'``).
"""

from __future__ import annotations

import enum
import io
from typing import Any

import anyio
import msgspec
import pytest
from rich.console import Console

from ckpt_events import Telemetry
from ckpt_events.testing import capture_events
from ckpt_events.vocab import ErrorCode
from tests.participants.cli.report_events import checkpoint_and_restore


async def _failing_checkpoint() -> list[Any]:
    """A checkpoint that aborts: a refusal, a prepare not ready, a failed operation and step."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        env = Telemetry(bus, kind="environment", instance="environment-0")
        env.refused(ErrorCode.UNAUTHORIZED, checkpoint_id="c2")
        env.prepare_not_ready(3, checkpoint_id="c2")
        with pytest.raises(RuntimeError), ctl.collection("checkpoint", checkpoint_id="c2") as coll:
            with ctl.coordinate("prepare", checkpoint_id="c2", parent=coll) as coord:
                with coord.stage("environment") as stage:
                    with env.operation("prepare", checkpoint_id="c2", traceparent=stage.traceparent()) as op:
                        with op.step("wait_ready"):
                            raise RuntimeError("not ready")
    return events


def _plain(event: Any) -> Any:
    """The same event with every enum field replaced by its plain string value."""
    changes = {
        name: str(value)
        for name in event.__struct_fields__
        if isinstance(value := getattr(event, name), enum.Enum)
    }
    return msgspec.structs.replace(event, **changes)


@pytest.fixture(scope="module")
def streams() -> tuple[list[Any], list[Any]]:
    typed = anyio.run(checkpoint_and_restore) + anyio.run(_failing_checkpoint)
    plain = [_plain(e) for e in typed]
    assert any(type(getattr(e, "kind", None)) is str for e in plain)
    return typed, plain


def test_the_json_line_is_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    typed, plain = streams
    assert [msgspec.json.encode(e) for e in plain] == [msgspec.json.encode(e) for e in typed]


def _last_ns(events: list[Any]) -> int:
    return max(getattr(e, "end_ns", None) or getattr(e, "time_ns", None) or e.start_ns for e in events)


def _report_text(events: list[Any]) -> str:
    from ckpt_events.participants.cli.report.overview import overview
    from ckpt_events.participants.cli.report.overview_terminal import render_overview
    from ckpt_events.participants.cli.report.terminal import render

    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    run = overview(events)
    render_overview(console, run, title="run")
    for row in run.rows:
        render(console, run.events_of(row), title=f"{row.what} {row.checkpoint_id}")
    return out.getvalue()


def test_the_report_says_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    typed, plain = streams
    assert _report_text(plain) == _report_text(typed)


def test_durations_trends_and_the_breakdown_are_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    from ckpt_events.participants.cli.report.durations import durations
    from ckpt_events.participants.cli.report.timeline import breakdown, counts

    typed, plain = streams
    assert durations(plain) == durations(typed)
    assert counts(plain) == counts(typed)
    assert [b for b in breakdown(plain)] == [b for b in breakdown(typed)]


def test_the_watch_view_renders_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    from ckpt_events.participants.cli.watch.view import FleetView

    def rendered(events: list[Any]) -> str:
        view = FleetView([])
        view.add_events(events)
        out = io.StringIO()
        Console(file=out, width=160, color_system=None).print(view.render(now=_last_ns(events) / 1e9))
        return out.getvalue()

    typed, plain = streams
    assert rendered(plain) == rendered(typed)


def test_the_metrics_are_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from ckpt_events.sinks.prometheus import PrometheusSink, TotalsCollector

    def page(events: list[Any]) -> bytes:
        sink = PrometheusSink()
        sink.handle(events)
        registry = CollectorRegistry()
        registry.register(TotalsCollector(sink))
        return generate_latest(registry)

    typed, plain = streams
    assert page(plain) == page(typed)


def test_the_spans_are_the_same(streams: tuple[list[Any], list[Any]]) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ckpt_events.sinks.otel import SpanSink

    def spans(events: list[Any]) -> list[tuple[Any, ...]]:
        exporter = InMemorySpanExporter()
        sink = SpanSink(exporter)
        sink.handle([e for e in events if isinstance(e, tuple(sink.interests))])
        sink.shutdown()
        return sorted(
            (s.name, s.context.span_id, s.status.status_code, tuple(sorted((s.attributes or {}).items())))
            for s in exporter.get_finished_spans()
        )

    typed, plain = streams
    assert spans(plain) == spans(typed)
