"""The controller's client against members that answer in hostile or broken ways (raw sockets on
127.0.0.1, each answering one connection in a thread): a reply with no end, a reply announced
too long, a redirect elsewhere, a reset mid-reply. Each call ends at once, bounded in memory, with
a line that says what the member sent."""

from __future__ import annotations

import contextlib
import gzip
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from ckpt_events import InvalidValueError
from ckpt_events.participants.controller.client import MAX_REPLY_BYTES, ControlClient
from ckpt_events.participants.controller.fan_out import described
from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.controller.work_calls import WorkClients
from ckpt_events.participants.errors import ParticipantCallError, ParticipantUnreachable

TOKEN = "hostile-test-token"
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
Answer = Callable[[socket.socket, bytes], None]


@contextlib.asynccontextmanager
async def member(answer: Answer, connections: int = 1) -> AsyncIterator[str]:
    """The URL of a peer that reads each request and hands the connection and what it read to
    ``answer``, for ``connections`` connections (or 10 s)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)  # bounded: a test that never connects does not hang its thread

        def serve() -> None:
            for _ in range(connections):
                with contextlib.suppress(OSError):
                    conn, _ = listener.accept()
                    with conn:
                        conn.settimeout(10)
                        answer(conn, conn.recv(65536))

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, serve)
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def endless(conn: socket.socket, _: bytes) -> None:
    """A chunked 200 that never ends (10 s at most)."""
    conn.sendall(_HEAD + b"transfer-encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
    until = time.monotonic() + 10
    while time.monotonic() < until:
        conn.sendall(chunk)


async def test_a_reply_without_end_is_cut_at_the_bound() -> None:
    """A member streaming a chunked 200 without end: the call read until its deadline (2 GB of
    the controller's memory in 8 s). It fails just past ``MAX_REPLY_BYTES``, naming the bound."""
    async with member(endless) as url, ControlClient(TOKEN) as client:
        started = time.monotonic()
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=30)
        took = time.monotonic() - started
    assert took < 5, f"read for {took:.1f} s"
    assert not isinstance(info.value, ParticipantUnreachable) and info.value.status == 200
    assert info.value.detail.startswith(
        f"a reply past the {MAX_REPLY_BYTES:,}-byte bound (stopped reading at "
    )
    assert described(info.value).startswith("answered HTTP 200: a reply past the 33,554,432-byte bound")


async def test_a_reply_announced_over_the_bound_is_not_read() -> None:
    """A member announcing a 200 MB reply fails the call on its head, before any of it is read
    (it took 494 MB and the whole transfer); a smaller ``max_reply_bytes`` is the bound then."""

    def announce(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b"content-length: 209715200\r\n\r\n")
        time.sleep(1)  # and sends nothing: the client must not wait for it

    def small(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b"content-length: 2000\r\n\r\n" + b" " * 2000)

    async with member(announce) as url, ControlClient(TOKEN) as client:
        started = time.monotonic()
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=30)
        assert time.monotonic() - started < 0.9
    assert (
        info.value.detail
        == "a reply of 209,715,200 bytes (its content-length), over the 33,554,432-byte bound"
    )
    async with member(small) as url, ControlClient(TOKEN, max_reply_bytes=1000) as client:
        with pytest.raises(ParticipantCallError, match="a reply of 2,000 bytes .* over the 1,000-byte bound"):
            await client.status(url, timeout=5)
    with pytest.raises(InvalidValueError, match="max_reply_bytes must be a positive int, not 0"):
        ControlClient(TOKEN, max_reply_bytes=0)


async def test_a_redirect_elsewhere_is_not_followed_and_is_named() -> None:
    """A member answering 307 to another origin: the call is not followed there (the token would
    go with it), and the failure names where it pointed (it said only "Temporary Redirect")."""
    went: list[bytes] = []

    def elsewhere(conn: socket.socket, request: bytes) -> None:
        went.append(request)

    async with member(elsewhere) as other:

        def redirect(conn: socket.socket, _: bytes) -> None:
            target = f"{other}/ng-control/v1/checkpoint/status".encode()
            conn.sendall(
                b"HTTP/1.1 307 Temporary Redirect\r\nlocation: " + target + b"\r\ncontent-length: 0\r\n\r\n"
            )

        async with member(redirect) as url, ControlClient(TOKEN) as client:
            with pytest.raises(ParticipantCallError) as info:
                await client.status(url, timeout=5)
        with socket.create_connection(("127.0.0.1", int(other.rsplit(":", 1)[1]))):
            pass  # ends the other member's wait, sending nothing
    assert went == [b""]  # only that connection: the client's call never went there
    assert info.value.status == 307 and info.value.detail == (
        f"a redirect to '{other}/ng-control/v1/checkpoint/status', not followed"
        " (a control call goes only to its member's URL)"
    )


async def test_a_reset_mid_reply_says_so() -> None:
    """A member that resets the connection after part of its reply: httpx's ``ReadError`` says
    nothing, and the line read "ReadError: " alone."""

    def reset(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b'content-length: 1000\r\n\r\n{"kind": "res')
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async with member(reset) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantUnreachable) as info:
            await client.status(url, timeout=5)
    assert info.value.reached
    assert info.value.detail == "ReadError: the connection was reset or closed before the whole reply"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            b'{"kind": "agent", "instance": "a0", "phase": "idle", "lease_expires_at": NaN}',
            "JSON is malformed: invalid character (byte 73); "
            'near it: \'", "phase": "idle", "lease_expires_at": NaN}\'',
        ),
        (b"[1, 2, 3]", "Expected `object`, got `array`"),
        (b'{"kind": 5, "instance": "a0", "phase": "idle"}', "Expected `str`, got `int` - at `$.kind`"),
    ],
    ids=["nan", "list", "wrong-type"],
)
async def test_json_of_the_wrong_shape_says_what_and_where(body: bytes, said: str) -> None:
    """A 200 whose JSON body is not the reply: the line names what is wrong and where; a body
    that is not JSON at all (``NaN``) shows the text around the byte (it said only "byte 73")."""

    def answer(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body)

    async with member(answer) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=5)
    assert info.value.status == 200 and info.value.detail == f"unexpected reply: {said}"


async def test_a_work_call_reply_is_bounded_and_still_decoded() -> None:
    """A work call answered with a chunked 200 without end fails at the bound, not retried (it
    was read whole, 2 GB in 8 s); a gzip-encoded reply still comes back decoded."""
    packed = gzip.compress(b'{"boundary": 3}')

    def zipped(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed) + packed)

    work = WorkClients(concurrency=1, timeout=30)
    async with member(endless) as url:
        agent = Member("agent-0", "agent", "agent-0", url)
        async with work.open([agent]):
            started = time.monotonic()
            with pytest.raises(ParticipantCallError) as info:
                await work.post(agent, url + "/work/start", {"rollout_id": "r1"})
            took = time.monotonic() - started
    assert took < 5, f"read for {took:.1f} s"
    assert info.value.detail.startswith(f"a reply past the {MAX_REPLY_BYTES:,}-byte bound")
    async with member(zipped) as url:
        agent = Member("agent-0", "agent", "agent-0", url)
        async with work.open([agent]):
            response = await work.post(agent, url + "/work/start", {"rollout_id": "r1"})
    assert (response.status_code, response.json()) == (200, {"boundary": 3})


async def test_a_trickled_work_call_reply_ends_at_the_calls_timeout() -> None:
    """A member answering a work call's head at once, then a byte every 0.1 s: httpx bounds
    each read, so a work call with a 3 s timeout waited 95 s for such a reply. The whole call
    ends at its timeout, said as no whole answer."""

    def trickle(conn: socket.socket, _: bytes) -> None:
        conn.sendall(_HEAD + b"content-length: 200\r\n\r\n")
        for _ in range(100):  # 10 s at most
            conn.sendall(b" ")
            time.sleep(0.1)

    work = WorkClients(concurrency=1, timeout=0.5)
    async with member(trickle) as url:
        agent = Member("agent-0", "agent", "agent-0", url)
        async with work.open([agent]):
            started = time.monotonic()
            with pytest.raises(ParticipantCallError) as info:
                await work.post(agent, url + "/work/start", {"rollout_id": "r1"}, tries=1)
            took = time.monotonic() - started
    # It ends at 0.75 s (the timeout and the whole call's slack): 3 s holds on a host 3x slower
    # and is still 7 s short of the 10 s trickle the per-read bound waited out.
    assert took < 3.0, f"waited {took:.1f} s for a 0.5 s timeout"
    assert info.value.detail == "TimeoutError: no whole answer within 0.5 s"


def _zeros_gzipped(megabytes: int, times: int = 1) -> bytes:
    """``megabytes`` MiB of zeros, gzipped ``times`` over (a gzip of zeros is ~1,000 times smaller)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    body = b"".join(packer.compress(bytes(1 << 20)) for _ in range(megabytes)) + packer.flush()
    for _ in range(times - 1):
        body = gzip.compress(body, 9)
    return body


@pytest.mark.parametrize(("coding", "times"), [("gzip", 1), ("gzip, gzip", 2)], ids=["gzip", "twice"])
async def test_a_compressed_reply_is_bounded_as_it_is_inflated(coding: str, times: int) -> None:
    """A gzip bomb (64 MiB of zeros in ~64 KB, or gzipped twice in 3.5 KB): httpx inflated each
    read whole before the bound was looked at, so 1 MB on the wire took 164 MB past a 32 MiB bound,
    and a twice-gzipped 3.5 KB reply 2 GB. It is inflated a 64 KiB step at a time and stops there."""
    packed = _zeros_gzipped(64, times)

    def bomb(conn: socket.socket, _: bytes) -> None:
        head = b"content-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (coding.encode(), len(packed))
        conn.sendall(_HEAD + head + packed)

    limit = 1 << 20
    tracemalloc.start()
    try:
        async with member(bomb) as url, ControlClient(TOKEN, max_reply_bytes=limit) as client:
            with pytest.raises(ParticipantCallError) as info:
                await client.status(url, timeout=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stopped = int(info.value.detail.rsplit(" at ", 1)[1].split()[0].replace(",", ""))
    assert info.value.status == 200 and limit < stopped <= limit + 64 * 1024, info.value.detail
    print(f"MEM bomb{times} peak={peak}")
    assert peak < 8 << 20, f"{peak:,} bytes at the peak"


async def test_a_reply_past_the_bound_holds_the_bound_and_little_more() -> None:
    """A plain reply to its close, 40 MiB, stopped at the 32 MiB bound: the read holds what it
    read and under 1 MiB more. It grew one bytearray, which held up to an eighth more than was
    read (peak 36.5 MiB, 4.5 past the bound); now 32.5 MiB. The reply is built before the trace
    starts and sent as it is, so only the client's memory is traced; a first call before it
    imports what the call needs."""
    head = _HEAD + b"connection: close\r\n\r\n"
    body = bytes(40 << 20)

    def flood(conn: socket.socket, _: bytes) -> None:
        conn.sendall(head)
        with contextlib.suppress(OSError):  # the client stops reading at its bound
            conn.sendall(body)

    async with member(flood, connections=2) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantCallError):  # once before the trace: every module imported
            await client.status(url, timeout=10)
        tracemalloc.start()
        try:
            with pytest.raises(ParticipantCallError) as info:
                await client.status(url, timeout=10)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert info.value.detail.startswith(f"a reply past the {MAX_REPLY_BYTES:,}-byte bound"), info.value.detail
    print(f"peak {peak / 2**20:.2f} MiB, {(peak - MAX_REPLY_BYTES) / 2**20:.2f} MiB past the bound")
    assert peak - MAX_REPLY_BYTES < 1 << 20, f"{peak:,} bytes at the peak"


def _bare_deflate(body: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # no zlib wrapper, as some servers send
    return packer.compress(body) + packer.flush()


@pytest.mark.parametrize(
    ("coding", "pack"),
    [
        ("gzip", gzip.compress),
        ("gzip, gzip", lambda body: gzip.compress(gzip.compress(body))),
        ("deflate", zlib.compress),
        ("deflate", _bare_deflate),
        ("identity", lambda body: body),
    ],
    ids=["gzip", "twice", "deflate", "raw-deflate", "identity"],
)
async def test_a_compressed_reply_still_decodes(coding: str, pack: Callable[[bytes], bytes]) -> None:
    """Every encoding httpx asks for (gzip, deflate with or without its zlib wrapper, stacked)
    still comes back as the reply."""
    packed = pack(b'{"kind": "agent", "instance": "a0", "phase": "idle"}')

    def answer(conn: socket.socket, _: bytes) -> None:
        head = b"content-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (coding.encode(), len(packed))
        conn.sendall(_HEAD + head + packed)

    async with member(answer) as url, ControlClient(TOKEN) as client:
        status = await client.status(url, timeout=5)
    assert (status.kind, status.instance) == ("agent", "a0")


@pytest.mark.parametrize(
    ("coding", "body", "said"),
    [
        (
            "br",
            b"\x0b\x02\x80{}\x03",
            "unreadable reply: content-encoding 'br', not one this client reads (gzip, deflate)",
        ),
        ("gzip", b"not gzip", "unreadable reply: DecodingError: its content-encoding does not decode ("),
    ],
    ids=["unknown", "broken"],
)
async def test_an_encoding_not_read_is_said_never_misread(coding: str, body: bytes, said: str) -> None:
    """A reply in an encoding this client cannot undo (brotli) is named, not read as JSON ("JSON
    is malformed"); a broken gzip is an unreadable reply."""

    def answer(conn: socket.socket, _: bytes) -> None:
        head = b"content-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (coding.encode(), len(body))
        conn.sendall(_HEAD + head + body)

    async with member(answer) as url, ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantCallError) as info:
            await client.status(url, timeout=5)
    assert not isinstance(info.value, ParticipantUnreachable)
    assert info.value.detail.startswith(said)
