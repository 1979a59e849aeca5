"""Protobuf wire pieces and OTLP/JSON values shared by our span and metric encoders.

Hand-written protobuf: a varint, a length-delimited field, an ``AnyValue`` and a
``KeyValue``; and the OTLP/JSON mapping of attribute values (64-bit integers as strings).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Final

from ckpt_events.sinks._wire_safe import INT64_MAX, INT64_MIN
from ckpt_events.sinks.otlp import _tags as tags

__all__ = [
    "DOUBLE",
    "FIXED64",
    "SMALL_VARINTS",
    "field",
    "json_attributes",
    "json_value",
    "key_value",
    "varint",
]

DOUBLE: Final = struct.Struct("<d")
FIXED64: Final = struct.Struct("<Q")


def _varint_of(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 as two's complement, ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


#: The varints of 0 .. 16383, precomputed (most lengths a span encoder writes).
SMALL_VARINTS: Final = tuple(_varint_of(n) for n in range(1 << 14))


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (negative: int64 two's complement)."""
    return SMALL_VARINTS[value] if 0 <= value < 16384 else _varint_of(value)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte (a ``sinks.otlp._tags`` name under 128), length, payload."""
    return bytes((tag,)) + varint(len(payload)) + payload


_TRUE: Final = bytes((tags.ANY_VALUE_BOOL, 1))
_FALSE: Final = bytes((tags.ANY_VALUE_BOOL, 0))
_INT: Final = bytes((tags.ANY_VALUE_INT,))
_DOUBLE: Final = bytes((tags.ANY_VALUE_DOUBLE,))


def _any_value(value: object) -> bytes:
    if isinstance(value, str):
        return field(tags.ANY_VALUE_STRING, value.encode())
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{value} is outside int64")  # OpenTelemetry's encoder drops it too
        return _INT + varint(value)
    if isinstance(value, float):
        return _DOUBLE + DOUBLE.pack(value)
    return field(tags.ANY_VALUE_STRING, str(value).encode())


def key_value(key: str, value: object) -> bytes:
    """A ``KeyValue`` message's bytes (without its own tag).

    Raises ``ValueError`` for a pair protobuf cannot carry: a surrogate in the key or a string
    value (``UnicodeEncodeError``), an int outside int64.
    """
    return field(tags.KEY_VALUE_KEY, key.encode()) + field(tags.KEY_VALUE_VALUE, _any_value(value))


def json_value(value: object) -> dict[str, Any]:
    """An OTLP/JSON ``AnyValue``; ``ValueError`` for an int outside int64.

    NaN and the infinities are the strings protobuf's JSON mapping reads ("NaN", "Infinity",
    "-Infinity"); as numbers they would go out as ``null``.
    """
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{value} is outside int64")
        return {"intValue": str(value)}
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def json_attributes(attributes: Mapping[str, object]) -> list[dict[str, Any]]:
    """OTLP/JSON ``KeyValue`` list; a pair with an int outside int64 is left out (as OpenTelemetry
    does), so a caller counts ``len(attributes) - len(result)`` values dropped."""
    pairs = []
    for key, value in attributes.items():
        try:
            pairs.append({"key": key, "value": json_value(value)})
        except ValueError:
            continue
    return pairs
