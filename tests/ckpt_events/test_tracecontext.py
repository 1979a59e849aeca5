"""W3C trace context helpers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckpt_events import format_traceparent, new_span_id, new_trace_id, parse_traceparent


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
def test_format_then_parse_round_trips(trace_id: int, span_id: int, sampled: bool) -> None:
    """Any valid ids survive a trip through the header."""
    parsed = parse_traceparent(format_traceparent(trace_id, span_id, sampled))
    assert parsed is not None
    assert (parsed.trace_id, parsed.span_id, parsed.sampled) == (trace_id, span_id, sampled)


@given(st.text(max_size=80) | st.binary(max_size=40) | st.integers() | st.none())
def test_parse_never_raises(value: object) -> None:
    """Whatever arrives in the header, parsing returns a parent or None."""
    result = parse_traceparent(value)
    assert result is None or result.trace_id > 0


def test_known_header_and_future_version() -> None:
    """The W3C example parses; a later version may carry extra fields."""
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parsed = parse_traceparent(header)
    assert parsed is not None and parsed.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert parse_traceparent("01" + header[2:] + "-future") is not None


def test_ids_are_nonzero_and_in_range() -> None:
    """Generated ids fit W3C widths and are never zero."""
    for _ in range(1000):
        assert 0 < new_trace_id() < 2**128 and 0 < new_span_id() < 2**64
