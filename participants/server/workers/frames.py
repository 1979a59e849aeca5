"""The frames between a server's worker coordinator and its workers, on a local Unix socket.

A frame is a 4-byte big-endian length, then that many bytes of msgpack: a ``Message`` (its
``id``, its request and the caller's ``traceparent``) or a ``Reply`` (``reply_to``, ``ok``, the
reply's ``body`` or an ``error``). Every request is a frozen ``Request`` Struct, tagged by its
``kind`` (``WorkerRequest`` is their union, decoded with the frame by one ``Decoder``); each
declares the type of its reply (``Request[Started]``: ``reply_type``), which the requester
decodes the ``body`` as. A request of an unknown kind, or with fields that do not check,
arrives as ``Unreadable`` (answered 400 ``unknown_kind``; the channel goes on). A frame over
``max_frame`` bytes, a truncated one, or one that does not decode at all raises
``WorkerChannelError``; the channel that read it treats its peer as lost.
"""

from __future__ import annotations

import struct
import typing
from typing import Annotated, Any, ClassVar, Final, Generic, TypeVar

import anyio
import msgspec
from anyio.abc import ByteReceiveStream

from ckpt_events.participants.errors import WorkerChannelError
from ckpt_events.participants.protocol import EpisodeId, PrepareReport, RecordsPart, RetireReply
from ckpt_events.participants.server.store_read import Share
from ckpt_events.participants.server.work import EpisodeView

__all__ = [
    "DEFAULT_MAX_FRAME",
    "Advance",
    "Advanced",
    "Close",
    "Closed",
    "Discard",
    "Forget",
    "Frame",
    "FrameError",
    "Get",
    "Hello",
    "InstallStaged",
    "Mark",
    "Message",
    "Open",
    "PartShare",
    "Reply",
    "Report",
    "Request",
    "Retire",
    "Stage",
    "Staged",
    "Start",
    "Shutdown",
    "Started",
    "Stop",
    "Unreadable",
    "WorkerRequest",
    "WorkerState",
    "WritePart",
    "WrittenPart",
    "decode_frame",
    "decode_reply",
    "encode_body",
    "encode_frame",
    "read_frame",
    "reply_type",
]

#: The default bound on one frame's payload (a commit's records of one worker travel in one).
DEFAULT_MAX_FRAME: Final = 256 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")
R = TypeVar("R")
_Count = Annotated[int, msgspec.Meta(ge=0)]


# -- replies ------------------------------------------------------------------------------------


class WorkerState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The server's state, the reply to a worker's ``hello``: admission and every retired mark."""

    admission_open: bool = True
    marks: dict[str, int] = msgspec.field(default_factory=dict)


class Started(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    capture_key: str
    boundary: _Count


class Advanced(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    boundary: _Count
    done: bool


class WrittenPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A worker's records file of a commit, the capture keys it holds, and its commit extras."""

    records_file: str
    records_sha256: str
    record_count: _Count
    bytes: _Count
    keys: list[str]
    extras: dict[str, Any]


class Staged(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a worker's share of a restore holds (capture keys), and the bytes it read."""

    keys: list[str]
    bytes: _Count


# -- requests -----------------------------------------------------------------------------------


class Request(msgspec.Struct, Generic[R], frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    """A request whose reply is an ``R``. ``inline`` kinds are handled one at a time in arrival
    order (quick, and their order matters: admission and marks before a later start)."""

    inline: ClassVar[bool] = False

    @property
    def kind(self) -> str:
        return str(self.__struct_config__.tag)


class Hello(Request[WorkerState], tag="hello", frozen=True):
    """A worker joins as ``index`` with the ``secret`` of this start of it (worker -> coordinator)."""

    inline = True
    index: int
    secret: str | None = None
    pid: int | None = None
    url: str | None = None


class Start(Request[Started], tag="start", frozen=True):
    inline = True
    episode_id: EpisodeId
    steps: int


class Advance(Request[Advanced | None], tag="advance", frozen=True):
    """``None``: the worker holds no such episode."""

    episode_id: EpisodeId


class Get(Request[EpisodeView | None], tag="get", frozen=True):
    inline = True
    key: str


class Close(Request[None], tag="close_admission", frozen=True):
    inline = True


class Open(Request[None], tag="open_admission", frozen=True):
    inline = True


class Closed(Request[PrepareReport], tag="closed", frozen=True):
    """Admission closed for ``checkpoint_id``: the worker's share of prepare, its readiness."""

    checkpoint_id: str
    deadline_ts: float


class Report(Request[PrepareReport], tag="report", frozen=True):
    """The worker's readiness, after waiting up to ``wait`` seconds for a change if not ready."""

    wait: float = 0.0


class WritePart(Request[WrittenPart], tag="write_part", frozen=True):
    """Export the episodes in ``scope`` (``None``: all) and write them in ``directory``."""

    directory: list[str]
    scope: list[EpisodeId] | None
    checkpoint_id: str | None
    place_by: float | None


class Stop(Request[None], tag="stop", frozen=True):
    inline = True
    keys: list[str]


class Shutdown(Request[list[str]], tag="shutdown", frozen=True):
    """The server is stopping: the worker cuts what its own port still serves (and takes no
    more); the reply names each request cut (``"METHOD /path"``, ``""`` for one not known), for
    the server's one line."""

    inline = True


class PartShare(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One records file a worker reads at a restore, and which of its records it keeps."""

    part: RecordsPart
    share: Share


class Stage(Request[Staged], tag="stage", frozen=True):
    """Read and check this worker's ``parts`` of a checkpoint in ``directory``; install nothing."""

    directory: list[str]
    parts: list[PartShare]
    checkpoint_id: str | None


class InstallStaged(Request[list[str]], tag="install_staged", frozen=True):
    """Install what ``Stage`` read, less ``drop`` (out of the restore's scope)."""

    inline = True
    drop: list[str]
    checkpoint_id: str | None


class Discard(Request[None], tag="discard", frozen=True):
    """Drop a staged share, and what the last install put in."""

    inline = True


class Retire(Request[RetireReply], tag="retire", frozen=True):
    """Retire ``episode_ids`` here; the reply counts them and names the first 100 keys. Every
    key came back (0.7-2.6 MB a worker at 64,000 ids, ~2.5-3 ms to decode on the server's
    loop), and the server answers from the ids it sent: it never used them."""

    episode_ids: list[EpisodeId]
    checkpoint_id: str | None


class Mark(Request[None], tag="mark", frozen=True):
    inline = True
    episode_id: EpisodeId


class Forget(Request[None], tag="forget", frozen=True):
    """Clear the marks of these rollouts: a forget's chunk travels in one frame (one a
    rollout id was 64,000 frames to each worker, each with its reply, for a forget of 64,000)."""

    inline = True
    rollout_ids: list[str]


class Unreadable(Request[None], tag="unreadable", frozen=True):
    """Never sent: a request that arrived of an unknown ``kind`` or with fields that do not check
    (``why``); the handler refuses it as ``unknown_kind``."""

    inline = True
    name: str
    why: str


WorkerRequest = (
    Hello
    | Start
    | Advance
    | Get
    | Close
    | Open
    | Closed
    | Report
    | WritePart
    | Stop
    | Shutdown
    | Stage
    | InstallStaged
    | Discard
    | Retire
    | Mark
    | Forget
)


# -- envelopes ----------------------------------------------------------------------------------


class FrameError(msgspec.Struct, forbid_unknown_fields=True):
    """Why a message was refused: the HTTP ``status`` and protocol ``code`` to answer with."""

    status: int
    code: str
    detail: str


class Message(msgspec.Struct, tag="m", tag_field="t", forbid_unknown_fields=True):
    """A request: ``id`` (unique per sender and connection) and its ``body``."""

    id: int
    body: Request[Any]
    traceparent: str | None = None

    @property
    def kind(self) -> str:
        return self.body.name if isinstance(self.body, Unreadable) else self.body.kind


class _WireMessage(msgspec.Struct, tag="m", tag_field="t", forbid_unknown_fields=True):
    """A ``Message`` as decoded: its body one of the ``WorkerRequest`` kinds."""

    id: int
    body: WorkerRequest
    traceparent: str | None = None


class _LooseMessage(msgspec.Struct, tag="m", tag_field="t"):
    """A message whose body did not decode, read again for its id and kind."""

    id: int
    body: dict[str, Any]
    traceparent: str | None = None


class Reply(msgspec.Struct, tag="r", tag_field="t", forbid_unknown_fields=True):
    """The answer to message ``reply_to``: ``body`` (encoded: the request's ``reply_type``
    decodes it) when ``ok``, else ``error``."""

    reply_to: int
    ok: bool
    body: msgspec.Raw = msgspec.Raw(b"\xc0")  # nil
    error: FrameError | None = None


Frame = Message | Reply
_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(_WireMessage | Reply)
_loose: Final = msgspec.msgpack.Decoder(_LooseMessage)
_reply_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def reply_type(request: type[Request[Any]]) -> Any:
    """The type a reply to ``request`` decodes as (its ``Request[...]`` argument)."""
    for base in getattr(request, "__orig_bases__", ()):
        if typing.get_origin(base) is Request:
            return typing.get_args(base)[0]
    raise TypeError(f"{request.__name__} does not name its reply type")


def encode_body(value: Any) -> msgspec.Raw:
    """A reply's ``body``: ``value`` encoded."""
    return msgspec.Raw(_encoder.encode(value))


def decode_reply(request: type[Request[R]], body: msgspec.Raw) -> R:
    """The ``body`` of a reply to ``request``; ``msgspec.ValidationError`` if it is not one."""
    decoder = _reply_decoders.get(request)
    if decoder is None:
        decoder = _reply_decoders[request] = msgspec.msgpack.Decoder(reply_type(request))
    value: R = decoder.decode(body)
    return value


def encode_frame(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The bytes of ``frame`` on the wire; raises ``WorkerChannelError`` if it is over the bound."""
    payload = _encoder.encode(frame)
    if len(payload) > max_frame:
        raise WorkerChannelError(f"frame of {len(payload)} bytes is over the bound of {max_frame}")
    return _HEADER.pack(len(payload)) + payload


def decode_frame(payload: bytes) -> Frame:
    """One frame's payload (without its length); raises ``WorkerChannelError`` if it does not
    decode (a message whose request does not check is a ``Message`` of ``Unreadable``)."""
    try:
        frame = _decoder.decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        try:
            loose = _loose.decode(payload)
        except msgspec.DecodeError:
            raise WorkerChannelError(f"undecodable frame: {exc}") from None
        name = str(loose.body.get("kind", "?"))[:64]
        return Message(loose.id, Unreadable(name, str(exc)[:200]), loose.traceparent)
    if isinstance(frame, Reply):
        return frame
    return Message(frame.id, frame.body, frame.traceparent)


async def _read_exactly(stream: ByteReceiveStream, size: int, buffer: bytearray) -> bool:
    """Fill ``buffer`` up to ``size`` bytes; false on a clean end of stream before any byte."""
    while len(buffer) < size:
        try:
            chunk = await stream.receive(size - len(buffer))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if not buffer:
                return False
            raise WorkerChannelError(
                f"truncated frame: stream ended after {len(buffer)} of {size} bytes"
            ) from None
        buffer.extend(chunk)
    return True


async def read_frame(stream: ByteReceiveStream, max_frame: int = DEFAULT_MAX_FRAME) -> Frame | None:
    """The next frame, or None at a clean end of stream; ``WorkerChannelError`` on a bad one."""
    header = bytearray()
    if not await _read_exactly(stream, _HEADER.size, header):
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise WorkerChannelError(f"frame of {size} bytes is over the bound of {max_frame}")
    payload = bytearray()
    if size and not await _read_exactly(stream, size, payload):
        raise WorkerChannelError(f"truncated frame: stream ended after 0 of {size} bytes")
    return decode_frame(bytes(payload))
