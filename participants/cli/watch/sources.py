"""Where ``ckpt-events watch`` reads from: participants' ``GET /status``, and followed JSON-lines logs.

``poll_all`` asks every participant at once, each under its own deadline and byte cap, so a
slow, silent or hostile one costs the round at most ``timeout`` and is one ``PollResult``
with an error line. ``LogFollower`` tails files (globs, directories), reading only what
was appended, and reopens a file that was rotated or truncated.
"""

from __future__ import annotations

import glob
import io
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import anyio
import msgspec

from ckpt_events import Event
from ckpt_events.participants.protocol import CONTROL_PREFIX, StatusReply
from ckpt_events.vocab import NAME_RULE, Kind

__all__ = [
    "MAX_BODY",
    "MAX_READ",
    "EventSource",
    "LogFollower",
    "PollResult",
    "poll_all",
    "poll_one",
    "status_client",
]

#: A status reply is a few hundred bytes (at most 100 blockers): anything past this is refused.
MAX_BODY: Final = 256 * 1024
#: Bytes read from one followed log per refresh, so a huge backlog cannot stall the view.
MAX_READ: Final = 8 * 1024 * 1024
_DECODER: Final = msgspec.json.Decoder(StatusReply)


class PollResult(msgspec.Struct, frozen=True):
    """One participant's answer (``status``), or why there is none (``error``, one line)."""

    url: str
    seconds: float
    status: StatusReply | None = None
    error: str | None = None


if TYPE_CHECKING:
    import httpx


def status_client(urls: Sequence[str], *, headers: Mapping[str, str], timeout: float) -> httpx.AsyncClient:
    """One client for polling ``urls``, with a connection pool per participant (origin).

    httpcore's pool finds a request its connection by scanning every connection it holds, at
    each request's start and end: one pool over 64 participants made a poll round quadratic
    (73% of the round's time in that scan, measured by ``ckpt_events.benchmarks.bench_watch``). A pool per
    origin (``mounts``) keeps each scan to that participant's one connection.
    """
    import httpx

    per_origin: dict[str, int] = {}
    for url in urls:
        parsed = httpx.URL(url)
        origin = f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"
        per_origin[origin] = per_origin.get(origin, 0) + 1
    mounts = {
        origin: httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        for origin, n in per_origin.items()
    }
    return httpx.AsyncClient(headers=dict(headers), timeout=timeout, mounts=mounts)


def _http_error() -> type[Exception]:
    # httpx is imported only when polling: the command line's parser must not load it.
    import httpx

    return httpx.HTTPError


async def poll_one(client: httpx.AsyncClient, url: str, timeout: float) -> PollResult:
    """``GET url/status`` under ``timeout`` seconds for the whole exchange, body capped at ``MAX_BODY``."""
    started = time.perf_counter()

    def failed(error: str) -> PollResult:
        return PollResult(url=url, seconds=time.perf_counter() - started, error=error)

    try:
        with anyio.fail_after(timeout):
            async with client.stream("GET", url.rstrip("/") + CONTROL_PREFIX + "/status") as reply:
                body = bytearray()
                async for chunk in reply.aiter_raw():
                    body += chunk
                    if len(body) > MAX_BODY:
                        return failed(f"reply larger than {MAX_BODY // 1024} KiB: not a participant status")
                if reply.status_code != 200:
                    return failed(f"HTTP {reply.status_code} from /status{_hint(reply.status_code)}")
    except TimeoutError:
        return failed(f"no answer within {timeout:g} s")
    except _http_error() as exc:
        return failed(f"unreachable: {type(exc).__name__}: {exc or 'no detail'}")
    try:
        status = _DECODER.decode(bytes(body))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return failed(f"invalid status reply: {exc}")
    # Any participant kind (a user's own too, ``ckpt_events.vocab.NAME_RULE``), not the controller.
    if status.kind == Kind.CONTROLLER or NAME_RULE.fullmatch(status.kind) is None:
        return failed(f"not a checkpoint participant: kind {status.kind!r}")
    return PollResult(url=url, seconds=time.perf_counter() - started, status=status)


def _hint(code: int) -> str:
    return " (wrong token: pass --token-file or set $CKPT_EVENTS_TOKEN)" if code in (401, 403) else ""


async def poll_all(client: httpx.AsyncClient, urls: Sequence[str], timeout: float) -> list[PollResult]:
    """Every participant polled concurrently; results in the order of ``urls``."""
    results: list[PollResult | None] = [None] * len(urls)

    async def one(index: int, url: str) -> None:
        results[index] = await poll_one(client, url, timeout)

    async with anyio.create_task_group() as tg:
        for index, url in enumerate(urls):
            tg.start_soon(one, index, url)
    return [r for r in results if r is not None]


class EventSource(Protocol):
    """Where the view's open work comes from: ``LogFollower``, or ``demo --watch``'s own bus."""

    @property
    def notes(self) -> Mapping[str, str]:
        """One line per source with something to say this round (shown under the view)."""
        ...

    def read(self) -> list[Event]:
        """The events gained since the last call."""
        ...


class _Tail:
    __slots__ = ("identity", "offset", "partial")

    def __init__(self, identity: tuple[int, int]) -> None:
        self.identity = identity
        self.offset = 0
        self.partial = b""


class LogFollower:
    """Tails JSON-lines logs named by files, globs or directories (their ``*.jsonl*`` files)."""

    def __init__(self, specs: Sequence[str]) -> None:
        self.specs = list(specs)
        self._tails: dict[str, _Tail] = {}
        #: One line per file with something to say this round (rotated, truncated, gone, corrupt).
        self.notes: dict[str, str] = {}

    def _paths(self) -> list[str]:
        found: list[str] = []
        for spec in self.specs:
            if os.path.isdir(spec):
                found.extend(sorted(str(p) for p in Path(spec).glob("*.jsonl*") if p.is_file()))
            elif glob.has_magic(spec):
                found.extend(sorted(glob.glob(spec)))
            else:
                found.append(spec)
        return list(dict.fromkeys(found))

    def read(self) -> list[Event]:
        """The events appended since the last call, over every followed file."""
        from ckpt_events.sinks import CorruptLine, read_events

        events: list[Event] = []
        paths = self._paths()
        for gone in set(self._tails) - set(paths):
            del self._tails[gone]
        for path in paths:
            try:
                info = os.stat(path)
            except OSError as exc:
                self._tails.pop(path, None)
                self.notes[path] = f"{path}: cannot read ({exc.strerror or exc}); waiting for it"
                continue
            identity = (info.st_dev, info.st_ino)
            tail = self._tails.get(path)
            if tail is None or tail.identity != identity:
                if tail is not None:
                    self.notes[path] = f"{path}: replaced (rotated), reading the new file"
                tail = self._tails[path] = _Tail(identity)
            elif info.st_size < tail.offset:
                self.notes[path] = f"{path}: truncated, reading again from the start"
                tail.offset = 0
                tail.partial = b""
            else:
                self.notes.pop(path, None)
            if info.st_size == tail.offset:
                continue
            try:
                with open(path, "rb") as file:
                    file.seek(tail.offset)
                    chunk = file.read(MAX_READ)
            except OSError as exc:
                self.notes[path] = f"{path}: cannot read ({exc.strerror or exc})"
                continue
            tail.offset += len(chunk)
            data = tail.partial + chunk
            cut = data.rfind(b"\n") + 1
            tail.partial = data[cut:][-MAX_READ:]
            corrupt = 0
            for _, item in read_events(io.BytesIO(data[:cut])):
                if isinstance(item, CorruptLine):
                    corrupt += 1
                else:
                    events.append(item)
            if corrupt:
                self.notes[path] = f"{path}: {corrupt} corrupt line(s) skipped"
        return events
