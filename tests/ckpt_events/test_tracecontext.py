"""W3C trace context helpers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckpt_events import format_traceparent, new_span_id, new_trace_id, parse_traceparent, parse_tracestate


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


def test_tracestate_is_normalised_and_kept() -> None:
    """Optional whitespace and empty members go; members keep their order; multi-tenant keys pass."""
    assert parse_tracestate(" rojo=00f067aa0ba902b7 ,, congo=t61rcWkgMzE,\tfoo@bar=a b") == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,foo@bar=a b"
    )


def test_tracestate_up_to_32_members() -> None:
    """32 list members are kept; a 33rd drops the whole header (W3C, as OpenTelemetry does)."""
    members = [f"k{n}=v{n}" for n in range(33)]
    assert parse_tracestate(",".join(members[:32])) == ",".join(members[:32])
    assert parse_tracestate(",".join(members)) is None


def test_invalid_tracestate_is_dropped() -> None:
    """A bad key or value, a repeated key, too long a header or no member at all drops it."""
    for header in (
        "Rojo=1",
        "rojo=1,bad key=2",
        "rojo=a=b",
        "rojo=",
        "rojo=1,rojo=2",
        "k=" + "v" * 257,
        ",".join(f"k{n:02d}=" + "v" * 253 for n in range(32)),  # 8255 characters
        "",
        " , ",
        None,
        7,
    ):
        assert parse_tracestate(header) is None, header


@given(st.text(max_size=120))
def test_parse_tracestate_never_raises(value: str) -> None:
    """Whatever arrives, parsing returns a normalised header or None."""
    result = parse_tracestate(value)
    assert result is None or parse_tracestate(result) == result
