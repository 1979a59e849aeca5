"""``partial_success``: what a collector's 2xx answer says it rejected, read from its body.

An OTLP export response (``ExportTraceServiceResponse``, ``ExportMetricsServiceResponse``) may
carry ``partial_success``: the request was taken, but ``rejected_spans`` (or
``rejected_data_points``) of it were not, with an ``error_message``. Both messages have the same
wire layout (field 1: the count, field 2: the message), and in OTLP/JSON the count is the one
``rejected*`` key. A body that cannot be read (malformed, compressed, another format) says
nothing: 0 rejected, never a guessed count.

``refusal`` reads the collector's reason from a non-2xx answer: the ``message`` of the
``google.rpc.Status`` the OTLP spec asks for (protobuf field 2, or JSON ``message``), or a plain
text body, so that the one warning says why the collector refused, not only its status.
"""

from __future__ import annotations

import json
from typing import Final

__all__ = ["partial_success", "refusal"]

_NOTHING: Final = (0, "")
#: The longest error message kept (a hostile collector's text goes into a log line and stats).
_MAX_MESSAGE: Final = 200


def partial_success(body: bytes, content_type: str | None, encoding: str | None) -> tuple[int, str]:
    """``(rejected, error_message)`` from a 2xx reply's ``body`` in ``content_type`` (JSON if it
    says so, else protobuf); ``(0, "")`` when it says none or cannot be read."""
    if not body or (encoding is not None and encoding.strip().lower() not in ("", "identity")):
        return _NOTHING
    if content_type is not None and "json" in content_type.lower():
        rejected, message = _from_json(body)
    else:
        rejected, message = _from_protobuf(body)
    return (rejected, message[:_MAX_MESSAGE]) if rejected > 0 else _NOTHING


def refusal(body: bytes, content_type: str | None, encoding: str | None) -> str:
    """The reason a non-2xx reply's ``body`` gives (its ``Status.message``, or its plain text),
    stripped and at most ``_MAX_MESSAGE`` characters; ``""`` when it gives none we can read (an
    HTML error page, a compressed or malformed body)."""
    if not body or (encoding is not None and encoding.strip().lower() not in ("", "identity")):
        return ""
    kind = (content_type or "").lower()
    message: object = ""
    if "json" in kind:
        try:
            reply = json.loads(body)
        except (ValueError, RecursionError):
            return ""
        message = reply.get("message", "") if isinstance(reply, dict) else ""
    elif kind.startswith("text/plain"):
        head = body[: _MAX_MESSAGE * 4]  # a UTF-8 character is at most 4 bytes
        try:
            message = head.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 3 or len(head) == len(body):
                return ""  # not UTF-8: no guess
            message = head[: exc.start].decode("utf-8")  # the slice cut a character
        message = " ".join(message.split())  # one line
        if not message.isprintable():
            return ""
    elif "html" not in kind:  # protobuf, as the spec says, or an unnamed type
        fields = _fields(body)
        text = fields.get((2, 2)) if fields is not None else None
        message = text.decode("utf-8", "replace") if isinstance(text, bytes) else ""
    return message.strip()[:_MAX_MESSAGE] if isinstance(message, str) else ""


def _from_json(body: bytes) -> tuple[int, str]:
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return _NOTHING
    if not isinstance(reply, dict):
        return _NOTHING
    partial = reply.get("partialSuccess", reply.get("partial_success"))
    if not isinstance(partial, dict):
        return _NOTHING
    counts = [value for key, value in partial.items() if isinstance(key, str) and key.startswith("rejected")]
    if len(counts) != 1:
        return _NOTHING
    count = counts[0]
    # int64 is a string in OTLP/JSON; a number is accepted too (json.loads makes a bool no int here).
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool):
        return _NOTHING
    message = partial.get("errorMessage", partial.get("error_message", ""))
    return count, message if isinstance(message, str) else ""


def _from_protobuf(body: bytes) -> tuple[int, str]:
    """Field 1 of the response (length-delimited), and in it field 1 (varint) and 2 (string)."""
    fields = _fields(body)
    if fields is None:
        return _NOTHING
    partial = fields.get((1, 2))
    if not isinstance(partial, bytes):
        return _NOTHING
    inner = _fields(partial)
    if inner is None:
        return _NOTHING
    count = inner.get((1, 0), 0)
    text = inner.get((2, 2), b"")
    if not isinstance(count, int) or count >= 1 << 63 or not isinstance(text, bytes):
        return _NOTHING  # past int64: a negative count, not one to believe
    return count, text.decode("utf-8", "replace")


def _fields(data: bytes) -> dict[tuple[int, int], int | bytes] | None:
    """The last value of each (field number, wire type) in ``data``, or ``None`` if malformed."""
    found: dict[tuple[int, int], int | bytes] = {}
    at = 0
    end = len(data)
    while at < end:
        key, at = _varint(data, at)
        if key is None:
            return None
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == 0:
            varint, at = _varint(data, at)
            if varint is None:
                return None
            value = varint
        elif kind == 2:
            length, at = _varint(data, at)
            if length is None or at + length > end:
                return None
            value = data[at : at + length]
            at += length
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            if at + size > end:
                return None
            value = data[at : at + size]
            at += size
        else:
            return None
        if number == 0:
            return None
        found[(number, kind)] = value
    return found


def _varint(data: bytes, at: int) -> tuple[int | None, int]:
    value = 0
    for shift in range(0, 70, 7):  # at most ten bytes
        if at >= len(data):
            return None, at
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & ((1 << 64) - 1), at
    return None, at
