"""HTTP routes: the control plane and the uniform workload API, both behind the bearer token.

Errors become responses in exactly one place, ``install_error_handlers``: a ``ProtocolRefusal``
is counted as ``refused`` by its code there and nowhere else; a ``MalformedRequest`` is 422
``invalid_request``, a ``WorkError`` 502 ``upstream_error``, and an unknown route or method
404 ``not_found`` / 405 ``method_not_allowed``, all with the protocol's error body. Any other
exception of a handler is 409 ``checkpoint_error`` with its message as the detail (redacted and
cut), as a multi-worker server answers a worker's failed handler; it still reaches the server,
which logs its traceback.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, TypeVar

import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ckpt_events import Telemetry
from ckpt_events.participants.errors import (
    HTTP_STATUS,
    MalformedRequest,
    ProtocolRefusal,
    WorkError,
    failure_detail,
    shown,
)
from ckpt_events.participants.fastapi import Incoming, incoming_dependency
from ckpt_events.participants.protocol import (
    CONTROL_PREFIX,
    MAX_ATTEMPT,
    REPORT_AGE_HEADER,
    SERVER_TIME_HEADER,
    CommitRequest,
    EpisodeId,
    ForgetRequest,
    PrepareRequest,
    RenewRequest,
    RestoreRequest,
    ResumeRequest,
    RetireRequest,
    WorkAdvance,
    WorkStart,
    decode,
    encode,
    error_body,
    error_reply_body,
)
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.work import EpisodeGone, WorkService
from ckpt_events.vocab import ErrorCode

__all__ = [
    "Trace",
    "bearer_auth",
    "control_router",
    "install_error_handlers",
    "work_router",
]

T = TypeVar("T")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
#: The longest capture key: a 128-character rollout id, then ``-a`` and the last attempt.
_KEY_CHARS: Final = 128 + len(f"-a{MAX_ATTEMPT}")
#: Bodies longer than this are decoded in a worker thread, the loop free meanwhile (a 64,000-id
#: retire, ~1.7 MB, held it ~30 ms). Decoding costs 15-50 ns a byte (each id's pattern and
#: ``-a<N>`` check), so a body at the bound (~3,000 ids) holds the loop 0.5-1.5 ms; the thread hop
#: costs ~50-130 us, 10 % of that, but as much as a whole small call (a few hundred bytes, a few
#: microseconds to decode): a lower bound would make every prepare, renew and work call pay it.
_DECODE_IN_THREAD_BYTES: Final = 32 * 1024


def _json(value: Any, status: int = 200) -> Response:
    return Response(content=encode(value), status_code=status, media_type="application/json")


def bearer_auth(token: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses a missing or wrong ``Authorization: Bearer`` (constant time).

    It runs before the body is read, and an unauthenticated body's claims are not trusted: its
    ``refused`` names no checkpoint. The controller's span records the checkpoint it was for
    (``controller.types.FAILURES_ATTRIBUTE``), which the report names as the cause."""
    expected = token.encode()

    async def check(request: Request) -> None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected):
            raise ProtocolRefusal(ErrorCode.UNAUTHORIZED, "missing or wrong bearer token")

    return check


#: A control route's ``Incoming``: the caller's W3C trace context and the request's arrival,
#: read as any instrumented app reads them (``ckpt_events.participants.fastapi.incoming``), on
#: the event loop: ``Depends(incoming)``, a plain ``def``, cost each control call a thread hop.
Trace = Annotated[Incoming, Depends(incoming_dependency)]


async def _body(request: Request, type: type[T]) -> T:
    raw = await request.body()
    if len(raw) > _DECODE_IN_THREAD_BYTES:
        # The same ``decode`` and so the same ``MalformedRequest`` (422 naming the field) as on
        # the loop; msgspec's own checks hold the GIL, but each id's ``__post_init__`` lets the
        # loop in between (a switch interval, 5 ms), so /status and work calls still answer.
        value = await anyio.to_thread.run_sync(decode, raw, type)
    else:
        value = decode(raw, type)
    # Lets the one refusal handler attribute the refusal to its checkpoint.
    request.state.checkpoint_id = getattr(value, "checkpoint_id", None)
    return value


def control_router(plane: ControlPlane[Any], token: str) -> APIRouter:
    """``/ng-control/v1/checkpoint/*`` for ``plane``."""
    router = APIRouter(prefix=CONTROL_PREFIX, dependencies=[Depends(bearer_auth(token))])

    @router.get("/status")
    async def status() -> Response:
        status, report_age = await plane.status()
        reply = _json(status)
        reply.headers[SERVER_TIME_HEADER] = f"{time.time():.6f}"  # watch's clock offset
        if report_age is not None:
            reply.headers[REPORT_AGE_HEADER] = f"{report_age:.6f}"
        return reply

    @router.post("/prepare")
    async def prepare(request: Request, trace: Trace) -> Response:
        req = await _body(request, PrepareRequest)
        return _json(await plane.prepare(req, trace))

    @router.post("/renew")
    async def renew(request: Request, trace: Trace) -> Response:
        req = await _body(request, RenewRequest)
        return _json(await plane.renew(req, trace))

    @router.post("/commit")
    async def commit(request: Request, trace: Trace) -> Response:
        req = await _body(request, CommitRequest)
        return _json(await plane.commit(req, trace))

    @router.post("/restore")
    async def restore(request: Request, trace: Trace) -> Response:
        req = await _body(request, RestoreRequest)
        return _json(await plane.restore(req, trace))

    @router.post("/resume")
    async def resume(request: Request, trace: Trace) -> Response:
        req = await _body(request, ResumeRequest)
        return _json(await plane.resume(req, trace))

    @router.post("/retire")
    async def retire(request: Request, trace: Trace) -> Response:
        req = await _body(request, RetireRequest)
        return _json(await plane.retire(req, trace))

    @router.post("/forget")
    async def forget(request: Request, trace: Trace) -> Response:
        req = await _body(request, ForgetRequest)
        return _json(await plane.forget(req, trace))

    return router


def _not_found(key: str, gone: LookupError | None = None) -> Response:
    # A key from the URL may be anything (60 KB, control characters): one no capture key can
    # be is quoted bounded, as every caller's value in an error.
    said = key if len(key) <= _KEY_CHARS and key.isascii() and key.isprintable() else shown(key)
    detail = gone.detail if isinstance(gone, EpisodeGone) else f"no episode {said}"
    return _json(error_reply_body("not_found", detail), 404)


def _episode_id(req: WorkStart | WorkAdvance) -> EpisodeId:
    if req.rollout_id is None:
        raise ProtocolRefusal(ErrorCode.ROLLOUT_ID_REQUIRED, "work needs a rollout_id")
    return EpisodeId(req.rollout_id, req.attempt)


def work_router(work: WorkService, token: str, *, start: bool = True) -> APIRouter:
    """``/work/start``, ``/work/advance`` and ``GET /work/{capture_key}`` on ``work``, with ``token``:
    the one router of a single-process server, a multi-worker server's main port
    (``PooledWork``) and a worker's own port.

    A worker's own port serves the last two only (``start=False``): sessions are placed by the
    main process's ``/work/start``, which checks the fence and admission of the whole server,
    and then served by their worker.
    """
    router = APIRouter(prefix="/work", dependencies=[Depends(bearer_auth(token))])

    if start:

        @router.post("/start")
        async def start_work(request: Request) -> Response:
            req = await _body(request, WorkStart)
            return _json(await work.start(_episode_id(req), req.steps))

    @router.post("/advance")
    async def advance(request: Request) -> Response:
        req = await _body(request, WorkAdvance)
        try:
            reply = await work.advance(_episode_id(req))
        except LookupError as exc:
            return _not_found(str(exc.args[0]), exc)
        return _json(reply)

    @router.get("/{capture_key}")
    async def get(capture_key: str) -> Response:
        try:
            view = await work.view(capture_key)
        except EpisodeGone as exc:
            return _not_found(capture_key, exc)
        return _not_found(capture_key) if view is None else _json(view)

    return router


def install_error_handlers(app: FastAPI, tel: Telemetry | None) -> None:
    """Turn ``ProtocolRefusal`` (counted as ``refused`` on ``tel``), ``MalformedRequest``,
    ``WorkError`` and any other exception (409 ``checkpoint_error``) into error bodies."""

    async def on_control_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProtocolRefusal)
        if tel is not None:
            tel.refused(exc.code, checkpoint_id=getattr(request.state, "checkpoint_id", None))
        return _json(error_body(exc), exc.status)

    async def on_request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MalformedRequest)
        return _json(error_body(exc), exc.status)

    async def on_work_error(request: Request, exc: Exception) -> Response:
        return _json(error_reply_body("upstream_error", str(exc)), 502)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        reply = _json(error_reply_body(code, str(exc.detail)), exc.status_code)
        reply.headers.update(headers or {})
        return reply

    async def on_unexpected_error(request: Request, exc: Exception) -> Response:
        # Starlette's plain-text 500 was no protocol reply; a multi-worker server answered the
        # same failure in a worker 409 checkpoint_error. Not counted as refused: nothing refused
        # the call, and its operation already recorded the error (outcome error, its type).
        # Starlette re-raises it after this reply, so the server still logs its traceback.
        code = ErrorCode.CHECKPOINT_ERROR
        return _json(error_reply_body(code.value, failure_detail(exc)), HTTP_STATUS[code])

    app.add_exception_handler(ProtocolRefusal, on_control_error)
    app.add_exception_handler(WorkError, on_work_error)
    app.add_exception_handler(MalformedRequest, on_request_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected_error)
