"""One OTLP/HTTP sender: a kept-alive connection, gzip or deflate if asked, retries as the OTLP spec says.

``OtlpHttpSender.send(body)`` posts one export request from the caller's thread (the sink's
worker) and returns whether the collector accepted it. 429, 502, 503 and 504 are retried
with exponential backoff (doubling from ``initial_backoff``, capped at ``max_backoff``, with
jitter), waiting longer when the collector's ``Retry-After`` (seconds, at most 60) asks to; a
negative, NaN or date ``Retry-After`` is our own backoff. A refused or broken connection is
retried the same way. Any other status is final, with the collector's reason (its ``Status``
message or plain text) in ``message``; a redirect is never followed (the spans and the headers,
a bearer token among them, would go where the collector says, off this machine too) and its
``Location`` is kept for the warning. A 2xx answer whose body holds a partial success
(``partial_success``: so many spans or points rejected) is accepted with ``rejected`` and
``message`` set: the caller counts them as lost.

Each request ends within ``timeout`` however the collector answers (a watchdog, one kept thread
per sender, shuts the socket down, so a reply trickling in at one byte a second is cut off too),
and ``send`` ends by its ``deadline``. A reply body is read up to ``MAX_REPLY_BYTES`` only: a larger one costs
the kept-alive connection, never memory. ``cancel()`` ends a backoff wait and the request in
flight at once (the request is then lost), for shutdown; ``resume()`` allows sending again;
``stop()`` closes the connection and ends the watchdog's thread.
``close_by(deadline)`` (a sink's shutdown) bounds every send from then on, the one under way
included, by that deadline and ends its backoff wait at once; while closing, a collector that
does not take a connection (refused, unreachable, not connected within ``CLOSING_CONNECT_TIMEOUT``)
is not tried again: backing off for the rest of the close budget only delayed the exit (7.3 s
of a 10 s close, with nothing listening), and what was not sent is counted as dropped. A
connect already under way when the close begins gives up ``CLOSING_CONNECT_TIMEOUT`` later too.
"""

from __future__ import annotations

import errno
import gzip
import http.client
import math
import os
import random
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from ckpt_events import InvalidTypeError, InvalidValueError, __version__
from ckpt_events._errors import check_int, check_number, shown
from ckpt_events.sinks.otlp._endpoint import endpoint_problem, safe_url
from ckpt_events.sinks.otlp._headers import check_headers
from ckpt_events.sinks.otlp._partial_success import partial_success, refusal
from ckpt_events.sinks.otlp._watchdog import RequestWatchdog

__all__ = [
    "BUS_LINGER",
    "MAX_BACKOFF_S",
    "MAX_REPLY_BYTES",
    "MAX_TIMEOUT_S",
    "PROTOCOLS",
    "RETRYABLE_STATUSES",
    "OtlpHttpSender",
    "SendResult",
    "check_protocol",
    "resource_with_service_name",
    "signal_sender",
]

RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
#: Seconds the bus gathers events for an OTLP sink before a delivery (``bus.flush()`` and
#: close cut it short). Without it a busy server wakes each sink's delivery task for every
#: request (an event set and two task steps per sink); measured under load, about 10 us of
#: server CPU per request with the span and metric sinks.
BUS_LINGER: Final = 0.05
_MAX_RETRY_AFTER: Final = 60.0
#: The longest request timeout taken (one hour): a timeout of 1e11 s was accepted, then made
#: every wait on it raise ``OverflowError`` at close, leaving the export thread running.
MAX_TIMEOUT_S: Final = 3600.0
#: The longest ``initial_backoff`` taken (a minute, as ``Retry-After``).
MAX_BACKOFF_S: Final = 60.0
#: While closing, how long a connection may take to open: a collector that has not accepted
#: one by then is taken as not there (a dropped SYN would hold the close for its whole budget).
CLOSING_CONNECT_TIMEOUT: Final = 2.0
#: How often a connect under way looks whether the sender closed or was cancelled.
_CONNECT_SLICE: Final = 0.05
_CONNECTING: Final = frozenset({errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY})
#: The most of a reply body read (an OTLP answer is a few bytes; an error message fits): a
#: collector answering 200 with a 3 GB chunked body took the process from 32 to 4,645 MiB.
MAX_REPLY_BYTES: Final = 64 * 1024


class SendResult:
    """What one ``send`` came to: accepted or not, the attempts made, and the last status;
    ``rejected`` items and the collector's ``message`` when it accepted only part (its partial
    success), or the reason a refusing collector gave; ``location``, a refusing redirect's
    target (not followed); ``unreadable``, with no status, how a reply that came went wrong, as a phrase
    (``"gave a reply that is not HTTP (...)"``, ``"failed the TLS handshake (...)"``), or that a
    connection opened for the request was closed before any reply (``"took the connection and
    closed it without a reply"``); ``None``: no reply came, as when nothing listens or it timed
    out (``timed_out`` tells those two apart); ``fix``, what to change when the TLS
    failure is one of configuration (an untrusted, expired or misnamed collector certificate, a
    client certificate missing or refused), which is never retried; ``timed_out``, whether the
    last attempt's connection was taken and no reply came before its time was up, or before
    ``cancel()`` ended the wait (the collector listens and does not answer, where none listening
    refuses the connection)."""

    __slots__ = (
        "accepted",
        "attempts",
        "fix",
        "location",
        "message",
        "rejected",
        "status",
        "timed_out",
        "unreadable",
    )

    def __init__(
        self,
        accepted: bool,
        attempts: int,
        status: int | None,
        rejected: int = 0,
        message: str = "",
        *,
        unreadable: str | None = None,
        location: str | None = None,
        fix: str | None = None,
        timed_out: bool = False,
    ) -> None:
        self.accepted = accepted
        self.timed_out = timed_out
        self.fix = fix
        self.location = location
        self.attempts = attempts
        self.status = status
        self.rejected = rejected
        self.message = message
        self.unreadable = unreadable


class OtlpHttpSender:
    """Posts OTLP request bodies to ``url`` over one kept-alive HTTP(S) connection; ``tls`` is
    the client context of an ``https`` URL (``None``: the system's trust store)."""

    def __init__(
        self,
        url: str,
        *,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        compression: str = "none",
        max_retries: int = 5,
        initial_backoff: float = 1.0,
        max_backoff: float = 32.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidTypeError(f"the OTLP/HTTP endpoint must be a URL string, not {shown(url)}")
        problem = endpoint_problem(url, base=False)
        if problem is not None:
            raise InvalidValueError(f"the OTLP/HTTP endpoint {shown(safe_url(url))} {problem}")
        parts = urlsplit(url)
        if compression not in ("none", "gzip", "deflate"):
            raise InvalidValueError(f"compression is 'gzip', 'deflate' or 'none', not {shown(compression)}")
        check_number(
            timeout,
            f"timeout must be seconds in (0, {MAX_TIMEOUT_S:g}], not {shown(timeout)}",
            high=MAX_TIMEOUT_S,
            low_open=True,
        )
        check_int(max_retries, f"max_retries must be an int >= 0, not {shown(max_retries)}")
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise InvalidTypeError(f"tls must be an ssl.SSLContext or None, not {shown(tls)}")
        check_number(
            initial_backoff,
            f"initial_backoff must be seconds in (0, {MAX_BACKOFF_S:g}], not {shown(initial_backoff)}",
            high=MAX_BACKOFF_S,
            low_open=True,
        )
        self.url = url
        #: ``url`` for log lines and the watchdog thread's name, its credentials redacted.
        self.shown_url = safe_url(url)
        self._https = parts.scheme == "https"
        self._tls = tls  # None: http.client's default context (the system's trust store)
        self._host = parts.hostname or ""  # endpoint_problem refused a URL without one
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.compression = compression
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._headers = {"Content-Type": content_type, **check_headers(headers)}
        if compression != "none":
            self._headers["Content-Encoding"] = compression
        self._connection: http.client.HTTPConnection | None = None
        self._cancelled = threading.Event()
        self._closing_by: float | None = None  # close_by()'s deadline
        self._closing_since: float | None = None  # when close_by() was first called
        self._wake = threading.Event()  # ends a backoff wait: cancel() or close_by()
        self._watchdog: RequestWatchdog[http.client.HTTPConnection] = RequestWatchdog(
            _abort, f"ckpt-events-otlp-watchdog {self.shown_url}"
        )

    def send(self, body: bytes, deadline: float | None = None) -> SendResult:
        """Post ``body``, retrying retryable failures; ``accepted`` is a 2xx answer.

        ``deadline`` (a ``time.monotonic()`` value) bounds it all: no attempt or wait goes past it.
        """
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self.compression == "deflate":
            body = zlib.compress(body, 6)
        backoff = self.initial_backoff
        status: int | None = None
        unreadable: str | None = None  # how the last attempt's reply went wrong, if one came
        said = ""  # the reason the last refusal gave (a 503's "overloaded")
        timed_out = False  # the last attempt's connection taken, and no reply in time
        for attempt in range(1, self.max_retries + 2):
            retry_after: float | None = None
            partial = (0, "")
            location: str | None = None
            limit = self._limit(deadline)
            budget = self.timeout if limit is None else min(self.timeout, limit - time.monotonic())
            if budget <= 0 or self._cancelled.is_set():
                return SendResult(
                    False, attempt - 1, status, message=said, unreadable=unreadable, timed_out=timed_out
                )
            closing = self._closing_by is not None
            timed_out = False
            fresh = self._connection is None  # a kept-alive one may have been closed while idle
            connection, unreadable, fix = self._open(
                min(budget, CLOSING_CONNECT_TIMEOUT) if closing else budget
            )
            if fix is not None:  # retrying cannot change a certificate: 5 retries took 31 s
                return SendResult(False, attempt, None, unreadable=unreadable, fix=fix)
            if connection is None:
                status = None
                if closing or self._closing_by is not None:
                    # Nobody takes a connection, and we are closing (since before the connect or
                    # during it): do not wait for one.
                    return SendResult(
                        False, attempt, status, message=said, unreadable=unreadable, timed_out=timed_out
                    )
            else:
                began = time.monotonic()
                unreadable = None
                try:
                    status, retry_after, partial, location = self._post(connection, body, budget)
                except (OSError, http.client.HTTPException) as exc:
                    self.close()  # a stale kept-alive connection or a collector that went down
                    status = None
                    # Not "no answer" when one came that is not HTTP (a wrong port, a proxy's
                    # banner); a request cut off at its timeout or by cancel() had none.
                    if isinstance(exc, ssl.SSLError):
                        # The collector refused our client certificate (or asked for one) after
                        # the handshake, at the first read (TLS 1.3): "got no answer" before.
                        unreadable, fix = _tls_failure(exc)
                        if fix is not None:
                            return SendResult(False, attempt, None, unreadable=unreadable, fix=fix)
                    elif not self._cancelled.is_set() and time.monotonic() - began < budget:
                        unreadable = _unreadable(exc)
                        if unreadable is None and fresh and isinstance(exc, _CLOSED_UNANSWERED):
                            # A connection opened for this request, taken and closed unanswered
                            # (a proxy with no upstream, a server that is not HTTP): it was
                            # "refused or unreachable", when it is neither.
                            unreadable = "took the connection and closed it without a reply"
                    # Taken, and no reply within the whole budget (the socket's timeout or the
                    # watchdog's abort, whichever came first), or none before cancel() (a close's
                    # deadline) ended the wait: not a connection refused. A close of 1-5 s cut a
                    # hung collector's request so, and its warning said "refused or unreachable"
                    # (in the export process at every budget: it closes in half its own). A
                    # kept-alive connection to a collector gone since fails at once instead.
                    timed_out = self._cancelled.is_set() or time.monotonic() - began >= budget
            if status is not None and 200 <= status < 300:
                return SendResult(True, attempt, status, *partial)
            said = "" if status is None else partial[1]
            if status is not None and status not in RETRYABLE_STATUSES:
                return SendResult(False, attempt, status, message=said, location=location)
            if attempt > self.max_retries:
                break
            # Never sooner than our own backoff: a Retry-After of 0 answered at once would make
            # every batch a burst of requests (a negative one made 1,290 requests in 20 s).
            delay = backoff * random.uniform(0.8, 1.2)
            if retry_after is not None:
                delay = max(delay, retry_after)
            backoff = min(backoff * 2, self.max_backoff)
            limit = self._limit(deadline)
            if limit is not None and time.monotonic() + delay >= limit:
                return SendResult(
                    False, attempt, status, message=said, unreadable=unreadable, timed_out=timed_out
                )
            self._wake.wait(delay)
            if self._cancelled.is_set():
                return SendResult(
                    False, attempt, status, message=said, unreadable=unreadable, timed_out=timed_out
                )
            self._wake.clear()
            # Woken by close_by(): round again, now bounded by the close's deadline.
        return SendResult(
            False, self.max_retries + 1, status, message=said, unreadable=unreadable, timed_out=timed_out
        )

    def _limit(self, deadline: float | None) -> float | None:
        if self._closing_by is None:
            return deadline
        return self._closing_by if deadline is None else min(deadline, self._closing_by)

    def _open(
        self, connect_timeout: float
    ) -> tuple[http.client.HTTPConnection | None, str | None, str | None]:
        """The kept-alive connection, or a new one; ``None`` when none could be opened, with how
        its TLS handshake failed if it did (it was "got no answer": something listens there)
        and the fix when that is one of configuration (``_tls_failure``)."""
        if self._connection is not None:
            return self._connection, None, None
        connection: http.client.HTTPConnection
        if self._https:
            connection = http.client.HTTPSConnection(
                self._host, self._port, timeout=connect_timeout, context=self._tls
            )
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=connect_timeout)
        # http.client's socket factory (HTTPS wraps what it returns): ours gives up a connect
        # under way when the sender closes, which a blocking connect cannot be made to do.
        connection._create_connection = self._connect  # type: ignore[attr-defined]
        try:
            connection.connect()
        except ssl.SSLError as exc:  # an OSError: before it
            connection.close()
            return None, *_tls_failure(exc)
        except (OSError, http.client.HTTPException):
            connection.close()
            return None, None, None
        self._connection = connection
        return connection, None, None

    def _connect(self, address: tuple[str, int], timeout: float, source_address: Any = None) -> socket.socket:
        """``socket.create_connection`` in slices of ``_CONNECT_SLICE``: a connect that began
        before ``close_by`` gives up ``CLOSING_CONNECT_TIMEOUT`` after it (a black-holed
        collector held a close for the whole request timeout), and at once on ``cancel``."""
        host, port = address
        started = time.monotonic()
        error: OSError = OSError(f"cannot connect to {host}:{port}")
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                if source_address:
                    sock.bind(source_address)
                sock.setblocking(False)
                code = sock.connect_ex(sockaddr)
                while code in _CONNECTING:
                    if select.select([], [sock], [], _CONNECT_SLICE)[1]:
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        break
                    now = time.monotonic()
                    since = self._closing_since
                    if (
                        self._cancelled.is_set()
                        or now - started >= timeout
                        or (since is not None and now - max(started, since) >= CLOSING_CONNECT_TIMEOUT)
                    ):
                        raise TimeoutError(f"connect to {host}:{port} timed out")
                if code:
                    raise OSError(code, os.strerror(code))
                sock.settimeout(timeout)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error

    def _post(
        self, connection: http.client.HTTPConnection, body: bytes, budget: float
    ) -> tuple[int, float | None, tuple[int, str], str | None]:
        """The reply's status, ``Retry-After``, partial success (a 2xx: rejected, message; else
        0 and the collector's reason) and ``Location``."""
        connection.timeout = budget
        if connection.sock is not None:
            connection.sock.settimeout(budget)
        # The socket timeout bounds each read, not the reply: a collector sending a byte a
        # second never trips it. The watchdog ends the whole request at ``budget``.
        watchdog = self._watchdog
        watchdog.arm(budget, connection)
        try:
            connection.request("POST", self._path, body, self._headers)
            response = connection.getresponse()
            # Read a bounded reply; what is left of a larger one is never read (the
            # connection goes instead of being drained for the next request).
            data = response.read(MAX_REPLY_BYTES + 1)
        finally:
            watchdog.disarm()
        if response.will_close or len(data) > MAX_REPLY_BYTES or not response.isclosed():
            self.close()
        partial = (0, "")
        content_type = response.getheader("Content-Type") or self._headers["Content-Type"]
        encoding = response.getheader("Content-Encoding")
        if 200 <= response.status < 300 and len(data) <= MAX_REPLY_BYTES:
            # A 200 may still say spans were rejected: they were counted as exported before.
            partial = partial_success(data, content_type, encoding)
        elif not 200 <= response.status < 300:
            # Why it refused (a 400's "invalid span id"): the warning said only the status.
            partial = (0, refusal(data, content_type, encoding))
        location = response.getheader("Location") if 300 <= response.status < 400 else None
        return response.status, _retry_after(response.getheader("Retry-After")), partial, location

    def cancel(self) -> None:
        """End any backoff wait and the request in flight now; later sends give up at once."""
        self._cancelled.set()
        self._wake.set()
        connection = self._connection
        if connection is not None:
            _abort(connection)

    def resume(self) -> None:
        """Allow sending again after ``cancel()`` (a last export at shutdown)."""
        self._cancelled.clear()
        self._wake.clear()

    def close_by(self, deadline: float) -> None:
        """Closing: every send ends by ``deadline`` (a ``time.monotonic()`` value), the one
        under way included (its backoff wait ends now), and one that cannot connect gives up."""
        self._closing_by = deadline if self._closing_by is None else min(deadline, self._closing_by)
        if self._closing_since is None:
            self._closing_since = time.monotonic()
        self._wake.set()

    @property
    def cancelled(self) -> bool:
        """Whether sends give up at once (after ``cancel()``, until ``resume()``)."""
        return self._cancelled.is_set()

    def close(self) -> None:
        """Close the connection (the next ``send`` opens a new one)."""
        connection = self._connection
        self._connection = None
        if connection is not None:
            connection.close()

    def stop(self) -> None:
        """Close the connection and end the watchdog's thread (a sink's shutdown; a later
        ``send`` starts it again)."""
        self.close()
        self._watchdog.stop()


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    if not math.isfinite(seconds) or seconds < 0:
        return None  # "-5" or "nan": our own backoff
    return min(seconds, _MAX_RETRY_AFTER)


#: How a connection taken and closed before any reply fails the request.
_CLOSED_UNANSWERED: Final = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _unreadable(exc: BaseException) -> str | None:
    """What was wrong with a reply ``exc`` says came but was not HTTP (a bad status line, too
    many or too long header lines, a body cut short), or ``None`` when none came (a reset, a
    connection closed unanswered: ``RemoteDisconnected`` is a ``BadStatusLine`` too)."""
    if isinstance(exc, http.client.RemoteDisconnected) or not isinstance(exc, http.client.HTTPException):
        return None
    # Quoted: one line, whatever came.
    return f"gave a reply that is not HTTP ({type(exc).__name__}: {str(exc)[:160]!r})"


#: The variables that give the TLS files (a signal's own, ``OTEL_EXPORTER_OTLP_TRACES_...``, wins).
_CA_FIX: Final = (
    "give the PEM file of the CA that signed the collector's certificate in "
    "OTEL_EXPORTER_OTLP_CERTIFICATE (or the signal's own, OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE)"
)
_CLIENT_VARS: Final = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY"


def _tls_failure(exc: ssl.SSLError) -> tuple[str, str | None]:
    """How a TLS handshake failed, as a phrase, and what to change when it is a matter of
    certificates (``None``: not known to be, such as a connection cut mid-handshake, retried)."""
    said = f"failed the TLS handshake ({type(exc).__name__}: {str(exc)[:160]!r})"
    reason = str(exc.reason or "")
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = str(exc.verify_message or "")
        if "expired" in why:
            return (
                said,
                "the collector's certificate has expired (or this machine's clock is wrong): renew it",
            )
        if "mismatch" in why or "not valid for" in why:
            return said, (
                "the collector's certificate is not issued for the endpoint's host: put a host name "
                "or IP address the certificate names in the endpoint, or reissue it with that one"
            )
        return said, _CA_FIX
    if "CERTIFICATE_REQUIRED" in reason:
        return said, f"the collector asks for a client certificate (mutual TLS): set {_CLIENT_VARS}"
    if "ALERT_UNKNOWN_CA" in reason or "ALERT_BAD_CERTIFICATE" in reason or "ALERT_CERTIFICATE_" in reason:
        return said, (
            f"the collector refused the client certificate: set {_CLIENT_VARS} to a pair "
            "signed by a CA the collector trusts, and unexpired"
        )
    return said, None


def _abort(connection: http.client.HTTPConnection) -> None:
    """Make the request on ``connection`` fail now: a blocked connect, send or read returns."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


#: The OTLP/HTTP encodings our sinks write, and the content type each is posted as.
PROTOCOLS: Final = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}


def check_protocol(protocol: str) -> None:
    """``protocol`` is one of ``PROTOCOLS``, or ``InvalidValueError`` says which are."""
    if protocol not in PROTOCOLS:
        raise InvalidValueError(f"protocol is one of {sorted(PROTOCOLS)}, not {shown(protocol)}")


def signal_sender(
    endpoint: str,
    path: str,
    *,
    protocol: str,
    headers: Mapping[str, str] | None,
    timeout: float,
    compression: str,
    max_retries: int,
    initial_backoff: float,
    tls: ssl.SSLContext | None = None,
) -> OtlpHttpSender:
    """The sender of one signal: to ``endpoint`` (the collector's base URL) + ``path`` (the
    signal's, e.g. ``/v1/traces``; ``""``: the URL as is), in ``protocol``'s content type;
    ``tls`` is the client context of an ``https`` endpoint."""
    if not isinstance(endpoint, str):
        raise InvalidTypeError(f"the OTLP/HTTP endpoint must be a URL string, not {shown(endpoint)}")
    problem = endpoint_problem(endpoint, base=True) if path else None
    if problem is not None:  # the path would land in its query or fragment
        raise InvalidValueError(f"the OTLP/HTTP endpoint {shown(safe_url(endpoint))} {problem}")
    return OtlpHttpSender(
        endpoint.rstrip("/") + path if path else endpoint,
        content_type=PROTOCOLS[protocol],
        headers=headers,
        timeout=timeout,
        compression=compression,
        max_retries=max_retries,
        initial_backoff=initial_backoff,
        tls=tls,
    )


#: The semantic conventions' ``telemetry.sdk.*`` (which an SDK must put on its resource) of our
#: own encoders, which write the spans and metrics of ``OtlpSpanSink`` and ``OtlpMetricSink``: an
#: SDK not OpenTelemetry's names itself. Without them a backend read our resource as no SDK's.
_SDK_ATTRIBUTES: Final[dict[str, object]] = {
    "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "ckpt_events",
    "telemetry.sdk.version": __version__,
}


def resource_with_service_name(resource_attributes: Mapping[str, object] | None) -> dict[str, object]:
    """The resource's attributes, ``service.name`` defaulting to ``"unknown_service"`` (as the SDK)
    and ``telemetry.sdk.*`` to our encoders' (``configure()``'s resource already has the SDK's)."""
    return {"service.name": "unknown_service", **_SDK_ATTRIBUTES, **dict(resource_attributes or {})}
