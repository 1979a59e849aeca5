"""The cardinality limit's parts: the overflow count, its one log line, and AttributeSets (SDK sinks)."""

from __future__ import annotations

import logging

import pytest

from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._cardinality import OVERFLOW_ATTRIBUTES, AttributeSets, Overflow


def test_the_overflow_set_is_one_boolean_attribute() -> None:
    """One boolean attribute, ``otel.metric.overflow=True`` (the specification's overflow set)."""
    assert OVERFLOW_ATTRIBUTES == {"otel.metric.overflow": True}
    assert keys.attributes_of(keys.OVERFLOW_KEY) == OVERFLOW_ATTRIBUTES


def test_the_overflow_set_is_the_sdks() -> None:
    """The OpenTelemetry SDK's own overflow set, where it has one (opentelemetry-sdk 1.45.2 and
    later: before, its readers applied no cardinality limit)."""
    overflow = pytest.importorskip(
        "opentelemetry.sdk.metrics._internal._view_instrument_match",
        reason="this opentelemetry-sdk has no cardinality limit, so no overflow set (from 1.45.2)",
    )
    if not hasattr(overflow, "_OVERFLOW_ATTRIBUTES"):
        pytest.skip("this opentelemetry-sdk has no cardinality limit, so no overflow set (from 1.45.2)")
    assert overflow._OVERFLOW_ATTRIBUTES == OVERFLOW_ATTRIBUTES


def test_attribute_sets_keep_the_first_ones_then_give_the_overflow_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kept keys map to their attributes; one past the limit to the overflow set, counted, never kept."""
    overflow = Overflow(2, owner="MetricSink")
    sets = AttributeSets("gym.checkpoint.events_total", overflow)
    first, second, third = ((keys.REFUSED, code) for code in ("a", "b", "c"))
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks.metrics"):
        assert sets.attributes(first) == {
            "nemo.gym.checkpoint.event": "refused",
            "nemo.gym.checkpoint.code": "a",
        }
        sets.attributes(second)
        assert sets.attributes(third) is OVERFLOW_ATTRIBUTES
        assert sets.attributes(third) is OVERFLOW_ATTRIBUTES
        assert sets.attributes(first) is sets.kept[first]
    assert list(sets.kept) == [first, second]
    assert overflow.by_instrument == {"gym.checkpoint.events_total": 2} and overflow.measurements == 2
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["MetricSink"]


def test_each_instrument_warns_once() -> None:
    """Two instruments over the limit: two warnings, however many measurements overflow."""
    overflow = Overflow(1)
    logger = logging.getLogger("ckpt_events.sinks.metrics")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        for _ in range(10):
            overflow.fold("a")
            overflow.fold("b")
    finally:
        logger.removeHandler(handler)
    assert len(seen) == 2 and overflow.by_instrument == {"a": 10, "b": 10}
