"""The pytest plugin: registered under pytest11, and each fixture works in a test file of its own."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

_USES_EVERY_FIXTURE = '''
import pytest

from ckpt_events import OperationFinished, OperationStarted, StepFinished
from ckpt_events.vocab import METRIC_EVENTS


def test_sync_capture_is_deterministic(ckpt_capture):
    """A synchronous test sees the events, with ids 1, 2, ... and a 1 ms clock."""
    tel = ckpt_capture.telemetry("agent", "agent-0")
    with tel.operation("prepare", checkpoint_id="c1") as op:
        with op.step("wait_ready"):
            pass
    started, step_started, step, finished = ckpt_capture.events
    assert isinstance(started, OperationStarted) and isinstance(finished, OperationFinished)
    assert (finished.trace_id, finished.span_id, step.span_id, step.parent_span_id) == (1, 1, 2, 1)
    assert step.end_ns - step.start_ns == 1_000_000
    assert finished.end_ns - finished.start_ns == 3_000_000


@pytest.mark.anyio
async def test_async_capture(ckpt_capture):
    """An async test flushes without blocking its loop."""
    tel = ckpt_capture.telemetry("agent", "agent-0")
    with tel.operation("commit", checkpoint_id="c2"):
        pass
    await ckpt_capture.flush()
    assert [type(e).__name__ for e in ckpt_capture.sink.events] == [
        "OperationStarted", "OperationFinished"
    ]
    assert ckpt_capture.of_type(StepFinished) == []


def test_span_sink(ckpt_capture, ckpt_span_sink, ckpt_span_exporter):
    """The span sink exports to the in-memory exporter; subscribing it again keeps it once."""
    ckpt_capture.subscribe(ckpt_span_sink)
    with ckpt_capture.telemetry("model", "model-0").operation("prepare", checkpoint_id="c1"):
        pass
    ckpt_capture.flush_sync()
    ckpt_span_sink.force_flush()
    (span,) = ckpt_span_exporter.get_finished_spans()
    assert span.name == "gym.checkpoint.prepare" and span.context.trace_id == 1


def test_span_exporter_alone(ckpt_capture, ckpt_span_exporter):
    """Asking for the exporter is enough: its sink is on the capture's bus, no subscribe call."""
    with ckpt_capture.telemetry("model", "model-0").operation("commit", checkpoint_id="c1"):
        pass
    ckpt_capture.flush_sync()
    (span,) = ckpt_span_exporter.get_finished_spans()
    assert span.name == "gym.checkpoint.commit"


def test_metric_reader_alone(ckpt_capture, ckpt_metric_reader):
    """Asking for the reader is enough: the metric sink records what the capture sees."""
    ckpt_capture.telemetry("agent", "agent-0").refused("unauthorized")
    ckpt_capture.flush_sync()
    names = [
        metric.name
        for resource in ckpt_metric_reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    assert METRIC_EVENTS in names


def test_metric_sink(ckpt_capture, ckpt_metric_sink, ckpt_metric_reader, ckpt_meter_provider):
    """The metric sink records through the provider the in-memory reader reads."""
    ckpt_capture.subscribe(ckpt_metric_sink)
    ckpt_capture.telemetry("agent", "agent-0").refused("unauthorized")
    ckpt_capture.flush_sync()
    names = [
        metric.name
        for resource in ckpt_metric_reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    assert METRIC_EVENTS in names
'''


def test_the_plugin_is_registered_under_pytest11() -> None:
    """The distribution's pytest11 entry point names the plugin module."""
    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "ckpt_events"]
    assert entry.value == "ckpt_events.sinks.pytest_plugin"


def test_each_fixture_in_a_tiny_test_file(pytester: pytest.Pytester) -> None:
    """A test file using ckpt_capture (sync and async) and the span and metric fixtures passes."""
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'\n")
    pytester.makepyfile(test_uses_plugin=_USES_EVERY_FIXTURE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_a_failing_assertion_on_captured_events_fails(pytester: pytest.Pytester) -> None:
    """The fixture does not swallow failures: a wrong expectation on the events fails the test."""
    pytester.makepyfile(
        test_wrong="""
def test_wrong(ckpt_capture):
    ckpt_capture.telemetry("agent", "agent-0").refused("unauthorized")
    assert ckpt_capture.events == []
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)


def test_the_plugin_loads_without_importing_opentelemetry() -> None:
    """Loading the plugin imports no OpenTelemetry module (a core-only install loads it)."""
    code = (
        "import sys, ckpt_events.sinks.pytest_plugin\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
