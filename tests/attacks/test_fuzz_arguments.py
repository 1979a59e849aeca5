"""The public API's argument checks under hostile values drawn by hypothesis: each call either
works or raises one of our errors (``CkptEventsError``), never a bare ``TypeError``,
``ValueError`` or ``AttributeError`` from inside, and a refused ``configure`` leaves no file and
no subscription behind. An exception planted in a value's own ``__eq__``/``__hash__``/``__lt__``
is the caller's, and may come out as it was raised."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckpt_events
from ckpt_events import (
    Bus,
    CkptEventsError,
    ConfigurationError,
    InvalidTypeError,
    InvalidValueError,
    Redactor,
    Telemetry,
    sinks,
    testing,
)
from ckpt_events.participants import fastapi
from ckpt_events.sinks.replay import replay  # sinks.replay is this module once it loads

FUZZ = settings(max_examples=40, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Planted(Exception):
    """Raised by the hostile objects' own methods: the caller's exception, allowed through."""


class Rude:
    """An object whose every dunder a library might call raises."""

    def __str__(self) -> str:
        raise Planted("str")

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        raise Planted("eq")

    def __hash__(self) -> int:
        raise Planted("hash")


class OddStr(str):
    """A str whose comparisons and hash raise."""

    def __eq__(self, other: object) -> bool:
        raise Planted("eq")

    def __hash__(self) -> int:
        raise Planted("hash")


class OddInt(int):
    """An int whose comparisons raise."""

    def __lt__(self, other: object) -> bool:
        raise Planted("lt")

    __le__ = __gt__ = __ge__ = __lt__


HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([2**64, 2**128, -(2**64), 10**400, -1, 0]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x" * 100_000, "a\x00b", "\ud800", "a\nb", "events.jsonl\r\n"]),
    st.text(max_size=30),
    st.binary(max_size=10),
    st.lists(st.integers() | st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers() | st.none() | st.binary(max_size=3), max_size=3),
    st.builds(Rude),
    st.builds(OddStr, st.text(max_size=5)),
    st.builds(OddInt, st.integers(-5, 5)),
)


def _run(call: Callable[[], Any]) -> None:
    """``call()``, awaited when it gives a coroutine; ours and planted errors pass, and so does
    the OS's own refusal of a path (no such file, a name too long), as ``open()`` says it."""
    try:
        made = call()
        if asyncio.iscoroutine(made):
            asyncio.run(made)
    except (CkptEventsError, Planted, OSError):
        pass


async def _configure(value: Any, option: str, where: Path) -> None:
    """configure() with ``option=value`` beside a JSON-lines path: refused, it leaves no file
    and no subscription; accepted, it is closed."""
    path = where / "events.jsonl"
    async with Bus() as bus:
        options = {"environ": {}, "jsonl_path": path, option: value}
        try:
            configured = sinks.configure(bus, **options)
        except (CkptEventsError, Planted):
            assert not path.exists(), f"a refused configure({option}=...) created its JSON-lines file"
            assert not bus.stats().sinks, f"a refused configure({option}=...) left subscriptions"
            raise
        await configured.aclose()


async def _capture(value: Any) -> None:
    async with testing.capture_events(value):
        pass


#: Each public entry point with one argument left to hypothesis.
TARGETS: dict[str, Callable[[Any], Any]] = {
    **{
        f"Bus({name}=)": lambda v, n=name: Bus(**{n: v})
        for name in ("buffer_size", "batch_size", "close_timeout", "batch_interval")
    },
    **{
        f"Telemetry({name}=)": lambda v, n=name: Telemetry(
            None, **{"kind": "rollout", "instance": "r0", n: v}
        )
        for name in ("kind", "instance", "sample_ratio", "otel_context", "worker", "ids", "clock")
    },
    "Redactor(keys)": Redactor,
    "Redactor([key])": lambda v: Redactor([v]),
    "Redactor(mode=)": lambda v: Redactor(mode=v),
    "format_traceparent(trace_id)": lambda v: ckpt_events.format_traceparent(v, 1),
    "format_traceparent(span_id)": lambda v: ckpt_events.format_traceparent(1, v),
    "parse_traceparent": ckpt_events.parse_traceparent,
    "parse_tracestate": ckpt_events.parse_tracestate,
    "resolve_interests": ckpt_events.resolve_interests,
    "JsonLinesSink(target)": lambda v: sinks.JsonLinesSink(v).close(),
    **{
        f"JsonLinesSink({name}=)": lambda v, n=name: sinks.JsonLinesSink(io.BytesIO(), **{n: v})
        for name in ("max_bytes", "backups", "linger", "redactor")
    },
    "LoggingSink(logger)": sinks.LoggingSink,
    "LoggingSink(level=)": lambda v: sinks.LoggingSink(level=v),
    "StallWatch(after)": sinks.StallWatch,
    "read_events(source)": lambda v: list(sinks.read_events(v)),
    "read_events(max_line=)": lambda v: list(sinks.read_events(io.BytesIO(b""), max_line=v)),
    "read_otel_env(env)": sinks.read_otel_env,
    "read_otel_env(env[OTEL_TRACES_EXPORTER])": lambda v: sinks.read_otel_env({"OTEL_TRACES_EXPORTER": v}),
    "read_otel_env(otlp_endpoint=)": lambda v: sinks.read_otel_env({}, otlp_endpoint=v),
    "sample_ratio_from_env(environ)": sinks.sample_ratio_from_env,
    "sample_ratio_from_env(environ[OTEL_TRACES_SAMPLER_ARG])": lambda v: sinks.sample_ratio_from_env(
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": v}
    ),
    "replay(batch_size=)": lambda v: replay(io.BytesIO(b""), batch_size=v),
    "replay(target)": lambda v: replay(io.BytesIO(b""), v),
    "configure(bus)": lambda v: sinks.configure(v, environ={}),
    "MemorySink(interests)": testing.MemorySink,
    "EventCapture(interests)": testing.EventCapture,
    "capture_events(interests)": _capture,
    "SequentialIds(first_trace)": testing.SequentialIds,
    "TickingClock(step_ns=)": lambda v: testing.TickingClock(step_ns=v),
    "LoopLagMonitor(interval)": fastapi.LoopLagMonitor,
    "fastapi.telemetry(where)": fastapi.telemetry,
    "fastapi.incoming(request)": fastapi.incoming,
    **{
        f"instrument({name}=)": lambda v, n=name: fastapi.instrument(
            FastAPI(), **{"kind": "rollout", "instance": "r0", n: v}
        )
        for name in ("kind", "instance", "sample_ratio", "loop_lag", "shutdown_timeout", "jsonl_path", "bus")
    },
}

CONFIGURE_OPTIONS = (
    "environ",
    "otlp_endpoint",
    "span_groups",
    "service_name",
    "resource_attributes",
    "metric_export_interval_ms",
    "metric_cardinality_limit",
    "tracer_provider",
    "meter_provider",
    "span_exporter",
    "metric_readers",
)


@pytest.mark.parametrize("target", sorted(TARGETS))
@FUZZ
@given(value=HOSTILE)
def test_hostile_argument_raises_ours(
    target: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile value for one argument of a public name works or raises our error."""
    monkeypatch.chdir(tmp_path)  # a drawn file name is created here, not in the checkout
    _run(lambda: TARGETS[target](value))


@pytest.mark.parametrize("option", CONFIGURE_OPTIONS)
@FUZZ
@given(value=HOSTILE)
def test_configure_refuses_whole(option: str, value: Any, tmp_path: Path) -> None:
    """configure() given a hostile option raises ours, with no file or subscription left."""
    for old in tmp_path.iterdir():
        old.unlink()
    _run(lambda: _configure(value, option, tmp_path))


#: The defects the fuzzing found, each with the error it must now be.
FOUND: dict[str, tuple[Callable[[], object], type[CkptEventsError]]] = {
    "a timeout past a float's range": (lambda: Bus(close_timeout=10**400), InvalidValueError),
    "a traceparent of a None trace id": (lambda: ckpt_events.format_traceparent(None, 1), InvalidTypeError),  # type: ignore[arg-type]
    "a traceparent of a float span id": (lambda: ckpt_events.format_traceparent(1, 1.0), InvalidTypeError),  # type: ignore[arg-type]
    "a traceparent of span id 0": (lambda: ckpt_events.format_traceparent(1, 0), InvalidValueError),
    "a traceparent of a 129-bit trace id": (
        lambda: ckpt_events.format_traceparent(2**128, 1),
        InvalidValueError,
    ),
    "read_otel_env(None)": (lambda: sinks.read_otel_env(None), InvalidTypeError),  # type: ignore[arg-type]
    "an environment variable of True": (
        lambda: sinks.sample_ratio_from_env({"OTEL_TRACES_SAMPLER": True}),  # type: ignore[dict-item]
        InvalidTypeError,
    ),
    "an environment variable of bytes": (
        lambda: sinks.read_otel_env({"OTEL_TRACES_EXPORTER": b"otlp"}),  # type: ignore[dict-item]
        InvalidTypeError,
    ),
    "MemorySink(True)": (lambda: testing.MemorySink(True), InvalidTypeError),  # type: ignore[arg-type]
    "configure(None)": (lambda: sinks.configure(None, environ={}), InvalidTypeError),  # type: ignore[arg-type]
    "a JSON-lines path with NUL": (lambda: sinks.JsonLinesSink("a\x00b.jsonl"), InvalidValueError),
    "a JSON-lines path with a lone surrogate": (
        lambda: sinks.JsonLinesSink("\ud800.jsonl"),
        InvalidValueError,
    ),
    "a log to read with a lone surrogate": (
        lambda: list(sinks.read_events("\ud800.jsonl")),
        InvalidValueError,
    ),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_found_defects_raise_precisely(case: str) -> None:
    """Each input the fuzzing found raises the precise child of our error, with its argument."""
    call, error = FOUND[case]
    with pytest.raises(error):
        call()


async def test_configure_jsonl_path_surrogate_is_configuration_error(tmp_path: Path) -> None:
    """configure's jsonl_path with a lone surrogate is a ConfigurationError naming it."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match="jsonl_path"):
            sinks.configure(bus, environ={}, jsonl_path=str(tmp_path / "\ud800.jsonl"))
        assert not bus.stats().sinks


@pytest.mark.parametrize("option", ["tracer_provider", "meter_provider"])
async def test_configure_wrong_provider_creates_no_file(option: str, tmp_path: Path) -> None:
    """A wrong provider is refused before the JSON-lines file is created."""
    path = tmp_path / "events.jsonl"
    async with Bus() as bus:
        with pytest.raises(InvalidTypeError, match=option):
            sinks.configure(bus, environ={}, jsonl_path=path, **{option: object()})
    assert not path.exists()
    assert os.listdir(tmp_path) == []
