"""Where ``ckpt-events watch`` reads from: participants' ``GET /status``, and ``EventSource``s
(followed JSON-lines logs, ``follow.LogFollower``; the demo's own bus).

``poll_all`` asks every participant at once (``MAX_POLLS`` at a time), each under its own deadline
and byte cap, so a slow, silent or hostile one costs the round about ``timeout`` and is one
``PollResult`` with an error line and its ``failure`` (``unreachable``, ``tls``, ``refused``,
``unknown``). The deadline counts only time this process's event loop could run: a loop that runs
late (a loaded machine, or ``demo --watch``'s loop busy with the very servers it polls) stretches
it, up to ``MAX_STRETCH`` times ``timeout``, rather than blaming a participant for it; a poll given
up at that bound before it had ``timeout`` of a loop that ran is ``unknown``, never 'no answer
within'. Each answer carries the participant's clock offset, NTP-style: its reply's time
(``SERVER_TIME_HEADER``, else the HTTP ``Date`` header, to the second) against the local midpoint
of the request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Final, Literal, Protocol

import anyio
import msgspec

from ckpt_events import (
    CoordinateFinished,
    CoordinateStarted,
    Event,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    Stalled,
)
from ckpt_events.participants.errors import ParticipantCallError, shown
from ckpt_events.participants.protocol import CONTROL_PREFIX, SERVER_TIME_HEADER, StatusReply
from ckpt_events.participants.replies import KEEPALIVE_SECONDS, never_connected, read_reply
from ckpt_events.vocab import NAME_RULE, Kind

__all__ = [
    "MAX_BODY",
    "MAX_POLLS",
    "MAX_STRETCH",
    "VIEW_EVENTS",
    "EventSource",
    "Failure",
    "PollResult",
    "poll_all",
    "poll_one",
    "status_client",
]

#: A status reply is a few hundred bytes (at most 100 blockers): anything past this is refused.
MAX_BODY: Final = 256 * 1024
#: The events the view folds in; an ``EventSource`` may hand on only these. The controller's
#: stages tell what its open prepare waits on (a stage open: its calls to that kind).
VIEW_EVENTS: Final = (
    OperationStarted,
    OperationFinished,
    CoordinateStarted,
    CoordinateFinished,
    StageStarted,
    StageFinished,
    Stalled,
)
#: How far the HTTP ``Date`` header may be behind the reply: it has whole seconds, and uvicorn
#: renews it once a second.
_DATE_SPAN: Final = 2.0
_DECODER: Final = msgspec.json.Decoder(StatusReply)
#: However late this process's loop runs, a poll is given up after this many ``timeout``s.
MAX_STRETCH: Final = 10
#: How often a round's watchdog measures the loop's lateness and looks at its polls' deadlines.
_TICK: Final = 0.02
#: The most polls of a round in flight at once; the others wait, off the clock, for a slot. All at
#: once, 3,000 participants refusing connections at once took this process's CPU past its polls'
#: deadlines: 1,269 of them were named 'no answer within 0.3 s' (8,855 of 10,000 within 1 s).
MAX_POLLS: Final = 256

#: Why a participant could not be read: ``unreachable`` (no connection, no answer in time, or an
#: answer that is not a participant's status), ``tls`` (it took the connection, the TLS handshake
#: failed: a certificate not trusted, an ``https://`` URL of a plain HTTP server), ``refused``
#: (401/403: the token) or ``duplicate`` (it answered as the participant another URL of the round
#: answered as) or ``unknown`` (not judged: this process could not run long enough to hear it).
Failure = Literal["unreachable", "tls", "refused", "duplicate", "unknown"]


class PollResult(msgspec.Struct, frozen=True):
    """One participant's answer (``status``), or why there is none (``error``, one line, and
    ``failure``). ``clock_offset``: its clock minus ours, in seconds, within ``clock_error``
    (``None`` when its reply carried no time)."""

    url: str
    seconds: float
    status: StatusReply | None = None
    error: str | None = None
    failure: Failure | None = None
    clock_offset: float | None = None
    clock_error: float | None = None


if TYPE_CHECKING:
    import httpx


def _status_url(url: str) -> str:
    return url.rstrip("/") + CONTROL_PREFIX + "/status"


def status_client(urls: Sequence[str], *, headers: Mapping[str, str], timeout: float) -> httpx.AsyncClient:
    """One client for polling ``urls``, with a connection pool per participant, its
    timeouts ``MAX_STRETCH`` times ``timeout`` (``poll_all`` gives up sooner).

    httpcore's pool finds a request its connection by scanning every connection it holds, at
    each request's start and end: one pool over 64 participants made a poll round quadratic
    (73% of the round's time in that scan, measured by ``ckpt_events.benchmarks.bench_watch``). A pool per
    participant (its origin and the path before ``CONTROL_PREFIX``) keeps each scan to its one
    connection, and ``pools.MemberPools`` finds it in one look-up (httpx's ``mounts`` tried each in
    turn: quadratic again).

    An idle connection is kept ``KEEPALIVE_SECONDS`` (2 s), as the controller's: at httpx's 5 s,
    the participants' own keep-alive, a poll every 5 s could go out on a connection its server
    was closing ("no whole reply: ReadError" from a healthy participant, 2 of 30 polls).

    Every pool shares one TLS context (httpx's default: the CA bundle, or ``$SSL_CERT_FILE``):
    built per transport, it cost 17 ms and 0.9 MB each, 1,000 participants 17 s and 876 MB.
    """
    import httpx

    from ckpt_events.participants.cli.watch.pools import MemberKey, MemberPools, member_of

    tls = httpx.create_ssl_context()
    per_member: dict[MemberKey, int] = {}
    for url in urls:
        member = member_of(httpx.URL(_status_url(url)))
        per_member[member] = per_member.get(member, 0) + 1
    pools = {
        member: httpx.AsyncHTTPTransport(
            verify=tls,
            limits=httpx.Limits(
                max_connections=n, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_SECONDS
            ),
        )
        for member, n in per_member.items()
    }
    # The polls' own deadlines decide (time this process could not run not counted): httpx's
    # timeouts, plain wall time, are only the outer bound.
    transport = MemberPools(pools, other=httpx.AsyncHTTPTransport(verify=tls))
    return httpx.AsyncClient(headers=dict(headers), timeout=MAX_STRETCH * timeout, transport=transport)


#: This thread's scheduler statistics (Linux): its second field is the nanoseconds it waited,
#: runnable, for a CPU.
_SCHEDSTAT: Final = "/proc/thread-self/schedstat"


def _waited_for_cpu() -> float:
    """Seconds this thread has waited, runnable, for a CPU (0.0 where the kernel does not say)."""
    try:
        with open(_SCHEDSTAT, "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _http_error() -> type[Exception]:
    # httpx is imported only when polling: the command line's parser must not load it.
    import httpx

    return httpx.HTTPError


class _Deadlines:
    """The deadlines of one round's polls, kept by a watchdog task: a poll is given up once it has
    had ``timeout`` seconds of a loop that ran, or ``MAX_STRETCH`` times that in all.

    The watchdog sleeps ``_TICK`` at a time and sums how late each sleep ends: time this process's
    loop could not run. With a plain deadline, a loop blocked for 1 s mid-poll (a process that
    got no core, or ``demo --watch``'s own loop busy serving the fleet) woke up past it and named
    every healthy participant 'no answer within 0.8 s'. The watchdog cancels, rather than the
    deadline: it runs with that lateness already measured.

    A sleep's lateness misses a loop that runs, but slowly: a process that shares its core with
    busy ones runs each loop turn in short slices, its timers a few ms late, and a refused
    connection's error waited turns past its poll's deadline (4 busy processes on its core: 108
    of 3,000 refused connections named 'no answer within 0.3 s'). Each tick counts too the time
    this thread waited for a CPU, as the kernel counts it (``_SCHEDSTAT``), whichever is more."""

    def __init__(self, timeout: float, waves: int = 1) -> None:
        self.timeout = timeout
        #: Polls run ``MAX_POLLS`` at a time: the round may last this many polls' longest stretch.
        self.waves = waves
        #: Seconds the loop ran late, summed over the round.
        self.late = 0.0
        #: ``_waited_for_cpu()`` at the last tick.
        self._waited = _waited_for_cpu()
        #: Each open poll's scope: when it started, and ``late`` then.
        self._open: dict[anyio.CancelScope, tuple[float, float]] = {}
        #: The scopes this watchdog cancelled: each had ``timeout`` of a loop that ran.
        self._given_up: set[anyio.CancelScope] = set()

    def open(self, scope: anyio.CancelScope) -> None:
        self._open[scope] = (time.perf_counter(), self.late)

    def close(self, scope: anyio.CancelScope) -> None:
        self._open.pop(scope, None)
        self._given_up.discard(scope)

    def gave_up(self, scope: anyio.CancelScope) -> bool:
        """Whether the watchdog cancelled ``scope`` (not the wall-clock bound)."""
        return scope in self._given_up

    def held_up(self, scope: anyio.CancelScope) -> tuple[float, float]:
        """(seconds the loop ran, seconds it could not) since ``scope``'s poll started, up to now."""
        started, late_then = self._open.get(scope, (time.perf_counter(), self.late))
        lost = self.late - late_then + max(0.0, _waited_for_cpu() - self._waited)
        return time.perf_counter() - started - lost, lost

    async def watch(self) -> None:
        """Until cancelled (when the round's polls have ended), bounded by their longest stretch
        in each wave."""
        for _ in range(self.waves * (int(MAX_STRETCH * self.timeout / _TICK) + 2)):
            before = time.perf_counter()
            await anyio.sleep(_TICK)
            now = time.perf_counter()
            waited = _waited_for_cpu()
            self.late += max(now - before - _TICK, waited - self._waited, 0.0)
            self._waited = waited
            for scope, (started, late_then) in list(self._open.items()):
                if now - started - (self.late - late_then) >= self.timeout:
                    self._given_up.add(scope)
                    scope.cancel()


async def poll_one(client: httpx.AsyncClient, url: str, timeout: float) -> PollResult:
    """``GET url/status`` under ``timeout`` seconds for the whole exchange (time this process's
    loop could not run not counted, and a miss polled again: see ``poll_all``), body capped at
    ``MAX_BODY``."""
    (result,) = await poll_all(client, [url], timeout)
    return result


class _Polled(msgspec.Struct, frozen=True):
    """One poll's result, and whether it ``missed``: given up after ``timeout`` of a loop that ran
    (the participant named slow, unless a poll again answers)."""

    result: PollResult
    missed: bool = False


async def _poll(client: httpx.AsyncClient, url: str, deadlines: _Deadlines) -> _Polled:
    timeout = deadlines.timeout
    started = time.perf_counter()

    def failed(error: str, failure: Failure = "unreachable", *, missed: bool = False) -> _Polled:
        seconds = time.perf_counter() - started
        return _Polled(PollResult(url=url, seconds=seconds, error=error, failure=failure), missed)

    def timed_out(said: str) -> _Polled:
        # Given up at the wall-clock bound (the scope's, httpx's) before it had ``timeout`` of a
        # loop that ran: this process was too late to hear it, the participant is not judged.
        ran, lost = deadlines.held_up(scope)
        if ran >= timeout:
            return failed(said, missed=True)
        return failed(
            f"not judged: this watch could not run for {lost:.1f} s of it (a loaded machine) and "
            f"listened {max(ran, 0.0):.2f} of {timeout:g} s: poll again, or pass a longer --timeout",
            "unknown",
        )

    # The hard bound; the watchdog gives up sooner, past ``timeout`` of a loop that ran.
    scope = anyio.CancelScope(deadline=anyio.current_time() + MAX_STRETCH * timeout)
    deadlines.open(scope)
    try:
        with scope:
            sent = time.time()
            async with client.stream("GET", _status_url(url)) as reply:
                clock = _clock(reply.headers, sent, time.time())
                # Counted as decoded: read raw, a gzipped status never decoded ("invalid status
                # reply"), and a 256 KiB gzip stood for 256 MB.
                try:
                    body = await read_reply(url, reply, MAX_BODY)
                except ParticipantCallError as exc:
                    return failed(f"{exc.detail}: not a participant status")
                if reply.status_code != 200:
                    refused = reply.status_code in (401, 403)
                    return failed(
                        f"HTTP {reply.status_code} from /status{_hint(reply.status_code)}",
                        "refused" if refused else "unreachable",
                    )
        if scope.cancelled_caught:
            said = f"no answer within {timeout:g} s"
            return failed(said, missed=True) if deadlines.gave_up(scope) else timed_out(said)
    except _http_error() as exc:
        if (tls := _tls_failure(exc)) is not None:
            return failed(tls, "tls")
        # Only a failed connection is "unreachable": a reply cut short came from a participant.
        said = "unreachable" if never_connected(exc) else "no whole reply"
        said = f"{said}: {type(exc).__name__}: {exc or 'no detail'}"
        return timed_out(said) if isinstance(exc, _timeout_error()) else failed(said)
    finally:
        deadlines.close(scope)
    try:
        status = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return failed(f"invalid status reply: {exc}")
    # Any participant kind (a user's own too, ``ckpt_events.vocab.NAME_RULE``), not the controller.
    if status.kind == Kind.CONTROLLER or NAME_RULE.fullmatch(status.kind) is None:
        return failed(f"not a checkpoint participant: kind {shown(status.kind)}")
    offset, error = clock if clock is not None else (None, None)
    seconds = time.perf_counter() - started
    return _Polled(
        PollResult(url=url, seconds=seconds, status=status, clock_offset=offset, clock_error=error)
    )


def _timeout_error() -> type[Exception]:
    import httpx

    return httpx.TimeoutException


def _clock(headers: Mapping[str, str], sent: float, received: float) -> tuple[float, float] | None:
    """(offset, error): the participant's clock minus ours at the midpoint of the request, within
    half the round trip (and the ``Date`` header's ``_DATE_SPAN`` when that is all there is)."""
    middle = (sent + received) / 2
    half = max(received - sent, 0.0) / 2
    try:
        precise = headers.get(SERVER_TIME_HEADER)
        if precise is not None:
            stamp = float(precise)
            if math.isfinite(stamp) and abs(stamp) < 1e11:  # Unix seconds, not nan, inf or ns
                return stamp - middle, half
        date = headers.get("date")
        if date is not None:
            stamp = parsedate_to_datetime(date).timestamp()
            return stamp + _DATE_SPAN / 2 - middle, half + _DATE_SPAN / 2
    except (ValueError, TypeError, OverflowError):  # a garbled time: no clock, not a failed poll
        pass
    return None


#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: trusted, another name's.
_NAME_MISMATCH: Final = frozenset((62, 64))


def _tls_failure(exc: BaseException) -> str | None:
    """The line for a failed TLS handshake, when ``exc`` came of one (httpx wraps ``ssl``'s error):
    the participant took the connection, so it is not unreachable, and the fix is not its URL."""
    import ssl

    cause: BaseException | None = exc
    for _ in range(8):  # httpx's error, httpcore's, ssl's: a short chain, bounded all the same
        if cause is None:
            return None
        if isinstance(cause, ssl.SSLCertVerificationError):
            if cause.verify_code in _NAME_MISMATCH:
                said = cause.verify_message
                return f"TLS: its certificate is not for this host ({said}): use a name it is for"
            return (
                f"TLS: its certificate is not trusted ({cause.verify_message}): "
                "set $SSL_CERT_FILE to its CA bundle"
            )
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            plain = reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST")
            return f"TLS handshake failed ({reason})" + (
                ": the URL says https://, an http:// server?" if plain else ""
            )
        cause = cause.__cause__ or cause.__context__
    return None


def _hint(code: int) -> str:
    return " (wrong token: pass --token-file or set $CKPT_EVENTS_TOKEN)" if code in (401, 403) else ""


async def poll_all(client: httpx.AsyncClient, urls: Sequence[str], timeout: float) -> list[PollResult]:
    """Every participant polled concurrently, ``MAX_POLLS`` at a time, each under ``timeout``
    seconds of this process's loop running from when its turn came (one watchdog for the round:
    see ``_Deadlines``); results in the order of ``urls``.

    A participant not heard within ``timeout`` is polled once more, with the same timeout, once
    the round's first polls have all ended (the misses ``MAX_POLLS`` at a time): only a second
    miss names it 'no answer within', and a second poll not judged either is ``unknown``. Other
    Python threads of this process holding the GIL (``demo --watch``'s exporters and servers)
    slow its loop in a way neither the loop's lateness nor the kernel's CPU wait shows: three busy
    threads, 1,000 refused URLs at 0.1 s, up to 314 named 'no answer within 0.1 s' (0 of 5,000
    polled again). A slow participant misses twice: the round then lasts about twice ``timeout``.
    A participant served in this very process shares its GIL and may miss twice all the same."""
    if not urls:
        return []
    first = await _round(client, urls, timeout)
    again = [index for index, polled in enumerate(first) if polled.missed]
    results = [polled.result for polled in first]
    if again:
        second = await _round(client, [urls[index] for index in again], timeout)
        for index, polled in zip(again, second, strict=True):
            results[index] = polled.result
    return results


async def _round(client: httpx.AsyncClient, urls: Sequence[str], timeout: float) -> list[_Polled]:
    """``urls`` polled once each, ``MAX_POLLS`` at a time, under one watchdog."""
    results: list[_Polled | None] = [None] * len(urls)
    deadlines = _Deadlines(timeout, waves=-(-len(urls) // MAX_POLLS))
    slots = anyio.CapacityLimiter(MAX_POLLS)
    pending = len(urls)

    async def one(index: int, url: str) -> None:
        nonlocal pending
        try:
            # Its deadline starts with its turn. A free slot is taken without a checkpoint, so
            # the first MAX_POLLS are out before any other task of the loop runs, as all were.
            try:
                slots.acquire_nowait()
            except anyio.WouldBlock:
                await slots.acquire()
            try:
                results[index] = await _poll(client, url, deadlines)
            finally:
                slots.release()
        finally:
            pending -= 1
            if not pending:  # the last poll has ended: so does the watchdog
                tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(deadlines.watch)
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
