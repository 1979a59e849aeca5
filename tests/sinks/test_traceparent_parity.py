"""traceparent parsing agrees with OpenTelemetry's TraceContextTextMapPropagator on generated headers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ckpt_events import parse_traceparent

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
