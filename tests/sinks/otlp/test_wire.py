"""Protobuf and OTLP/JSON pieces (``ckpt_events.sinks.otlp._wire``), read back by opentelemetry-proto."""

from __future__ import annotations

import math

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from ckpt_events.sinks.otlp._wire import SMALL_VARINTS, json_attributes, json_value, key_value, varint

VALUES = ["text", "", "ünïcode", True, False, 0, 1, -1, 2**63 - 1, -(2**63), 16_383, 16_384, 1.5, -0.25]


def _read_varint(data: bytes) -> int:
    value = 0
    for shift, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * shift)
        if not byte & 0x80:
            assert shift == len(data) - 1  # nothing after the last byte
            return value
    raise AssertionError("no final byte")


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16_383, 16_384, 2**32, 2**64 - 1])
def test_a_varint_reads_back(value: int) -> None:
    """Seven bits a byte, high bit set on all but the last, from the table or computed."""
    assert _read_varint(varint(value)) == value


def test_the_precomputed_varints_are_the_computed_ones() -> None:
    """Every entry of the table reads back as its index."""
    assert all(_read_varint(encoded) == n for n, encoded in enumerate(SMALL_VARINTS))


def test_a_negative_int_is_ten_bytes_of_twos_complement() -> None:
    """int64 -1 goes out as protobuf writes it: ten bytes."""
    assert varint(-1) == b"\xff" * 9 + b"\x01"


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_key_value_decodes_as_opentelemetry_proto_reads_it(value: object) -> None:
    """Each bytes KeyValue parses into the same key and typed value."""
    pair = KeyValue.FromString(key_value("user.k", value))
    assert pair.key == "user.k"
    field = pair.value.WhichOneof("value")
    expected = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}[type(value)]
    assert field == expected and getattr(pair.value, field) == value


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_json_value_parses_as_the_same_any_value(value: object) -> None:
    """OTLP/JSON (64-bit ints as strings) parses into the AnyValue protobuf would carry."""
    parsed = ParseDict(json_value(value), AnyValue())
    assert parsed == KeyValue.FromString(key_value("k", value)).value


def test_non_finite_floats_are_spelled_as_protobuf_json_reads_them() -> None:
    """NaN and the infinities are strings, not null."""
    assert json_value(math.inf) == {"doubleValue": "Infinity"}
    assert json_value(-math.inf) == {"doubleValue": "-Infinity"}
    assert math.isnan(ParseDict(json_value(math.nan), AnyValue()).double_value)


def test_an_int_outside_int64_is_refused_and_left_out_of_json_attributes() -> None:
    """Both encodings refuse it; json_attributes drops only that pair."""
    for encode in (lambda v: key_value("k", v), json_value):
        with pytest.raises(ValueError, match="outside int64"):
            encode(2**63)
    assert json_attributes({"a": 1, "big": -(2**63) - 1, "b": "x"}) == [
        {"key": "a", "value": {"intValue": "1"}},
        {"key": "b", "value": {"stringValue": "x"}},
    ]
