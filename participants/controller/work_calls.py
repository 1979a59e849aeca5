"""Work calls: the HTTP clients a collection drives rollouts with, and their bounded retries.

A real fleet has transient failures: a participant's upstream (the inference worker) times
out or drops a connection under load and the participant answers 502 ``upstream_error``; a
kept-alive connection is closed by the server just as a request goes out. A failed unit of
work leaves its episode where it was (the boundary moves only when the work succeeds), so
the call is retried a bounded number of times with backoff; the last failure raises
``ParticipantCallError`` naming the participant's own error detail.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Final

import anyio
import httpx
import msgspec

from ckpt_events.participants.controller.client import WHOLE_CALL_SLACK, failed_call, read_reply
from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.errors import ParticipantCallError, ParticipantUnreachable
from ckpt_events.participants.protocol import ErrorBody

__all__ = ["WORK_CALL_TRIES", "WorkClients", "call_error"]

#: Tries per work call (the first and three retries); backoff doubles from 0.1 s, with jitter.
WORK_CALL_TRIES: Final = 4
_BACKOFF: Final = 0.1
#: Answers that say "not now" rather than "never": the gateway family.
_TRANSIENT_STATUS: Final = frozenset({502, 503, 504})
_error_decoder: Final = msgspec.json.Decoder(ErrorBody)


class WorkClients:
    """One pooled client per member for work calls (or one ``given`` client for all), with retries.

    Sharing one pool let hundreds of work calls queue ahead of a checkpoint's control calls
    (seen as a stage span far longer than the prepare inside it). One pool per member, sized
    to ``concurrency`` (a rollout has at most one call in flight on each member), never
    queues: httpcore scans every queued request against every connection on each
    assignment, which made a shared, queueing pool the demo's main CPU cost.
    """

    def __init__(self, concurrency: int, timeout: float, given: httpx.AsyncClient | None = None) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self._given = given
        self._clients: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def open(self, members: Sequence[Member]) -> AsyncIterator[None]:
        """Open a client per member (none with a ``given`` client); closed on exit."""
        if self._given is not None:
            yield
            return
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        timeout = httpx.Timeout(self.timeout, pool=self.timeout)
        async with contextlib.AsyncExitStack() as stack:
            for member in members:
                client = httpx.AsyncClient(limits=limits, timeout=timeout)
                self._clients[member.url] = await stack.enter_async_context(client)
            try:
                yield
            finally:
                self._clients.clear()

    def _client(self, member: Member) -> httpx.AsyncClient:
        return self._given if self._given is not None else self._clients[member.url]

    async def post(
        self,
        member: Member,
        url: str,
        body: dict[str, object],
        headers: Mapping[str, str] | None = None,
        *,
        tries: int | None = None,
    ) -> httpx.Response:
        """POST ``body`` to ``url`` (the member's, or one of its workers' own ports, on the
        member's pool); a transient failure is retried (``WORK_CALL_TRIES`` times in all, or
        ``tries``), the last one raises ``ParticipantCallError``.

        Any other answer (2xx, or a refusal such as 409) is returned for the caller to read.
        """
        tries = WORK_CALL_TRIES if tries is None else tries
        failure: ParticipantCallError
        for attempt in range(tries):
            if attempt:
                await anyio.sleep(_BACKOFF * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
            response: httpx.Response | None = None
            # httpx's timeout bounds each read: a reply trickled a byte a second held a work call
            # with a 3 s timeout 95 s. The whole call is bounded as a control call is.
            with anyio.move_on_after(self.timeout + WHOLE_CALL_SLACK):
                try:
                    response = await self._read(member, url, body, headers)
                except httpx.TransportError as exc:
                    failure = failed_call(url, exc, self.timeout)
                    continue
                except httpx.RequestError as exc:  # an answer that could not be read: not retried
                    raise failed_call(url, exc, self.timeout) from exc
            if response is None:
                said = f"TimeoutError: no whole answer within {self.timeout:.1f} s"
                failure = ParticipantUnreachable(url, said, reached=True)
                continue
            if response.status_code not in _TRANSIENT_STATUS:
                return response
            failure = call_error(url, response)
        raise ParticipantCallError(
            failure.url,
            f"{failure.detail} (failed {tries} times)" if tries > 1 else failure.detail,
            raw_code=failure.raw_code,
            status=failure.status,
        )

    async def _read(
        self, member: Member, url: str, body: dict[str, object], headers: Mapping[str, str] | None
    ) -> httpx.Response:
        # Streamed and bounded: read whole, a member answering a chunked 200 without end took
        # the controller's memory (2 GB in 8 s) for as long as it streamed.
        client = self._client(member)
        async with client.stream("POST", url, json=body, headers=headers, timeout=self.timeout) as streamed:
            content = await read_reply(url, streamed)
        # The body is decoded already: its content-encoding would decode it a second time.
        kept = [(k, v) for k, v in streamed.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(streamed.status_code, headers=kept, content=content, request=streamed.request)


def call_error(url: str, response: httpx.Response) -> ParticipantCallError:
    """A failed answer to a work call as a ``ParticipantCallError``: the participant's own code
    and detail from its error body, else the start of the body and the status."""
    try:
        error = _error_decoder.decode(response.content).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        snippet = response.text[:200].strip() or response.reason_phrase
        return ParticipantCallError(url, snippet, status=response.status_code)
    return ParticipantCallError(url, error.detail, raw_code=error.code, status=response.status_code)
