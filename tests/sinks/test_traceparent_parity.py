"""traceparent parsing agrees with OpenTelemetry's TraceContextTextMapPropagator on generated headers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ckpt_events import parse_traceparent, parse_tracestate

_PROPAGATOR = TraceContextTextMapPropagator()
_hex = st.sampled_from("0123456789abcdefABCDEF")


def _field(size: int) -> st.SearchStrategy[str]:
    zeros = st.just("0" * size)
    return (
        zeros
        | st.text(_hex, min_size=size, max_size=size)
        | st.text(_hex, min_size=size - 1, max_size=size + 1)
    )


@given(
    _field(2) | st.just("ff") | st.just("00"),
    _field(32),
    _field(16),
    _field(2),
    st.sampled_from(["", "-extra", "-"]),
)
def test_parse_matches_opentelemetry(version: str, trace: str, span: str, flags: str, rest: str) -> None:
    """Same verdict (valid or not) and the same ids and sampled flag as OpenTelemetry's propagator."""
    header = f"{version}-{trace}-{span}-{flags}{rest}"
    ours = parse_traceparent(header)
    theirs = get_current_span(_PROPAGATOR.extract({"traceparent": header})).get_span_context()
    if not theirs.is_valid:
        assert ours is None, header
    else:
        assert ours is not None, header
        assert (ours.trace_id, ours.span_id, ours.sampled) == (
            theirs.trace_id,
            theirs.span_id,
            theirs.trace_flags.sampled,
        )


def test_uppercase_is_refused() -> None:
    """Uppercase hex is invalid per W3C."""
    assert parse_traceparent("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01") is None


_VALID_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_key = st.from_regex(r"\A(?:[a-z][_0-9a-z*/-]{0,6}|[a-z0-9][_0-9a-z*/-]{0,3}@[a-z][_0-9a-z*/-]{0,3})\Z")
_value = st.from_regex(r"\A[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,6}[\x21-\x2b\x2d-\x3c\x3e-\x7e]\Z")
_member = st.tuples(_key, _value).map("=".join) | st.sampled_from(
    ["", " ", "Bad=1", "k=v ", "k=a,b", "k", "=v", "k=" + "x" * 257, "a=1"]
)


@given(st.lists(_member, max_size=40), st.sampled_from([",", ", ", " ,\t"]))
def test_tracestate_matches_opentelemetry(members: list[str], separator: str) -> None:
    """Kept or dropped as OpenTelemetry's propagator decides, and the same header passed on."""
    header = separator.join(members)
    carrier = {"traceparent": _VALID_PARENT, "tracestate": header}
    theirs = get_current_span(_PROPAGATOR.extract(carrier)).get_span_context().trace_state
    assert parse_tracestate(header) == (theirs.to_header() or None), header


@pytest.mark.parametrize(
    "space", [" ", "\t", "  \t", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2009", "\u3000"]
)
@pytest.mark.parametrize("where", ["before", "after"])
def test_only_w3c_optional_whitespace_is_taken_around_it(space: str, where: str) -> None:
    """W3C's optional whitespace is space and tab. ``str.strip()`` took any Unicode space too,
    so a header with a vertical tab, a no-break space or a thin space before or after it
    continued the caller's trace (the 7 such characters here, either side: 14 of 14 cases),
    where OpenTelemetry starts a new one."""
    header = f"{space}{_VALID_PARENT}" if where == "before" else f"{_VALID_PARENT}{space}"
    theirs = get_current_span(_PROPAGATOR.extract({"traceparent": header})).get_span_context()
    assert (parse_traceparent(header) is not None) is theirs.is_valid is (space.strip(" \t") == "")
