"""Protobuf wire pieces and OTLP/JSON values shared by our span and metric encoders.

Hand-written protobuf: a varint, a length-delimited field, an ``AnyValue`` and a
``KeyValue``; and the OTLP/JSON mapping of attribute values (64-bit integers as strings).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

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
    """A length-delimited field: tag byte, length, payload."""
    return bytes((tag,)) + varint(len(payload)) + payload


def _any_value(value: object) -> bytes:
    if isinstance(value, str):
        return field(0x0A, value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + DOUBLE.pack(value)
    return field(0x0A, str(value).encode())


def key_value(key: str, value: object) -> bytes:
    """A ``KeyValue`` message's bytes (without its own tag)."""
    return field(0x0A, key.encode()) + field(0x12, _any_value(value))


def json_value(value: object) -> dict[str, Any]:
    """An OTLP/JSON ``AnyValue``."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def json_attributes(attributes: Mapping[str, object]) -> list[dict[str, Any]]:
    """OTLP/JSON ``KeyValue`` list."""
    return [{"key": key, "value": json_value(value)} for key, value in attributes.items()]
