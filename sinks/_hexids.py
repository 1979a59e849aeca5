"""W3C hex ids in JSON lines: ``trace_id`` as 32 lowercase hex digits, span ids as 16.

Events carry their ids as ints (cheap to make and compare); a JSON number of 128 bits is
not something ``jq`` or a grep for the id a collector shows can use. So the JSON-lines sink
writes each span event through ``with_hex_ids``: ``msgspec.structs.replace`` makes a copy of
the frozen event whose id fields hold hex strings (a msgspec Struct does not type-check its
fields, and the encoder writes what it finds), which keeps the line's layout; the hex of ids
seen recently comes from a small cache. Measured per event against a per-class wire Struct
built positionally, a dict, and ``__copy__`` plus ``force_setattr``, this is the fastest:
writing costs about 0.2 us per span event more than with decimal ids, and the sink stays over
1 M events/s (``ckpt_events.benchmarks.bench_sinks``).

Reading goes the other way: ``WIRE_DECODER`` decodes a line into a wire twin of its event
class (ids typed ``str``, or ``int`` for logs written before hex ids), and ``from_wire`` builds
the real event with int ids. A hex id is checked (its length, lowercase hex digits) when it is
first seen and its int kept in a small cache: most ids repeat, and a dict lookup costs a tenth
of msgspec's regex check of the same field on every line (which took half the decoding time).
``from_wire`` is one function per class, generated from its fields, that passes each field
positionally (``astuple`` into a list and back cost 2 us per event more). JSON has no NaN or
infinity: msgspec writes a non-finite float attribute as ``null``, which is read back as NaN
(the one value changed, the event kept: it was a corrupt line).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from functools import reduce
from typing import Any, Final, get_args

import msgspec
from msgspec.structs import replace as _replace

from ckpt_events import CheckpointEvent, Event, SpanEvent

__all__ = [
    "STRICT_WIRE_DECODER",
    "WIRE_DECODER",
    "from_wire",
    "strict_twin_with",
    "with_hex_ids",
    "with_hex_ids_all",
]

_SPAN_EVENTS: Final = frozenset(c for c in get_args(CheckpointEvent) if issubclass(c, SpanEvent))
# The hex of recent ids: a trace id is on every event of its trace, a span id on its started
# and finished events and as its children's parent, so most lookups hit (a dict lookup costs a
# fifth of ``int.to_bytes().hex()``). Bounded; a race between threads only recomputes a value.
_CACHE_LIMIT: Final = 4096
_TRACE_HEX: Final[dict[int, str]] = {}
_SPAN_HEX: Final[dict[int, str]] = {}
_WIRE_TYPES: Final[dict[str, Any]] = {
    "trace_id": str | int,
    "span_id": str | int,
    "parent_span_id": str | int | None,
}
_DIGITS: Final = {"trace_id": 32, "span_id": 16, "parent_span_id": 16}
_LOWER_HEX: Final = re.compile("[0-9a-f]+")
#: The int of hex ids read recently, per length checked (bounded like the writer's caches).
_INT_OF: Final[dict[int, dict[str, int]]] = {32: {}, 16: {}}
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


def with_hex_ids_all(batch: list[Any]) -> list[Any]:
    """``with_hex_ids`` of every event of ``batch``, in order.

    Inline, not ``map(with_hex_ids, batch)``: without the call per event and the global
    lookups, and with consecutive events of one trace reusing its hex without a lookup, the
    conversion costs ~212 ns an event against ~245 (a request's six events, measured here).
    """
    out: list[Any] = []
    append = out.append
    span_events = _SPAN_EVENTS
    trace_hex = _TRACE_HEX.get
    span_hex = _SPAN_HEX.get
    last_trace = None
    last_text = ""
    for event in batch:
        if event.__class__ not in span_events:
            append(event)
            continue
        trace, span, parent = event.trace_id, event.span_id, event.parent_span_id
        if trace != last_trace:
            last_trace, last_text = trace, trace_hex(trace) or _remember(_TRACE_HEX, trace, 16)
        append(
            _replace(
                event,
                trace_id=last_text,
                span_id=span_hex(span) or _remember(_SPAN_HEX, span, 8),
                parent_span_id=None
                if parent is None
                else (span_hex(parent) or _remember(_SPAN_HEX, parent, 8)),
            )
        )
    return out


def _remember(cache: dict[int, str], value: int, size: int) -> str:
    """``value`` as ``2 * size`` hex digits, kept in ``cache`` (emptied when it is full)."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    text = cache[value] = value.to_bytes(size).hex()
    return text


def _read_id(value: str | int, field: str) -> int:
    """A hex id's int, checked and cached; an int id (an older log) as it is."""
    if type(value) is int:
        return value
    text = str(value)
    if len(text) != _DIGITS[field] or _LOWER_HEX.fullmatch(text) is None:
        raise msgspec.ValidationError(
            f"Expected `str` of {_DIGITS[field]} lowercase hex digits or `int` - at `$.{field}`"
        )
    cache = _INT_OF[len(text)]
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    number = cache[text] = int(text, 16)
    return number


def _nan_for_null(extra: dict[str, Any]) -> dict[str, Any]:
    return (
        {key: _NAN if value is None else value for key, value in extra.items()}
        if None in extra.values()
        else extra
    )


def _wire_twin(
    cls: type[Event], strict: bool = False, extras: tuple[str, ...] = ()
) -> tuple[type[msgspec.Struct], Callable[[Any], CheckpointEvent]]:
    """A Struct with ``cls``'s tag and fields, its id fields typed ``str | int`` and its
    ``attributes`` values nullable (a NaN or an infinity), and the function that turns one
    into a ``cls``; ``strict``, a field it does not have fails the decoding. Each of
    ``extras`` is taken too, optional, undecoded, in attribute ``extra_<i>`` (``UNSET`` when
    absent)."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    arguments: list[str] = []
    for field in msgspec.structs.fields(cls):
        kind, name = _WIRE_TYPES.get(field.name, field.type), field.name
        if name == "parent_span_id":
            arguments.append(
                f"None if w.{name} is None else (_span(w.{name}) or _read_id(w.{name}, {name!r}))"
            )
        elif name in _WIRE_TYPES:
            get = "_trace" if name == "trace_id" else "_span"
            arguments.append(f"{get}(w.{name}) or _read_id(w.{name}, {name!r})")
        elif name == "attributes":
            kind = dict[str, str | bool | int | float | None] | None
            arguments.append(f"None if w.{name} is None else _nan_for_null(w.{name})")
        else:
            arguments.append(f"w.{name}")
        fields.append((name, kind) if field.required else (name, kind, field.default))
    # After the class's fields (optional fields may not come before required ones), named
    # apart from them: a field is ``extra_<i>`` whatever the line calls it.
    rename = {f"extra_{i}": name for i, name in enumerate(extras)}
    fields.extend((attribute, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET) for attribute in rename)
    twin = msgspec.defstruct(
        f"_{'Strict' if strict else ''}Wire{cls.__name__}",
        fields,
        rename=rename or None,
        tag_field="type",
        tag=cls.__struct_config__.tag,
        frozen=True,
        gc=False,
        forbid_unknown_fields=strict,
    )
    # Generated (as dataclasses does): every field passed by position, ids looked up first.
    namespace: dict[str, Any] = {
        "cls": cls,
        "_trace": _INT_OF[32].get,
        "_span": _INT_OF[16].get,
        "_read_id": _read_id,
        "_nan_for_null": _nan_for_null,
    }
    exec(f"def convert(w):\n    return cls({', '.join(arguments)})", namespace)
    convert: Callable[[Any], CheckpointEvent] = namespace["convert"]
    return twin, convert


_TWINS: Final = dict(map(_wire_twin, get_args(CheckpointEvent)))
_STRICT_TWINS: Final = dict(_wire_twin(cls, strict=True) for cls in get_args(CheckpointEvent))

#: Decodes one JSON line into the wire twin of its event class (give it to ``from_wire``);
#: fields its class does not have are ignored.
WIRE_DECODER: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder(reduce(operator.or_, _TWINS))
#: The same, but a field its class does not have (a newer version's) fails the decoding
#: (``msgspec.ValidationError``), at no cost to a line without one.
STRICT_WIRE_DECODER: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder(
    reduce(operator.or_, _STRICT_TWINS)
)
_TWINS.update(_STRICT_TWINS)


def strict_twin_with(
    cls: type[Event], extras: tuple[str, ...]
) -> tuple[type[msgspec.Struct], Callable[[Any], CheckpointEvent]]:
    """The strict wire twin of ``cls`` that also takes the fields ``extras`` (fields its class
    does not have: none of them may name one it has, nor hold a quote, a backslash or a
    control character), each optional and undecoded in attribute ``extra_<i>``, ``UNSET``
    when the line lacks it; and the function that turns one into a ``cls`` (not
    ``from_wire``, which knows only the twins built here once)."""
    return _wire_twin(cls, strict=True, extras=extras)


def from_wire(wire: Any) -> CheckpointEvent:
    """The typed event a decoded wire twin stands for, ids back to ints; raises
    ``msgspec.ValidationError`` for a hex id of the wrong length or digits."""
    return _TWINS[type(wire)](wire)
