"""``MemberPools``: one httpx transport that hands each request to its participant's own pool.

httpcore's pool finds a request its connection by scanning every connection it holds, so one
pool over many participants made a poll round quadratic; httpx's ``mounts`` give each origin its
pool, but find a request's mount by matching it against every mount in turn: 500,500 matches a
round of 1,000 participants, 0.5 s of CPU a second. Here the participant is one dictionary
look-up. A participant is its origin and the path before ``CONTROL_PREFIX``, as in the
controller's client: keyed by origin alone, 256 participants behind one origin (told apart by a
path) shared one pool, and a round took 1.2 to 1.3 s of CPU (0.15 s apart).
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from ckpt_events.participants.protocol import member_path

__all__ = ["MemberKey", "MemberPools", "member_of"]

#: (scheme, host, port, path before ``CONTROL_PREFIX``): what a connection pool is for.
MemberKey = tuple[str, str, int | None, bytes]


def member_of(url: httpx.URL) -> MemberKey:
    """``url``'s participant, as ``MemberPools`` looks it up (no port: the scheme's default)."""
    return (url.scheme, url.host, url.port, member_path(url.raw_path))


class MemberPools(httpx.AsyncBaseTransport):
    """Each request goes to ``pools[member_of(request.url)]``, one for any other participant to
    ``other``. ``aclose()`` closes them all."""

    def __init__(
        self, pools: Mapping[MemberKey, httpx.AsyncBaseTransport], other: httpx.AsyncBaseTransport
    ) -> None:
        self.pools = dict(pools)
        self.other = other

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = self.pools.get(member_of(request.url), self.other)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        for pool in [*self.pools.values(), self.other]:
            await pool.aclose()
