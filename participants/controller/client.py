"""The controller's HTTP client for the checkpoint control plane of one or more participants.

Every call carries the bearer token, the W3C ``traceparent`` of the span it is made for, and
a deadline: the timeout is ``(deadline_ts - now) + 5 s``, as in the original controller, and
bounds the whole call (a reply trickled a byte at a time too). A reply is read up to
``max_reply_bytes`` (``MAX_REPLY_BYTES``, 32 MiB, counted as decoded: a gzip or deflate reply is
inflated a step at a time, any other content-encoding refused) and no further; a redirect is
never followed.
Failures come back as one exception tree::

    ParticipantCallError        a control call did not succeed (``.code``, ``.status``, ``.url``),
    │                           or its reply could not be read (a broken content-encoding)
    └── ParticipantUnreachable  no HTTP answer at all (connection refused, timeout, ...)

(both defined in ``ckpt_events.participants.errors``, which draws the project's whole tree)

An error body ``{"error": {"code", "detail"}}`` gives ``code`` as an ``ErrorCode`` (and the
raw string in ``raw_code``, e.g. ``invalid_request`` for a malformed body); any other failed
reply keeps ``code=None`` and the status. Requests and replies are the Structs of
``ckpt_events.participants.protocol``; a reply that does not match its Struct is a ``ParticipantCallError``.
"""

from __future__ import annotations

import re
import time
from typing import Final, Protocol, TypeVar

import anyio
import httpx
import msgspec

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import (
    ParticipantCallError,
    ParticipantUnreachable,
    check_int,
    shown,
)
from ckpt_events.participants.protocol import CONTROL_PREFIX, ErrorBody, StatusReply, member_path
from ckpt_events.participants.replies import KEEPALIVE_SECONDS, MAX_REPLY_BYTES, never_connected, read_reply

__all__ = [
    "CLIENT_GRACE_SECONDS",
    "MAX_REPLY_BYTES",
    "ControlClient",
    "ParticipantCallError",
    "ParticipantUnreachable",
    "WHOLE_CALL_SLACK",
    "SpanLike",
    "failed_call",
    "never_connected",
    "read_reply",
    "what_came",
]

#: Added to the time left before the deadline, so a participant can still answer "too late".
CLIENT_GRACE_SECONDS: Final = 5.0
_MIN_TIMEOUT: Final = 0.5
#: The whole call may run this much past its timeout (httpx's per-read and connect bound).
WHOLE_CALL_SLACK: Final = 0.25
_error_decoder: Final = msgspec.json.Decoder(ErrorBody)
_encoder: Final = msgspec.json.Encoder()
R = TypeVar("R", bound=msgspec.Struct)


class SpanLike(Protocol):
    """Any ckpt_events span handle (live or no-op): it names itself as a ``traceparent``
    and passes on the ``tracestate`` its trace came with."""

    def traceparent(self) -> str | None: ...

    def tracestate(self) -> str | None: ...


def _text(response: httpx.Response, body: bytes) -> str:
    return body[:800].decode(response.encoding or "utf-8", errors="replace")


def _error_from(url: str, response: httpx.Response, body: bytes) -> ParticipantCallError:
    status = response.status_code
    location = response.headers.get("location")
    if response.is_redirect and location is not None:
        # Followed, the call (and its bearer token) would go to an origin nobody configured.
        said = (
            f"a redirect to {shown(location[:200])}, not followed"
            " (a control call goes only to its member's URL)"
        )
        return ParticipantCallError(url, said, status=status)
    try:
        error = _error_decoder.decode(body).error
    except msgspec.DecodeError:
        snippet = _text(response, body)[:200].strip() or response.reason_phrase
        return ParticipantCallError(url, snippet, status=status)
    return ParticipantCallError(url, error.detail, raw_code=error.code, status=status)


def _came(response: httpx.Response, text: str) -> str:
    media = response.headers.get("content-type", "no content type").split(";")[0].strip()
    if "json" in media:
        return ""
    return f"; it was {media}: {shown(text[:200].strip())}"


_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)$")


def _near(exc: msgspec.DecodeError, body: bytes) -> str:
    """For a JSON reply that is not JSON (``NaN``, a trailing comma): the text around the byte
    msgspec names, which alone ("invalid character (byte 91)") showed nothing of what came."""
    at = _AT_BYTE.search(str(exc))
    if at is None:
        return ""
    start = int(at[1])
    return f"; near it: {shown(body[max(0, start - 40) : start + 40].decode('utf-8', 'replace'))}"


def what_came(response: httpx.Response) -> str:
    """For a reply that did not decode: ``""`` if it said it was JSON, else its content type and
    the start of its body (a proxy's sign-in page, another server on the port), so the error
    says what came back, not only "JSON is malformed"."""
    return _came(response, response.text)


def _unsaid(exc: httpx.RequestError, timeout: float) -> str:
    """What an httpx error with no message of its own means (a reset says nothing)."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {timeout:.1f} s"
    if isinstance(exc, httpx.ReadError):
        return "the connection was reset or closed before the whole reply"
    if isinstance(exc, httpx.WriteError):
        return "the connection was reset or closed while the request was sent"
    return ""


def failed_call(url: str, exc: httpx.RequestError, timeout: float) -> ParticipantCallError:
    """httpx's failure of a call to ``url`` as ours: no answer (a ``TransportError``) is
    ``ParticipantUnreachable``; an answer that could not be read (a ``DecodingError``: a broken
    content-encoding) a ``ParticipantCallError``. Never httpx's own, which a fan-out would let
    cancel the other members' calls."""
    # httpx's timeouts say nothing ("ReadTimeout: "): say how long it waited.
    said = str(exc) or _unsaid(exc, timeout)
    detail = f"{type(exc).__name__}: {said}"
    if isinstance(exc, httpx.TransportError):
        return ParticipantUnreachable(url, detail, reached=not never_connected(exc))
    return ParticipantCallError(url, f"unreadable reply: {detail}")


class _PoolPerMember(httpx.AsyncBaseTransport):
    """Each request goes to its member's own connection pool, made at that member's first
    request (the coordinator learns its members after its client is made), with no cap on
    connections. A member is its origin and the path before ``CONTROL_PREFIX``: several members
    behind one origin (a load balancer, logical members of one server, told apart by a path) get
    a pool each; any other path goes to its origin's pool.

    One shared pool capped a fan-out at httpx's 100 connections: 256 members waited in waves for
    one another, and a call sent at the pool's pace reached its participant past the deadline
    (256 members holding a call 1.5 s, deadline 2.5 s away: 56 healthy ones refused it as
    ``deadline_exceeded``). Uncapped, one pool is quadratic: httpcore scans every connection of
    a pool at each request's start and end (a 256-member fan-out of 1 s calls took 3 to 6 s). A
    pool per member keeps that scan to the member's own connections:
    1.2 to 1.4 s, 0.2 s of the controller's CPU. Keyed by origin alone, 256 members behind one
    origin shared one pool and took 3.4 to 5.0 s again (1.7 to 3.2 s of CPU).
    """

    def __init__(self) -> None:
        # One TLS context for every pool: built per transport, it cost 17 ms and 0.9 MB each.
        self._tls = httpx.create_ssl_context()
        self._limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_SECONDS
        )
        self._pools: dict[tuple[bytes, bytes, int | None, bytes], httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        member = (url.raw_scheme, url.raw_host, url.port, member_path(url.raw_path))
        pool = self._pools.get(member)
        if pool is None:
            pool = self._pools[member] = httpx.AsyncHTTPTransport(verify=self._tls, limits=self._limits)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()


class ControlClient:
    """Calls the control routes of participants over one shared ``httpx.AsyncClient``.

    The client passed in stays the caller's (it is not closed here, and its limits apply: size
    them to the fleet, since a fan-out calls every member at once); without one, a client with a
    pool per participant and no cap on connections is created, and ``aclose()`` closes it.
    A reply longer than ``max_reply_bytes`` fails its call (``ParticipantCallError``, status
    kept) without being read further.
    """

    def __init__(
        self, token: str, *, client: httpx.AsyncClient | None = None, max_reply_bytes: int = MAX_REPLY_BYTES
    ) -> None:
        if not token:
            raise InvalidValueError("a control token is required")
        bound = f"max_reply_bytes must be a positive int, not {shown(max_reply_bytes)}"
        self._max_reply = check_int(max_reply_bytes, bound, minimum=1)
        self._auth = f"Bearer {token}"
        self._owned = client is None
        self._http = client if client is not None else httpx.AsyncClient(transport=_PoolPerMember())

    @property
    def auth_headers(self) -> dict[str, str]:
        """The bearer ``Authorization`` header (the work API takes the same token)."""
        return {"authorization": self._auth}

    @property
    def http(self) -> httpx.AsyncClient:
        """The underlying HTTP client (shared with the workload calls of rollout collection)."""
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; idempotent."""
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _headers(self, span: SpanLike | None) -> dict[str, str]:
        headers = {"authorization": self._auth}
        if span is not None:
            traceparent = span.traceparent()
            if traceparent is not None:
                headers["traceparent"] = traceparent
                tracestate = span.tracestate()
                if tracestate is not None:
                    headers["tracestate"] = tracestate
        return headers

    async def status(self, base_url: str, *, timeout: float = 60.0) -> StatusReply:
        """``GET /status``; a 404 raises ``ParticipantCallError`` with ``status=404``."""
        url = base_url.rstrip("/") + CONTROL_PREFIX + "/status"
        return await self._send("GET", url, None, StatusReply, timeout, None)

    async def call(
        self,
        base_url: str,
        operation: str,
        request: msgspec.Struct,
        reply_type: type[R],
        *,
        deadline_ts: float,
        span: SpanLike | None = None,
    ) -> R:
        """``POST /<operation>`` with ``request``; returns the reply decoded as ``reply_type``."""
        url = base_url.rstrip("/") + CONTROL_PREFIX + "/" + operation
        timeout = max(_MIN_TIMEOUT, deadline_ts - time.time() + CLIENT_GRACE_SECONDS)
        return await self._send("POST", url, request, reply_type, timeout, span)

    async def _send(
        self,
        method: str,
        url: str,
        request: msgspec.Struct | None,
        reply_type: type[R],
        timeout: float,
        span: SpanLike | None,
    ) -> R:
        headers = self._headers(span)
        if request is not None:
            headers["content-type"] = "application/json"
        reply: tuple[httpx.Response, bytes] | None = None
        # httpx's timeout bounds each read, not the call: a reply trickled a byte at a time held
        # a prepare with a 3 s deadline 20 s. The whole call is bounded too, a little past the
        # connect timeout, so a connection never made still ends as that (not reached).
        with anyio.move_on_after(timeout + WHOLE_CALL_SLACK):
            try:
                async with self._http.stream(
                    method,
                    url,
                    content=None if request is None else _encoder.encode(request),
                    headers=headers,
                    timeout=timeout,
                ) as response:
                    reply = response, await read_reply(url, response, self._max_reply)
            except httpx.RequestError as exc:
                raise failed_call(url, exc, timeout) from exc
        if reply is None:
            raise ParticipantUnreachable(
                url, f"TimeoutError: no whole answer within {timeout:.1f} s", reached=True
            )
        response, body = reply
        if response.status_code != 200:
            raise _error_from(url, response, body)
        try:
            return msgspec.json.decode(body, type=reply_type)
        except msgspec.DecodeError as exc:
            came = _came(response, _text(response, body)) or _near(exc, body)
            raise ParticipantCallError(url, f"unexpected reply: {exc}{came}", status=200) from exc
