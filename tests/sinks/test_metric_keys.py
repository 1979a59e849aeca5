"""The metrics' flat keys and their attribute sets (``ckpt_events.sinks._metric_keys``), shared by
``MetricSink`` and ``OtlpMetricSink``."""

from __future__ import annotations

import pytest

from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.vocab import Attr, ErrorCode, Kind, Operation, Outcome, Phase


def test_a_key_gives_its_values_as_strings_under_the_instruments_names() -> None:
    """A duration key names operation, kind and outcome; enum members become their plain values."""
    attributes = keys.attributes_of((keys.DURATION, Operation.COMMIT, Kind.AGENT, Outcome.OK))
    assert attributes == {
        Attr.OPERATION: "commit",
        Attr.PARTICIPANT_KIND: "agent",
        Attr.METRIC_OUTCOME: "ok",
    }
    assert all(type(value) is str for value in attributes.values())
    assert keys.attributes_of((keys.LAG, "judge")) == {Attr.PARTICIPANT_KIND: "judge"}


def test_a_counted_event_key_names_its_event_first() -> None:
    """Refused, lease expired, ...: the event's name is the first attribute, then the key's values."""
    assert list(keys.attributes_of((keys.REFUSED, ErrorCode.UNAUTHORIZED)).items()) == [
        (Attr.EVENT, "refused"),
        (Attr.CODE, "unauthorized"),
    ]
    lease = keys.attributes_of((keys.LEASE, Kind.MODEL, Phase.PREPARED))
    assert lease == {Attr.EVENT: keys.LEASE, Attr.PARTICIPANT_KIND: "model", Attr.PHASE: "prepared"}
    assert keys.attributes_of((keys.VOLUME, "commit", "agent")).get(Attr.EVENT) is None


def test_the_overflow_key_is_one_boolean_attribute() -> None:
    """Every set past the limit shares one series: otel.metric.overflow=True."""
    assert keys.attributes_of(keys.OVERFLOW_KEY) == {"otel.metric.overflow": True}


def test_a_key_with_the_wrong_number_of_values_is_refused() -> None:
    """A key that does not match its tag's names raises, rather than mislabel a series."""
    with pytest.raises(ValueError):
        keys.attributes_of((keys.DURATION, "commit", "agent"))
