"""``OriginPools``: one httpx transport that hands each request to its origin's own pool.

httpcore's pool finds a request its connection by scanning every connection it holds, so one
pool over many participants made a poll round quadratic; httpx's ``mounts`` give each origin its
pool, but find a request's mount by matching it against every mount in turn: 500,500 matches a
round of 1,000 participants, 0.5 s of CPU a second. Here the origin is one dictionary look-up.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

__all__ = ["Origin", "OriginPools", "origin_of"]

#: (scheme, host, port): what a connection pool is for.
Origin = tuple[str, str, int | None]


def origin_of(url: httpx.URL) -> Origin:
    """``url``'s origin, as ``OriginPools`` looks it up (no port: the scheme's default)."""
    return (url.scheme, url.host, url.port)


class OriginPools(httpx.AsyncBaseTransport):
    """Each request goes to ``pools[origin_of(request.url)]``, one for any other origin to
    ``other``. ``aclose()`` closes them all."""

    def __init__(
        self, pools: Mapping[Origin, httpx.AsyncBaseTransport], other: httpx.AsyncBaseTransport
    ) -> None:
        self.pools = dict(pools)
        self.other = other

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = self.pools.get(origin_of(request.url), self.other)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        for pool in [*self.pools.values(), self.other]:
            await pool.aclose()
