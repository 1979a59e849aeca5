"""Connections that cannot starve a server: a header timeout, a request deadline, per-peer caps.

uvicorn's ``limit_concurrency`` counts connections, and nothing closes one that never sends a
request: 520 idle sockets from one peer made every ``/status`` a 503 for as long as they stayed
open (over 100 s). ``guarded_h11`` returns uvicorn's h11 protocol with a ``ConnectionGuard`` in
front, one per server:

- a connection that has not sent a complete request head within ``header_timeout`` of opening
  (or of its previous response) is closed, however slowly it trickles bytes (nginx's
  ``client_header_timeout``; a partial head gets a 408 first);
- the whole request, head and body, must arrive within ``request_timeout`` of that same start;
  then the route runs for as long as it needs (a prepare waits until its own deadline);
- a response the client stops reading is cut after ``send_timeout`` of stalled writes;
- only connections *waiting* for a request head (for ``displace_after`` at least) can be
  displaced: a new connection past ``max_per_peer`` from its address closes that address's
  oldest waiting connection, past ``max_connections`` the oldest waiting one of any address.
  Idle sockets therefore delay no one's request; when no connection can be displaced (all
  busy with a request, or just made) the new one is answered 503;
- requests running at once (a route may outlive its dropped connection) are bounded by
  ``max_requests``, 503 past it. uvicorn's own ``limit_concurrency`` is off: it counts idle
  connections too.

A refused or displaced connection is answered that 503 (``connection: close``) and then reads
and drops what its client sends until the client closes, for at most ``REFUSED_LINGER``: closed
at once, a request already sent made the kernel reset the connection, and the client saw a
connection error instead of the 503. A client whose idle keep-alive connection is displaced
finds it answered and closed before its next request (a pool drops a connection it finds
readable), as after uvicorn's keep-alive timeout. Counts are in ``ConnectionGuard.stats()``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle
from uvicorn.server import ServerState

from ckpt_events.participants.errors import check_int, check_number, shown
from ckpt_events.participants.protocol import ErrorBody, ErrorDetail, encode

__all__ = [
    "BAD_REQUEST",
    "ConnectionGuard",
    "ConnectionLimits",
    "GuardStats",
    "GuardedH11Protocol",
    "guarded_h11",
]

#: The code of a 503 from the guard (every connection busy, or too many requests running).
OVERLOADED: Final = "overloaded"


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server lets its clients hold; times in seconds. A value out of range raises
    ``InvalidValueError`` (a ``ValueError``), one of the wrong type ``InvalidTypeError`` (a
    ``TypeError``; a ``bool`` is no number)."""

    #: From a connection's start (or its previous response) to a complete request head.
    header_timeout: float = 5.0
    #: From that same start to the request's last body byte.
    request_timeout: float = 30.0
    #: How long a response's writes may stay blocked on a client that does not read.
    send_timeout: float = 30.0
    #: Connections open at once; past it the oldest waiting one is closed.
    max_connections: int = 512
    #: Connections open at once from one address; past it that address's oldest waiting one is closed.
    max_per_peer: int = 256
    #: Requests running at once (503 past it).
    max_requests: int = 512
    #: How long a connection must have waited before it can be displaced. Connections accepted in
    #: one batch are all made before any is read: without it, a burst of real clients past a cap
    #: would close each other's connections with their heads unread (a 503 is clearer).
    displace_after: float = 0.1

    def __post_init__(self) -> None:
        for name in ("header_timeout", "request_timeout", "send_timeout"):
            seconds = getattr(self, name)
            check_number(seconds, f"{name} must be > 0, not {shown(seconds)}", low_open=True)
        check_number(self.displace_after, f"displace_after must be >= 0, not {shown(self.displace_after)}")
        for name in ("max_connections", "max_per_peer", "max_requests"):
            count = getattr(self, name)
            check_int(count, f"{name} must be >= 1, not {shown(count)}", minimum=1)


class GuardStats(msgspec.Struct, frozen=True):
    """A guard's counts since its server started; ``open``, ``waiting`` and ``running`` are now."""

    open: int
    waiting: int
    running: int
    header_timeouts: int
    request_timeouts: int
    send_timeouts: int
    displaced: int
    refused: int
    overloaded: int
    #: Refused or displaced connections open now, until their client has read the 503 (at most
    #: ``REFUSED_LINGER``).
    lingering: int = 0


def _busy_body(detail: str) -> bytes:
    return encode(ErrorBody(error=ErrorDetail(code=OVERLOADED, detail=detail)))


_REFUSED_BODY: Final = _busy_body("every connection is busy with a request; retry shortly")
#: Written raw: the connection is refused before any request was read.
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)
#: How long a refused connection may stay open for its client to read the 503, and how many
#: may at once (past that, closed at once): each holds a descriptor for at most that second.
REFUSED_LINGER: Final = 1.0
MAX_LINGERING: Final = 1024
_TIMED_OUT: Final = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
#: h11's bound on an incomplete head when uvicorn's ``h11_max_incomplete_event_size`` is None
#: (``server_limits`` sets 64 KiB).
_H11_DEFAULT_HEAD_BYTES: Final = 16 * 1024
#: The code of a 400 for a request head h11 refuses (malformed, or too long before complete).
BAD_REQUEST: Final = "bad_request"


def _bad_head(limit: int) -> bytes:
    """The raw 400 for a request head h11 refused: the protocol's error body, not uvicorn's plain
    text. h11 does not say which of the two causes it was, so the detail names both."""
    detail = (
        f"the request head is not valid HTTP/1.1, or grew past {limit:,} bytes before it was "
        "complete: send a well-formed head under that size"
    )
    body = encode(ErrorBody(error=ErrorDetail(code=BAD_REQUEST, detail=detail)))
    return (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


class ConnectionGuard:
    """The shared state of one server's guarded connections: counts per peer, the waiting ones
    oldest first, and the counters of ``stats()``. Runs on the server's event loop only."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._per_peer: dict[str, int] = {}
        self._open = 0
        # Insertion-ordered sets: the first key is the connection waiting longest.
        self._waiting: dict[GuardedH11Protocol, None] = {}
        self._waiting_of: dict[str, dict[GuardedH11Protocol, None]] = {}
        self._app: _Admission | None = None
        self.header_timeouts = 0
        self.request_timeouts = 0
        self.send_timeouts = 0
        self.displaced = 0
        self.refused = 0
        self.overloaded = 0
        #: Refused or displaced connections still reading until their client has the 503.
        self.lingering = 0

    def stats(self) -> GuardStats:
        """Connections open and waiting now, and what was timed out, displaced or refused."""
        return GuardStats(
            open=self._open,
            waiting=len(self._waiting),
            running=0 if self._app is None else self._app.running,
            header_timeouts=self.header_timeouts,
            request_timeouts=self.request_timeouts,
            send_timeouts=self.send_timeouts,
            displaced=self.displaced,
            refused=self.refused,
            overloaded=self.overloaded,
            lingering=self.lingering,
        )

    def admission(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind the ``max_requests`` bound (built once per server)."""
        if self._app is None or self._app.app is not app:
            self._app = _Admission(app, self)
        return self._app

    def admit(self, conn: GuardedH11Protocol) -> bool:
        """Count a new connection in, displacing a waiting one when over a cap; False: refuse it."""
        limits = self.limits
        peer = conn.peer
        if self._per_peer.get(peer, 0) >= limits.max_per_peer:
            victim = next(iter(self._waiting_of.get(peer, ())), None)
        elif self._open >= limits.max_connections:
            victim = next(iter(self._waiting), None)
        else:
            victim = conn  # under the caps: nobody to displace
        if victim is None or (
            victim is not conn and conn.loop.time() - victim.waiting_since < limits.displace_after
        ):
            self.refused += 1
            return False
        if victim is not conn:
            # Counted out now, not when its close completes: a burst must displace a new one each.
            self.displaced += 1
            victim.displace()
        self._open += 1
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return True

    def waiting(self, conn: GuardedH11Protocol) -> None:
        """``conn`` waits for a request head: it may be displaced."""
        self._waiting[conn] = None
        self._waiting_of.setdefault(conn.peer, {})[conn] = None

    def busy(self, conn: GuardedH11Protocol) -> None:
        """``conn`` has a request: it is no longer displaceable."""
        self._waiting.pop(conn, None)
        of_peer = self._waiting_of.get(conn.peer)
        if of_peer is not None:
            of_peer.pop(conn, None)
            if not of_peer:
                del self._waiting_of[conn.peer]

    def release(self, conn: GuardedH11Protocol) -> None:
        """``conn`` is gone (called once per admitted connection)."""
        self.busy(conn)
        self._open -= 1
        left = self._per_peer[conn.peer] - 1
        if left:
            self._per_peer[conn.peer] = left
        else:
            del self._per_peer[conn.peer]


class _Admission:
    """503 past ``max_requests`` requests inside the app (counted here, not in uvicorn's task set:
    tasks of one burst all exist before the first runs)."""

    def __init__(self, app: ASGIApp, guard: ConnectionGuard) -> None:
        self.app = app
        self.guard = guard
        self.running = 0
        self.body = _busy_body(f"{guard.limits.max_requests} requests are running; retry shortly")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.running >= self.guard.limits.max_requests:
            self.guard.overloaded += 1
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(self.body)).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})
            return
        self.running += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.running -= 1


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a ``ConnectionGuard`` (``guarded_h11`` makes one per server)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # The guard bounds connections and requests itself: uvicorn's check counts idle ones.
        self.limit_concurrency = None
        self.app = self.guard.admission(self.app)
        self.peer = ""
        self._admitted = False
        self._timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        #: The loop time at which the connection began waiting for its current request head.
        self.waiting_since = 0.0
        self._partial = False  # bytes of a head arrived since then
        self._seen: RequestResponseCycle | None = None
        self._reading_body = False
        self._lingering = False  # refused: reading until the client has its 503

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        if not self.guard.admit(self):
            self._refuse()
            return
        self._admitted = True
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._cancel_timers()
        if self._lingering:
            self._lingering = False
            self.guard.lingering -= 1
        if self._admitted:
            self._admitted = False
            self.guard.release(self)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # refused or displaced, and closing: nothing it sends is a request
        if self._seen is None or self._seen.response_complete:
            self._partial = True
        super().data_received(data)
        self._observe()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request at once
        if self.transport.is_closing():
            return
        if self.cycle is self._seen:
            self._await_head()
        else:
            self._observe()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.guard.limits.send_timeout, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request head h11 refuses (malformed, or past
        ``h11_max_incomplete_event_size`` before it was complete), as the protocol's JSON error
        body (uvicorn's is plain text), then closed as a refused connection is: a 1 MB head
        still being sent made the kernel reset the connection and drop the 400 with it."""
        self._disarm()
        if self._admitted:
            self._admitted = False
            self.guard.release(self)
        limit = self.config.h11_max_incomplete_event_size
        self._refuse(_bad_head(_H11_DEFAULT_HEAD_BYTES if limit is None else limit))

    def _refuse(self, answer: bytes = _REFUSED) -> None:
        """Answer 503 (or ``answer``) and close (a refused or displaced connection), reading (and
        dropping) what the client sends until it has the answer: closed at once, a request already
        in the socket's buffer made the kernel reset the connection and drop the 503 with it
        (1,000 prepares at once from one address: 744 ``ReadError``, no 503)."""
        self.transport.write(answer)
        guard = self.guard
        if guard.lingering >= MAX_LINGERING or not self.transport.can_write_eof():
            self.transport.close()
            return
        guard.lingering += 1
        self._lingering = True
        # Our side is done (FIN after the 503); the client's EOF closes it (``eof_received``),
        # else the timer does.
        self.transport.write_eof()
        self._arm(REFUSED_LINGER, self.transport.close)

    def displace(self) -> None:
        """Close this waiting connection to make room for a new one (counted out at once)."""
        self._disarm()
        if self._admitted:
            self._admitted = False
            self.guard.release(self)
        if self._send_timer is not None:
            self.transport.abort()  # its last reply is still unread: close would wait on it
        else:
            # Its client may have sent a request the loop has not read yet: it gets the 503.
            self._refuse()

    def _await_head(self) -> None:
        self.waiting_since = self.loop.time()
        self._partial = False
        self._reading_body = False
        self._arm(self.guard.limits.header_timeout, self._head_timed_out)
        self.guard.waiting(self)

    def _observe(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen and not cycle.response_complete:
            # A new request head is complete: the connection is busy, its body on the clock.
            self._seen = cycle
            self.guard.busy(self)
            self._reading_body = cycle.more_body
            if self._reading_body:
                left = self.waiting_since + self.guard.limits.request_timeout - self.loop.time()
                self._arm(max(left, 0.0), self._body_timed_out)
            else:
                self._disarm()
        elif self._reading_body and cycle is self._seen and cycle is not None and not cycle.more_body:
            self._reading_body = False
            self._disarm()

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cancel_timers(self) -> None:
        self._disarm()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._send_timer is not None:
            return  # a client not reading its last reply is the send timer's to cut
        self.guard.header_timeouts += 1
        if self._partial:
            self.transport.write(_TIMED_OUT)
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._timer = None
        self.guard.request_timeouts += 1
        # abort, not close: close would first flush to a client that may not read.
        self.transport.abort()

    def _send_stalled(self) -> None:
        # Also after a close (uvicorn's keep-alive timeout): it waits for a flush that never ends.
        self._send_timer = None
        self.guard.send_timeouts += 1
        self.transport.abort()


def guarded_h11(limits: ConnectionLimits | None = None) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with its own ``ConnectionGuard``.

    One per server: the guard's counts are the server's (read them at ``cls.guard.stats()``).
    """
    guard = ConnectionGuard(limits if limits is not None else ConnectionLimits())
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})
