"""The scrape endpoint's HTTP server: request heads read on one thread, scrapes on a few.

``ThreadingHTTPServer`` gave every connection a thread and a slot at accept, and its socket
timeout was per read: 8 peers trickling one byte every 3 s held all 8 slots, and 30 of 30
scrapes got 503. Here one selector thread accepts connections and reads their request heads
without blocking; a connection only takes a slot (a handler thread) once its head is complete,
so a peer that never finishes a head costs a socket and a buffer, never a scrape's slot.
Replies are written the same way: a handler renders into memory, sends what the socket takes at
once and hands the rest to the selector thread, so a peer that does not read its reply (8 such
peers of a 6.7 MB page held all 8 slots for the timeout, and every scrape meanwhile got 503)
costs a socket and a reference to the page, never a slot.

- A head whose first byte cannot start a request line (a TLS ClientHello, binary bytes) is
  answered 400 and closed as it arrives.
- A head must be complete within ``header_timeout`` of the accept (408 and closed; silent if
  nothing came), and the whole request, to the reply's last byte, within ``timeout``: a reply
  not taken by then is cut off (closed), counted in ``slow_readers``.
- At most ``MAX_WRITING`` replies wait for their peers to read them; one more cuts off the
  oldest (counted in ``slow_readers`` too), so slow readers can only displace each other.
- Waiting connections are capped: past ``max_waiting`` (or ``max_waiting // 2`` from one
  address) a new connection closes the oldest waiting one (of that address first), once it
  has waited a moment, so idle sockets can only displace each other; a new connection with
  nothing to displace is answered 503.
- A complete head finding every slot busy, or no thread to be had, is answered 503 at once,
  and a handler raising ``Unavailable`` is answered 503 then (all counted in ``refused``); every
  503 carries ``Retry-After: 1``.
- A handler that raises (a page its encoder cannot write) fails that request alone: answered
  500, counted in ``failed``, the first one logged with its traceback.
- An accept that fails (out of descriptors) leaves the connection queued and the listener out of
  the selector for ``ACCEPT_BACKOFF`` (it stays readable: selecting on it again spun the thread
  at a whole core), counted in ``accept_failures``, the first one logged.

It serves ``handler`` (a ``BaseHTTPRequestHandler`` subclass) one request per connection.
"""

from __future__ import annotations

import io
import ipaddress
import math
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ckpt_events._logs import library_logger

if TYPE_CHECKING:
    # Only a type here: http.server (with email, http.client, socketserver, shutil) was 15 ms
    # of `configure`'s import, for the host checks the OTLP settings borrow from this module.
    from http.server import BaseHTTPRequestHandler

__all__ = ["ScrapeServer", "Unavailable", "host_problem", "listen_host"]

logger: Final = library_logger("ckpt_events.sinks.prometheus")

#: The longest request head read (as ``http.server``'s line limit): past it, 431. Never more
#: is buffered per connection.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Connections accepted per wake-up, so reading heads is not starved by a connect storm.
_ACCEPT_BATCH: Final = 16
#: Seconds the listener is left out of the selector after a failed accept.
ACCEPT_BACKOFF: Final = 0.1
#: How long a connection must have waited before a new one may displace it: a moment to read a
#: head already sent, so a burst of real scrapers gets 503s rather than each other's resets.
_DISPLACE_AFTER: Final = 0.1
#: Replies held for peers still reading them: a page each at most, shared by scrapes that
#: joined one render (32 of a 6.7 MB page, 2,000 kinds, is 214 MB at worst).
MAX_WRITING: Final = 32
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
)
_FAILED: Final = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_REQUEST: Final = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TIMED_OUT: Final = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
)


class Unavailable(Exception):
    """Raised by a handler that cannot answer before its request's deadline (``_Prefetched.deadline``):
    answered 503, counted in ``refused``, not logged (nothing failed)."""


@dataclass(eq=False)
class _Waiting:
    """A connection whose request head is not complete yet."""

    sock: socket.socket
    address: Any
    peer: str
    accepted: float
    head_deadline: float
    deadline: float
    head: bytearray = field(default_factory=bytearray)


@dataclass(eq=False)
class _Writing:
    """A reply the selector thread writes as its peer reads it, until ``deadline``."""

    sock: socket.socket
    chunks: deque[memoryview]
    deadline: float


class _Prefetched:
    """What the handler sees as its socket: the head already read, the reply kept in ``reply``."""

    def __init__(self, sock: socket.socket, head: bytes, deadline: float) -> None:
        self._sock = sock
        self._head = head
        #: When the whole request must have ended (``time.monotonic()``): a handler waiting for
        #: something waits no longer.
        self.deadline = deadline
        #: What the handler wrote, in order; sent by ``ScrapeServer._send`` once it returns.
        self.reply: deque[memoryview] = deque()

    def settimeout(self, value: float | None) -> None:
        pass  # the request's deadline rules, not a per-operation timeout

    def setsockopt(self, *args: Any) -> None:
        self._sock.setsockopt(*args)

    def makefile(self, mode: str, buffering: int = -1) -> io.BytesIO:
        assert mode == "rb", "replies are written through sendall"
        return io.BytesIO(self._head)

    def sendall(self, data: Any) -> None:
        # Held, not copied (bytes cannot change): a shared render's page is one object however
        # many replies carry it.
        self.reply.append(memoryview(data if isinstance(data, bytes) else bytes(data)))

    def fileno(self) -> int:
        return self._sock.fileno()


#: DNS's limit on a whole name (RFC 1035): past it nothing resolves, and the host is not quoted
#: whole in an error (a 100,000-character one made a 100 KB message).
MAX_HOST_CHARS: Final = 253


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be listened on as given (brackets around anything but an IPv6
    address, a ``:`` in a host that is not an IPv6 address, a space or control character, more
    than ``MAX_HOST_CHARS``), or ``None``; a name that does not resolve is left to the bind,
    which says so."""
    if len(host) > MAX_HOST_CHARS:
        return f"is longer than any host name ({MAX_HOST_CHARS} characters)"
    if not host.isprintable() or any(c.isspace() for c in host):
        # A newline split the bind's error in two; NUL made bind() raise a bare TypeError.
        return "has a space or a control character, which no host name or address has"
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else None
        if inner is None or not _is_ipv6(inner):
            return "has brackets, which go only around a whole IPv6 address ([::1])"
    elif ":" in host and not _is_ipv6(host):
        return "has a ':' but is not an IPv6 address"
    return None


def listen_host(host: str) -> str:
    """``host`` as a socket binds it: an IPv6 address without the brackets a URL puts around it
    (``[::1]`` is ``::1``). Check it with ``host_problem`` first."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _head_end(head: bytearray) -> int:
    """The index just past the head's blank line, or -1 (CRLF or bare LF lines, as http.server)."""
    ends = [i for i in (head.find(b"\n\r\n"), head.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1


def _may_be_http(head: bytearray) -> bool:
    """False once ``head`` cannot start a request: its first byte past any blank lines (which
    RFC 9112 lets a server skip) is not a letter, as a method's first is."""
    start = head.lstrip(b"\r\n")[:1]
    return not start or start.isalpha()


def _discard_unread(sock: socket.socket) -> None:
    """Read and drop what ``sock`` has received (at most 1 MiB): a close with unread bytes resets
    the connection, and the peer loses the reply sent just before."""
    for _ in range(16):
        try:
            if not sock.recv(MAX_HEAD_BYTES):
                return
        except OSError:  # BlockingIOError: nothing more has arrived
            return


def _send_some(writing: _Writing) -> bool:
    """Send what ``writing.sock`` takes now without waiting; True once the whole reply is sent."""
    chunks = writing.chunks
    while chunks:
        try:
            sent = writing.sock.send(chunks[0])
        except (BlockingIOError, InterruptedError):
            return False
        if sent < len(chunks[0]):
            chunks[0] = chunks[0][sent:]
            return False
        chunks.popleft()
    return True


def _finish(sock: socket.socket) -> None:
    """End a reply (FIN, so the peer reads it to its end) and close the connection."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)  # non-blocking, small: it fits an empty socket buffer or is dropped
    except OSError:
        pass


class ScrapeServer:
    """Serve ``handler`` on ``address`` (see the module docstring); ``serve_forever`` in a thread."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        slots: int,
        *,
        header_timeout: float,
        timeout: float,
        max_waiting: int = 256,
    ) -> None:
        self.handler = handler
        self.slots = threading.BoundedSemaphore(slots)
        # Scrapes holding a slot (see ``serving``), under ``_serving_lock``: taken on the selector
        # thread, given back on a handler's.
        self._serving = 0
        self._serving_lock = threading.Lock()
        self.header_timeout = min(header_timeout, timeout)
        self.timeout = timeout
        self.max_waiting = max_waiting
        self.max_per_peer = max(1, max_waiting // 2)
        # Answered 503 on the selector thread (see ``refused``).
        self._refused = 0
        # Answered 503 on handler threads, under ``_failed_lock``: ``Unavailable`` raised.
        self._unavailable = 0
        #: Connections closed for not completing a head within ``header_timeout``.
        self.timed_out = 0
        #: Waiting connections closed to make room for a new one.
        self.displaced = 0
        #: Requests whose handler raised (answered 500; the first one logged).
        self.failed = 0
        #: Accepts that failed (out of descriptors, say), each followed by ``ACCEPT_BACKOFF``.
        self.accept_failures = 0
        #: Replies cut off: not read to their end within ``timeout``, or the oldest of
        #: ``MAX_WRITING`` when one more came.
        self.slow_readers = 0
        #: When the listener goes back into the selector after a failed accept (0: it is in).
        self._accept_again = 0.0
        self._failed_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(128)
        except BaseException:  # a TypeError too (NUL in the host): the socket was left open
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        # Insertion-ordered: the first entry waits longest (all share one header timeout).
        self._waiting: dict[socket.socket, _Waiting] = {}
        self._waiting_of: dict[str, dict[socket.socket, None]] = {}
        # Insertion-ordered too: the first entry has written longest.
        self._writing: dict[socket.socket, _Writing] = {}
        # Replies a handler thread passed on, taken by the selector thread when woken; None
        # once it stopped taking them (a handler then closes its connection itself).
        self._handed: deque[_Writing] | None = deque()
        self._handed_lock = threading.Lock()
        # A byte on this pair (from shutdown(), or a handed reply) wakes the selector at once.
        wake = socket.socketpair()
        self._wake_r = wake[0]
        self._wake_w = wake[1]
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full pair already holds a wake-up
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._selector = selectors.DefaultSelector()

    @property
    def refused(self) -> int:
        """Answered 503: a complete head found every slot busy, a new connection found every
        waiting place taken by one too young to displace, or a handler raised ``Unavailable``."""
        return self._refused + self._unavailable

    @property
    def serving(self) -> int:
        """Scrapes holding a slot now: rendering, or sending what the socket takes of their
        reply at once. A peer sees its reply begin before its slot is given back."""
        return self._serving

    def _take_slot(self) -> bool:
        if not self.slots.acquire(blocking=False):
            return False
        with self._serving_lock:
            self._serving += 1
        return True

    def _give_slot(self) -> None:
        with self._serving_lock:
            self._serving -= 1
        self.slots.release()

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept, read heads and dispatch until ``shutdown``. With nothing due (no head or
        reply waiting, no accept backed off) the selector sleeps until a connection, a handed
        reply or ``shutdown`` wakes it, or at most ``poll_interval`` seconds if given: the
        endpoint polled 5 times a second (0.65 ms of CPU a second) on an idle server."""
        selector = self._selector
        selector.register(self.socket, selectors.EVENT_READ, None)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if self._accept_again and now >= self._accept_again:
                    self._accept_again = 0.0
                    selector.register(self.socket, selectors.EVENT_READ, None)
                first = next(iter(self._waiting.values()), None)
                wait = math.inf if poll_interval is None else poll_interval
                if first is not None:
                    wait = min(wait, first.head_deadline - now)
                if self._writing:
                    # At most MAX_WRITING: a scan, as their deadlines are not in insertion order.
                    wait = min(wait, min(w.deadline for w in self._writing.values()) - now)
                if self._accept_again:
                    wait = min(wait, self._accept_again - now)
                accept = False
                # Heads first, then new connections: a connection is read before it can be displaced.
                for key, _ in selector.select(None if wait == math.inf else max(wait, 0.0)):
                    if key.fileobj is self.socket:
                        accept = True
                    elif key.fileobj is self._wake_r:
                        self._take_handed()
                    elif isinstance(key.data, _Writing):
                        self._write(key.data)
                    elif key.data is not None:
                        self._read(key.data)
                if accept:
                    self._accept()
                self._expire(time.monotonic())
        finally:
            with self._handed_lock:
                handed = self._handed or deque()
                self._handed = None
            for writing in (*handed, *self._writing.values()):
                writing.sock.close()  # cut off: the endpoint is closing
            self._writing.clear()
            for pending in list(self._waiting.values()):
                self._drop(pending)
            selector.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it (scrapes in flight end on their own)."""
        self._stop.set()
        _send_quietly(self._wake_w, b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        """Release the port."""
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors, say: the connection stays queued and the listener readable,
                # so selecting on it at once again spun this thread at a whole core. Left out of
                # the selector for a moment; the queued connection is taken after it.
                self.accept_failures += 1
                if self.accept_failures == 1:
                    logger.warning(
                        "the scrape endpoint cannot accept a connection (%s); retrying every %.1f s "
                        "(counted in accept_failures, not logged again)",
                        exc,
                        ACCEPT_BACKOFF,
                    )
                self._selector.unregister(self.socket)
                self._accept_again = time.monotonic() + ACCEPT_BACKOFF
                return
            sock.setblocking(False)
            now = time.monotonic()
            peer = str(address[0]) if isinstance(address, tuple) else ""
            if not self._make_room(peer, now):
                self._refused += 1
                _send_quietly(sock, _BUSY)
                sock.close()
                continue
            pending = _Waiting(sock, address, peer, now, now + self.header_timeout, now + self.timeout)
            self._waiting[sock] = pending
            self._waiting_of.setdefault(peer, {})[sock] = None
            self._selector.register(sock, selectors.EVENT_READ, pending)
            self._read(pending)  # a scraper's head is usually there already

    def _make_room(self, peer: str, now: float) -> bool:
        """Under the caps, or a waiting connection displaced: True; else the new one is refused."""
        of_peer = self._waiting_of.get(peer, {})
        if len(of_peer) >= self.max_per_peer:
            victim = self._waiting[next(iter(of_peer))]
        elif len(self._waiting) >= self.max_waiting:
            victim = next(iter(self._waiting.values()))
        else:
            return True
        if now - victim.accepted < _DISPLACE_AFTER:
            return False
        self.displaced += 1
        self._drop(victim)
        return True

    def _read(self, pending: _Waiting) -> None:
        try:
            # Never past the limit: a whole recv on top of 64 KiB less a byte read up to 128 KiB,
            # and a complete 99.8 KB head was served.
            data = pending.sock.recv(MAX_HEAD_BYTES - len(pending.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(pending)
            return
        pending.head += data
        if not _may_be_http(pending.head):
            # A TLS ClientHello or binary bytes waited out header_timeout for a 408, holding a place.
            _send_quietly(pending.sock, _BAD_REQUEST)
            self._drop(pending)
            return
        if _head_end(pending.head) < 0:
            if len(pending.head) >= MAX_HEAD_BYTES:
                _send_quietly(pending.sock, _TOO_LARGE)
                _discard_unread(pending.sock)
                self._drop(pending)
            return
        self._forget(pending)
        if not self._take_slot():
            self._refused += 1
            _send_quietly(pending.sock, _BUSY)
            pending.sock.close()
            return
        try:
            threading.Thread(
                target=self._serve_one,
                args=(pending.sock, pending.address, bytes(pending.head), pending.deadline),
                name="ckpt-events-scrape",
                daemon=True,
            ).start()
        except RuntimeError:
            # No thread to be had (memory or the thread limit): busy, as with no slot. Raised
            # here, it ended serve_forever and the endpoint answered nothing from then on.
            self._give_slot()
            self._refused += 1
            _send_quietly(pending.sock, _BUSY)
            pending.sock.close()

    def _serve_one(self, sock: socket.socket, address: Any, head: bytes, deadline: float) -> None:
        prefetched = _Prefetched(sock, head, deadline)
        try:
            self.handler(prefetched, address, self)  # type: ignore[arg-type]
        except Unavailable:
            with self._failed_lock:
                self._unavailable += 1
            _send_quietly(sock, _BUSY)
            _finish(sock)
        except OSError:
            sock.close()  # the scraper went away
        except Exception:
            # The server's one boundary: a value the page's encoder could not write killed this
            # thread with a traceback on stderr and reset the connection, at every scrape.
            with self._failed_lock:
                self.failed += 1
                first = self.failed == 1
            if first:
                logger.exception(
                    "a request to %s:%d failed; answered 500, and later failures are counted "
                    "(PrometheusEndpoint.failed), not logged",
                    *self.server_address,
                )
            _send_quietly(sock, _FAILED)
            _finish(sock)
        except BaseException:
            sock.close()
            raise
        else:
            self._send(_Writing(sock, prefetched.reply, deadline))
        finally:
            self._give_slot()

    def _send(self, writing: _Writing) -> None:
        """Send what the socket takes now (all of a page that fits its buffer, usually); hand the
        rest to the selector thread, so this thread's slot is free for the next scrape."""
        try:
            if _send_some(writing):
                _finish(writing.sock)
                return
        except OSError:
            writing.sock.close()  # the scraper went away
            return
        if writing.deadline <= time.monotonic():
            # The render, not the peer, used up the request's time: closed, not a slow reader.
            writing.sock.close()
            return
        with self._handed_lock:
            if self._handed is None:
                writing.sock.close()  # the endpoint is closing
                return
            self._handed.append(writing)
        _send_quietly(self._wake_w, b"w")

    def _take_handed(self) -> None:
        """On the selector thread: drain the wake-up pair and write the replies handed over."""
        _discard_unread(self._wake_r)
        with self._handed_lock:
            assert self._handed is not None, "taken only while serving"
            handed = list(self._handed)
            self._handed.clear()
        for writing in handed:
            if len(self._writing) >= MAX_WRITING:
                self._cut_off(next(iter(self._writing.values())))
            self._writing[writing.sock] = writing
            self._selector.register(writing.sock, selectors.EVENT_WRITE, writing)

    def _write(self, writing: _Writing) -> None:
        try:
            done = _send_some(writing)
        except OSError:
            done = True  # the peer went away: nothing more to send
        if done:
            self._end_writing(writing)
            _finish(writing.sock)

    def _cut_off(self, writing: _Writing) -> None:
        self.slow_readers += 1
        self._end_writing(writing)
        writing.sock.close()

    def _end_writing(self, writing: _Writing) -> None:
        self._selector.unregister(writing.sock)
        del self._writing[writing.sock]

    def _expire(self, now: float) -> None:
        for writing in [w for w in self._writing.values() if w.deadline <= now]:
            self._cut_off(writing)
        while self._waiting:
            pending = next(iter(self._waiting.values()))
            if pending.head_deadline > now:
                return
            self.timed_out += 1
            if pending.head:
                _send_quietly(pending.sock, _TIMED_OUT)
            self._drop(pending)

    def _forget(self, pending: _Waiting) -> None:
        self._selector.unregister(pending.sock)
        del self._waiting[pending.sock]
        of_peer = self._waiting_of[pending.peer]
        del of_peer[pending.sock]
        if not of_peer:
            del self._waiting_of[pending.peer]

    def _drop(self, pending: _Waiting) -> None:
        self._forget(pending)
        pending.sock.close()
