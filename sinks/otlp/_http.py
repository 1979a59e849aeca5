"""One OTLP/HTTP sender: a kept-alive connection, gzip or deflate if asked, retries as the OTLP spec says.

``OtlpHttpSender.send(body)`` posts one export request from the caller's thread (the sink's
worker) and returns whether the collector accepted it. 429, 502, 503 and 504 are retried
with exponential backoff (doubling from ``initial_backoff``, capped at ``max_backoff``, with
jitter), honouring a ``Retry-After`` in seconds when the collector sends one; a refused or
broken connection is retried the same way. Any other status is final. ``cancel()`` ends a
backoff wait at once (the request is then lost), for shutdown.
"""

from __future__ import annotations

import gzip
import http.client
import random
import threading
import zlib
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from ckpt_events import InvalidArgumentError

__all__ = ["BUS_LINGER", "RETRYABLE_STATUSES", "OtlpHttpSender", "SendResult"]

RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
#: Seconds the bus gathers events for an OTLP sink before a delivery (``bus.flush()`` and
#: close cut it short). Without it a busy server wakes each sink's delivery task for every
#: request (an event set and two task steps per sink); measured under load, about 10 us of
#: server CPU per request with the span and metric sinks.
BUS_LINGER: Final = 0.05
_MAX_RETRY_AFTER: Final = 60.0


class SendResult:
    """What one ``send`` came to: accepted or not, the attempts made, and the last status."""

    __slots__ = ("accepted", "attempts", "status")

    def __init__(self, accepted: bool, attempts: int, status: int | None) -> None:
        self.accepted = accepted
        self.attempts = attempts
        self.status = status


class OtlpHttpSender:
    """Posts OTLP request bodies to ``url`` over one kept-alive HTTP(S) connection."""

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
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"an OTLP/HTTP endpoint is an http(s) URL, not {url!r}")
        if compression not in ("none", "gzip", "deflate"):
            raise InvalidArgumentError(f"compression is 'gzip', 'deflate' or 'none', not {compression!r}")
        if not timeout > 0:
            raise InvalidArgumentError(f"timeout must be > 0 seconds, not {timeout!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.compression = compression
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._headers = {"Content-Type": content_type, **dict(headers or {})}
        if compression != "none":
            self._headers["Content-Encoding"] = compression
        self._connection: http.client.HTTPConnection | None = None
        self._cancelled = threading.Event()

    def send(self, body: bytes) -> SendResult:
        """Post ``body``, retrying retryable failures; ``accepted`` is a 2xx answer."""
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self.compression == "deflate":
            body = zlib.compress(body, 6)
        backoff = self.initial_backoff
        status: int | None = None
        for attempt in range(1, self.max_retries + 2):
            retry_after: float | None = None
            try:
                status, retry_after = self._post(body)
            except (OSError, http.client.HTTPException):
                self.close()  # a stale kept-alive connection or a collector that is down
                status = None
            if status is not None and 200 <= status < 300:
                return SendResult(True, attempt, status)
            if status is not None and status not in RETRYABLE_STATUSES:
                return SendResult(False, attempt, status)
            if attempt > self.max_retries:
                break
            delay = retry_after if retry_after is not None else backoff * random.uniform(0.8, 1.2)
            backoff = min(backoff * 2, self.max_backoff)
            if self._cancelled.wait(delay):
                return SendResult(False, attempt, status)
        return SendResult(False, self.max_retries + 1, status)

    def _post(self, body: bytes) -> tuple[int, float | None]:
        connection = self._connection
        if connection is None:
            factory = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = self._connection = factory(self._host, self._port, timeout=self.timeout)
        connection.request("POST", self._path, body, self._headers)
        response = connection.getresponse()
        response.read()  # drain, so the connection can carry the next request
        if response.will_close:
            self.close()
        return response.status, _retry_after(response.getheader("Retry-After"))

    def cancel(self) -> None:
        """End any backoff wait now and make later retries give up at once."""
        self._cancelled.set()

    def close(self) -> None:
        """Close the connection (the next ``send`` opens a new one)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)
