"""W3C trace context: ids and the ``traceparent`` header, without any OpenTelemetry import.

Ids are plain ints (trace 128 bit, span 64 bit), as OpenTelemetry's SDK uses them, so a
span sink can rebuild a ``SpanContext`` without parsing. A malformed header is ignored:
``parse_traceparent`` returns ``None`` and a new trace starts.
"""

from __future__ import annotations

import random
import re
from typing import Final, NamedTuple

from ckpt_events._errors import InvalidValueError, check_int, shown
from ckpt_events._public_home import publish

__all__ = [
    "RemoteParent",
    "format_traceparent",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "parse_tracestate",
]

_TRACEPARENT: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
# W3C trace context, tracestate: a key is lowercase, simple or ``tenant@system``; a value
# is up to 256 printable ASCII characters without ``,`` and ``=``, not ending in a space.
_TRACESTATE_MEMBER: Final = re.compile(
    r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
#: W3C: a tracestate has at most 32 list members; OpenTelemetry reads at most 8192 characters.
MAX_TRACESTATE_MEMBERS: Final = 32
MAX_TRACESTATE_LENGTH: Final = 8192
_getrandbits: Final = random.getrandbits  # the global Random is reseeded after fork


class RemoteParent(NamedTuple):
    """The caller's span, as named by an incoming ``traceparent``."""

    trace_id: int
    span_id: int
    sampled: bool


def new_trace_id() -> int:
    """A random, non-zero 128-bit trace id."""
    while True:
        value = _getrandbits(128)
        if value:
            return value


def new_span_id() -> int:
    """A random, non-zero 64-bit span id."""
    while True:
        value = _getrandbits(64)
        if value:
            return value


def parse_traceparent(header: object) -> RemoteParent | None:
    """Parse a W3C ``traceparent`` header value; anything malformed gives ``None``.

    Follows the spec's rules: version ``ff`` is invalid, all-zero ids are invalid, and a
    version 00 header must have exactly four parts (later versions may append fields).
    """
    if not isinstance(header, str) or len(header) > 512:
        return None
    # Only W3C's optional whitespace (space, tab) around it: str.strip() took any Unicode
    # space too (\x0b, \xa0, \u2009), continuing a trace OpenTelemetry refuses.
    match = _TRACEPARENT.match(header.strip(" \t"))  # lowercase only, as W3C and OpenTelemetry say
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id = int(trace_hex, 16)
    span_id = int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return RemoteParent(trace_id, span_id, bool(int(flags_hex, 16) & 1))


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """The ``traceparent`` header value naming span ``span_id`` of trace ``trace_id``.

    Either id out of its W3C range (1 to 2**128 - 1, 1 to 2**64 - 1) raises: formatted as it
    was, a float or ``None`` was a bare ``ValueError``/``TypeError``, and 0, a negative or an
    oversized id a header every receiver drops.
    """
    for what, value, bits in (("trace_id", trace_id, 128), ("span_id", span_id, 64)):
        if type(value) is not int or not 0 < value < 1 << bits:  # an int subclass: checked in full
            message = f"{what} must be an int from 1 to 2**{bits} - 1, not {shown(value)}"
            if check_int(value, message, minimum=1) >= 1 << bits:
                raise InvalidValueError(message)
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def parse_tracestate(header: object) -> str | None:
    """The W3C ``tracestate`` to pass on, normalised (``k=v,k2=v2``), or ``None`` to drop it.

    ``header`` is the value (several header fields joined with ``,``, as HTTP combines
    them). Empty members and the optional whitespace around members are dropped; the whole
    header is dropped when a member is malformed, a key repeats, it has more than 32
    members or more than 8192 characters (as OpenTelemetry's propagator does). Only pass it
    on with the ``traceparent`` it came with: a tracestate without a valid parent is noise.
    """
    if not isinstance(header, str) or len(header) > MAX_TRACESTATE_LENGTH:
        return None
    members: list[str] = []
    keys: set[str] = set()
    for raw in header.split(","):
        member = raw.strip(" \t")
        if not member:
            continue
        if _TRACESTATE_MEMBER.fullmatch(member) is None:
            return None
        key = member[: member.index("=")]
        if key in keys:
            return None
        keys.add(key)
        members.append(member)
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    return ",".join(members)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish(
    "ckpt_events",
    RemoteParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    parse_tracestate,
)
