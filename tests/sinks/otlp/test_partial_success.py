"""``partial_success``: a collector's 2xx body read for what it rejected, in protobuf and JSON;
a body that cannot be read says 0, never a guessed count."""

from __future__ import annotations

import gzip

import pytest

from ckpt_events.sinks.otlp._partial_success import partial_success, refusal

PROTO = "application/x-protobuf"
JSON = "application/json"

READ: dict[str, tuple[bytes, str | None, str | None, tuple[int, str]]] = {
    "protobuf spans": (b"\x0a\x0d\x08\x03\x12\x09bad spans", PROTO, None, (3, "bad spans")),
    "protobuf count only": (b"\x0a\x02\x08\x07", PROTO, None, (7, "")),
    "protobuf, no content type": (b"\x0a\x02\x08\x07", None, None, (7, "")),
    "protobuf, an unknown field first": (b"\x10\x01\x0a\x02\x08\x07", PROTO, None, (7, "")),
    "json int64 as a string": (
        b'{"partialSuccess":{"rejectedSpans":"3","errorMessage":"x"}}',
        JSON,
        None,
        (3, "x"),
    ),
    "json points as a number": (b'{"partialSuccess":{"rejectedDataPoints":2}}', JSON, None, (2, "")),
    "json snake case": (
        b'{"partial_success":{"rejected_spans":"4"}}',
        "application/json; charset=utf-8",
        None,
        (4, ""),
    ),
}

NOTHING: dict[str, tuple[bytes, str | None, str | None]] = {
    "an empty body": (b"", PROTO, None),
    "an empty partial success": (b"\x0a\x00", PROTO, None),
    "json {}": (b"{}", JSON, None),
    "json zero rejected, a message": (
        b'{"partialSuccess":{"rejectedSpans":"0","errorMessage":"hm"}}',
        JSON,
        None,
    ),
    "json negative": (b'{"partialSuccess":{"rejectedSpans":"-3"}}', JSON, None),
    "json a bool": (b'{"partialSuccess":{"rejectedSpans":true}}', JSON, None),
    "json not json": (b"<html>ok</html>", JSON, None),
    "protobuf truncated": (b"\x0a\x0d\x08\x03", PROTO, None),
    "protobuf negative (ten-byte varint)": (b"\x0a\x0b\x08" + b"\xfd" + b"\xff" * 8 + b"\x01", PROTO, None),
    "protobuf a varint that never ends": (b"\x0a\x0b\x08" + b"\xff" * 10, PROTO, None),
    "gzip-encoded": (gzip.compress(b"\x0a\x02\x08\x07"), PROTO, "gzip"),
    "html as protobuf": (b"<html>ok</html>", "text/html", None),
}


@pytest.mark.parametrize(("body", "content_type", "encoding", "expected"), READ.values(), ids=READ.keys())
def test_a_partial_success_is_read(
    body: bytes, content_type: str | None, encoding: str | None, expected: tuple[int, str]
) -> None:
    """The count and the message, in either encoding."""
    assert partial_success(body, content_type, encoding) == expected


@pytest.mark.parametrize(("body", "content_type", "encoding"), NOTHING.values(), ids=NOTHING.keys())
def test_what_cannot_be_read_rejects_nothing(
    body: bytes, content_type: str | None, encoding: str | None
) -> None:
    """No partial success, none rejected, or a body we cannot read: 0, never a guess."""
    assert partial_success(body, content_type, encoding) == (0, "")


REFUSALS: dict[str, tuple[bytes, str | None, str]] = {
    "protobuf google.rpc.Status": (b"\x08\x03\x12\x0finvalid span id", PROTO, "invalid span id"),
    "json Status": (b'{"code":3,"message":"bad trace id"}', JSON, "bad trace id"),
    "plain text, one line": (
        b"  rate limit\n for tenant x\n",
        "text/plain; charset=utf-8",
        "rate limit for tenant x",
    ),
    "plain text, cut": (b"y" * 5000, "text/plain", "y" * 200),
    "an empty body": (b"", PROTO, ""),
    "json without a message": (b'{"code":3}', JSON, ""),
    "html": (b"<html><body>502 Bad Gateway</body></html>", "text/html", ""),
    "binary as text": (b"\xff\xfe\x00garbage", "text/plain", ""),
    "protobuf garbage": (b"\xff\xff\xff", PROTO, ""),
}


@pytest.mark.parametrize(("body", "content_type", "expected"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refusals_reason_is_read(body: bytes, content_type: str | None, expected: str) -> None:
    """The collector's reason for a refusal (a Status message, or its plain text), bounded; ""
    when it gives none we can read."""
    assert refusal(body, content_type, None) == expected
