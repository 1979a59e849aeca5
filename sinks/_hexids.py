"""W3C hex ids in JSON lines: ``trace_id`` as 32 lowercase hex digits, span ids as 16.

Events carry their ids as ints (cheap to make and compare); a JSON number of 128 bits is
not something ``jq`` or a grep for the id a collector shows can use. So the JSON-lines sink
writes each span event through ``with_hex_ids``: ``msgspec.structs.replace`` makes a copy of
the frozen event whose id fields hold hex strings (a msgspec Struct does not type-check its
fields, and the encoder writes what it finds), which keeps the line's layout; the hex of ids
seen recently comes from a small cache. Measured per event against a per-class wire Struct
built positionally, a dict, and ``__copy__`` plus ``force_setattr``, this is the fastest:
writing costs about 0.2 us per span event more than with decimal ids, and the sink stays over
1 M events/s (``benchmarks.bench_sinks``).

Reading goes the other way: ``WIRE_DECODER`` decodes a line into a wire twin of its event
class (ids typed ``str`` of the right length in lowercase hex, or ``int`` for logs written
before hex ids), and ``from_wire`` builds the real event positionally with int ids. JSON
has no NaN or infinity: msgspec writes a non-finite float attribute as ``null``, which is
read back as NaN (the one value changed, the event kept: it was a corrupt line).
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Annotated, Any, Final, cast, get_args

import msgspec
from msgspec.structs import replace as _replace

from ckpt_events import CheckpointEvent, Event, SpanEvent

__all__ = ["WIRE_DECODER", "from_wire", "with_hex_ids"]

_TraceHex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
_SpanHex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16}$")]
_SPAN_EVENTS: Final = frozenset(c for c in get_args(CheckpointEvent) if issubclass(c, SpanEvent))
# The hex of recent ids: a trace id is on every event of its trace, a span id on its started
# and finished events and as its children's parent, so most lookups hit (a dict lookup costs a
# fifth of ``int.to_bytes().hex()``). Bounded; a race between threads only recomputes a value.
_CACHE_LIMIT: Final = 4096
_TRACE_HEX: Final[dict[int, str]] = {}
_SPAN_HEX: Final[dict[int, str]] = {}
_WIRE_TYPES: Final[dict[str, Any]] = {
    "trace_id": _TraceHex | int,
    "span_id": _SpanHex | int,
    "parent_span_id": _SpanHex | int | None,
}
_NAN: Final = float("nan")


def with_hex_ids(event: Any) -> Any:
    """``event`` itself if it has no span ids, else a copy carrying them as hex strings."""
    if event.__class__ not in _SPAN_EVENTS:
        return event
    trace, span, parent = event.trace_id, event.span_id, event.parent_span_id
    return _replace(
        event,
        trace_id=_TRACE_HEX.get(trace) or _remember(_TRACE_HEX, trace, 16),
        span_id=_SPAN_HEX.get(span) or _remember(_SPAN_HEX, span, 8),
        parent_span_id=None if parent is None else (_SPAN_HEX.get(parent) or _remember(_SPAN_HEX, parent, 8)),
    )


def _remember(cache: dict[int, str], value: int, size: int) -> str:
    """``value`` as ``2 * size`` hex digits, kept in ``cache`` (emptied when it is full)."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    text = cache[value] = value.to_bytes(size).hex()
    return text


def _wire_twin(cls: type[Event]) -> tuple[type[msgspec.Struct], type[Event], tuple[int, ...], int | None]:
    """A Struct with ``cls``'s tag and fields, its id fields typed for hex or int, and where its
    ``attributes`` are (their values may be ``null``: a NaN or an infinity)."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    positions: list[int] = []
    attributes: int | None = None
    for index, field in enumerate(msgspec.structs.fields(cls)):
        kind = _WIRE_TYPES.get(field.name, field.type)
        if field.name in _WIRE_TYPES:
            positions.append(index)
        if field.name == "attributes":
            kind, attributes = dict[str, str | bool | int | float | None] | None, index
        fields.append((field.name, kind) if field.required else (field.name, kind, field.default))
    twin = msgspec.defstruct(
        f"_Wire{cls.__name__}",
        fields,
        tag_field="type",
        tag=cls.__struct_config__.tag,
        frozen=True,
        gc=False,
    )
    return twin, cls, tuple(positions), attributes


_TWINS: Final = {
    twin: (cls, positions, attributes)
    for twin, cls, positions, attributes in map(_wire_twin, get_args(CheckpointEvent))
}

#: Decodes one JSON line into the wire twin of its event class (give it to ``from_wire``).
WIRE_DECODER: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder(reduce(operator.or_, _TWINS))


def from_wire(wire: Any) -> CheckpointEvent:
    """The typed event a decoded wire twin stands for, ids back to ints."""
    cls, positions, attributes = _TWINS[type(wire)]
    values = list(msgspec.structs.astuple(wire))
    for index in positions:
        value = values[index]
        if type(value) is str:
            values[index] = int(value, 16)
    if attributes is not None:
        extra = values[attributes]
        if extra and None in extra.values():
            values[attributes] = {key: _NAN if value is None else value for key, value in extra.items()}
    return cast("CheckpointEvent", cls(*values))
