"""Reading a reply from a peer within a bound: the controller's calls to members, ``watch``'s
polls and the model participant's calls to its inference worker.

The bound counts the body as decoded. A ``gzip`` or ``deflate`` reply (httpx asks for both) is
inflated here, ``_INFLATE_STEP`` at a time, not by httpx, which inflates each read whole before
anyone looks at its size; any other content-encoding is refused by name.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from ckpt_events.participants.errors import ParticipantCallError, shown

if TYPE_CHECKING:
    import httpx

__all__ = ["KEEPALIVE_SECONDS", "MAX_REPLY_BYTES", "never_connected", "read_reply"]

#: The most of a reply a control call reads: 4x a participant's own bound on a request body
#: (``DEFAULT_MAX_BODY_BYTES``, 8 MiB); a commit's reply for 16,000 episodes is about 1 MB.
#: Unbounded, a member answering 200 MB took 494 MB of the controller's memory, and one
#: streaming without end 2 GB in 8 s, until the call's deadline.
MAX_REPLY_BYTES: Final = 32 * 1024 * 1024
#: How long a client of ours (the controller's calls, ``watch``'s polls) keeps an idle
#: connection to a participant: well under the servers' own 5 s (``server_limits``' keep-alive
#: and ``ConnectionLimits.header_timeout``). At httpx's 5 s a request could go out on a
#: connection the server was closing: a ``ReadError``, "no whole reply" from a healthy member
#: (the controller: 128 of 256 once every idle connection was kept; ``watch`` polling one
#: participant every 4.985 to 5.0 s: 2 of 30 polls).
KEEPALIVE_SECONDS: Final = 2.0
#: The most a reply's content-encoding is inflated by in one step: a gzip of zeros inflates
#: about 1,000 times, so one 64 KiB read grew to 64 MB before the bound was looked at.
_INFLATE_STEP: Final = 64 * 1024
#: A reply is read into pieces of about this size, joined once at its end: one bytearray grown
#: by ``+=`` held up to an eighth more than it was given (36 MiB for a reply stopped at the
#: 32 MiB bound, and a whole reply was copied once more to be bytes); a list of the reads
#: themselves would hold an object per read, however small.
_GATHERED: Final = 256 * 1024


class _Inflate:
    """One content-encoding (``gzip`` or ``deflate``) undone a bounded step at a time."""

    def __init__(self, coding: str) -> None:
        self._deflate = coding == "deflate"
        # gzip's header, or deflate's zlib wrapper (RFC 9110); a bare deflate stream is tried next.
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if coding == "gzip" else zlib.MAX_WBITS)
        self._started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` inflates to, at most ``_INFLATE_STEP`` bytes a piece (zlib's
        ``max_length``: the rest waits in ``unconsumed_tail`` until the caller asks on)."""
        while True:
            try:
                out = self._zlib.decompress(data, _INFLATE_STEP)
            except zlib.error:
                if not self._deflate or self._started:
                    raise
                # Some servers send deflate without its zlib wrapper (httpx reads both).
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                self._started = True
                continue
            self._started = True
            data = self._zlib.unconsumed_tail
            if not out:
                return
            yield out


#: The content-encodings a reply may come in: the ones httpx asks for (``gzip, deflate``).
_CODINGS: Final = ("gzip", "deflate")


def _decoded(codings: list[_Inflate], chunk: bytes) -> Iterator[bytes]:
    """``chunk`` through every coding, the last one applied undone first, piece by piece."""
    if not codings:
        yield chunk
        return
    for piece in codings[-1].pieces(chunk):
        yield from _decoded(codings[:-1], piece)


def _codings(url: str, response: httpx.Response) -> list[_Inflate]:
    named = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
    named = [c for c in named if c and c != "identity"]
    unknown = [c for c in named if c not in _CODINGS]
    if unknown:
        coding = shown(unknown[0][:40])
        said = f"unreadable reply: content-encoding {coding}, not one this client reads (gzip, deflate)"
        raise ParticipantCallError(url, said, status=response.status_code)
    return [_Inflate(c) for c in named]


async def read_reply(url: str, response: httpx.Response, limit: int = MAX_REPLY_BYTES) -> bytes:
    """The body of ``response`` (streamed from ``url``; its content-encoding undone), or a
    ``ParticipantCallError`` (its status kept) once it would pass ``limit`` bytes: refused on its
    ``content-length`` unread, or after reading just past ``limit``, bytes as decoded. The bound
    of every call to a member, and of ``watch``'s polls.

    The encoding is undone here, ``_INFLATE_STEP`` at a time, not by httpx: httpx inflates a whole
    read at once, so a 1 MB gzip of zeros took 164 MB past a 32 MiB bound, and a 3.5 KB reply
    gzipped twice (``content-encoding: gzip, gzip``) 2 GB, until a ``MemoryError``."""
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        said = f"a reply of {int(declared):,} bytes (its content-length), over the {limit:,}-byte bound"
        raise ParticipantCallError(url, said, status=response.status_code)
    codings = _codings(url, response)
    parts: list[bytes] = []
    gathered = bytearray()
    size = 0
    async for chunk in response.aiter_raw():
        try:
            for piece in _decoded(codings, chunk):
                gathered += piece
                size += len(piece)
                if size > limit:
                    said = f"a reply past the {limit:,}-byte bound (stopped reading at {size:,} bytes)"
                    raise ParticipantCallError(url, said, status=response.status_code)
                if len(gathered) >= _GATHERED:
                    parts.append(bytes(gathered))
                    gathered = bytearray()
        except zlib.error as exc:
            # Said as httpx's own ``DecodingError`` was (``failed_call``): no status.
            said = f"unreadable reply: DecodingError: its content-encoding does not decode ({exc})"
            raise ParticipantCallError(url, said) from exc
    parts.append(bytes(gathered))
    return b"".join(parts)


def never_connected(exc: BaseException) -> bool:
    """Whether httpx's ``exc`` came before a connection was made (refused, no route, the pool or
    the connect timed out, a scheme it cannot speak): the peer was not reached. Anything later (a
    read timeout, a reply cut short) came after the peer took the connection: reached, and no
    whole reply. One rule for the controller's calls, ``watch``'s polls and the model's worker."""
    import httpx  # loaded already by whoever has an httpx error to ask about

    return isinstance(
        exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol
    )
