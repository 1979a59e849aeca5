"""The wire format of the checkpoint control plane and of the uniform workload API.

Every body is a msgspec Struct. Requests reject unknown fields; replies ignore them, so a
controller reads a newer participant's replies (docs/http-api.md, "Mixed versions"). Server
and client decode with
``decode(body, Type)``: a body that does not match raises ``MalformedRequest`` (HTTP 422, code
``invalid_request``, the message names the field, e.g. ``... - at `$.checkpoint_id```).
``invalid_request`` is not a protocol refusal (it is not in ``ErrorCode`` and is not counted
as ``refused``); every protocol refusal is a ``ProtocolRefusal`` carrying an ``ErrorCode``.
Both reply with the same body, ``ErrorBody`` = ``{"error": {"code", "detail"}}``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Final, TypeVar

import msgspec

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import MalformedRequest, ProtocolRefusal, fitted_detail, shown
from ckpt_events.vocab import Phase

__all__ = [
    "CONTROL_PREFIX",
    "INVALID_REQUEST",
    "MAX_ATTEMPT",
    "MAX_BLOCKERS",
    "MAX_FORGOTTEN_SHOWN",
    "MAX_RETIRED_KEYS_SHOWN",
    "MAX_RETIRED_SHOWN",
    "NOT_READY_WORKERS",
    "NOT_READY_WORKER_BLOCKERS",
    "REPORT_AGE_HEADER",
    "SERVER_TIME_HEADER",
    "CheckpointId",
    "CommitReply",
    "CommitRequest",
    "EpisodeId",
    "ErrorBody",
    "ErrorDetail",
    "ForgetReply",
    "ForgetRequest",
    "Manifest",
    "PrepareReply",
    "PrepareReport",
    "PrepareRequest",
    "RecordsPart",
    "RenewReply",
    "RenewRequest",
    "RestoreReply",
    "RestoreRequest",
    "ResumeReply",
    "ResumeRequest",
    "RetireReply",
    "RetireRequest",
    "RolloutId",
    "StatusReply",
    "WorkAdvance",
    "WorkAdvanceReply",
    "WorkStart",
    "WorkStartReply",
    "WorkerEndpoint",
    "decode",
    "encode",
    "error_body",
    "error_reply_body",
    "member_path",
]

CONTROL_PREFIX: Final = "/ng-control/v1/checkpoint"
_CONTROL_PATH: Final = CONTROL_PREFIX.encode()
#: Attributes of a prepare that was not ready at its deadline on a ``--workers`` server: which
#: workers blocked it, in words, and how many of its blockers they are (the rest are episodes).
#: The log's ``prepare_not_ready`` keeps only the count, so the report reads them from here.
NOT_READY_WORKERS: Final = "ckpt_events.not_ready.workers"
NOT_READY_WORKER_BLOCKERS: Final = "ckpt_events.not_ready.worker_blockers"
#: The last attempt of a rollout: an episode at it cannot be restored (continued as attempt + 1).
MAX_ATTEMPT: Final = 1_000_000
#: Replies list at most this many blockers; ``blocker_count`` has the full number.
MAX_BLOCKERS: Final = 100
#: ``GET /status`` lists at most this many retired marks (the newest); ``retired_count`` has
#: the full number. 100 UUID rollout ids take about 5 KiB of the reply.
MAX_RETIRED_SHOWN: Final = 100
#: A ``forget`` reply lists at most this many rollout ids (the first, sorted);
#: ``forgotten_count`` has the full number. A 64k-id forget echoed all of them: 1.1 MB a reply,
#: decoded by the controller once per member (35-56 ms each here).
MAX_FORGOTTEN_SHOWN: Final = 100
#: A ``retire`` reply lists at most this many capture keys (the first, sorted); ``retired_count``
#: has the full number. A 64k-id retire echoed all of them: 2.5 MB a reply (UUID rollout ids),
#: sent and decoded once per member.
MAX_RETIRED_KEYS_SHOWN: Final = 100
#: The error code of a malformed body (422); not an ``ErrorCode``, never counted as refused.
INVALID_REQUEST: Final = "invalid_request"
#: ``GET /status``'s reply header with the participant's clock (Unix seconds, microseconds):
#: ``watch`` ages open work by it. A header, not a field: a client that refuses unknown fields
#: still reads the body.
SERVER_TIME_HEADER: Final = "ckpt-server-time"
#: ``GET /status``'s reply header while ``preparing``: how old its ``report`` is (seconds,
#: microseconds; at most 0.2): a report computed within the waiting prepare's pacing is
#: shown again. A header, as ``SERVER_TIME_HEADER``.
REPORT_AGE_HEADER: Final = "ckpt-report-age"

# ``\Z``, not ``$``: ``$`` also matches before a final newline, so "c1\n" would pass.
_SAFE: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z"
# The suffix ``capture_key`` writes: ``-a`` and an attempt 1..MAX_ATTEMPT, in its one decimal
# spelling (no leading zero). A rollout id ending in it would share a capture key with another
# rollout ("r-a3" at attempt 0 is "r" at attempt 3), so it is refused; any other ending cannot be
# written by ``capture_key`` and is a plain id: a UUID whose last group is ``a`` and 11 digits
# (one uuid4 in ~2,800) has a leading zero or is above MAX_ATTEMPT, and is accepted.
_ATTEMPT_SUFFIX: Final = re.compile(r"-a([1-9][0-9]*)\Z")

CheckpointId = Annotated[str, msgspec.Meta(pattern=_SAFE, min_length=1, max_length=128)]
RolloutId = Annotated[str, msgspec.Meta(pattern=_SAFE, min_length=1, max_length=128)]
Attempt = Annotated[int, msgspec.Meta(ge=0, le=MAX_ATTEMPT)]
Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


def _attempt_suffix(value: str) -> re.Match[str] | None:
    """The ``-a<attempt>`` that ``capture_key`` would have written at the end of ``value``."""
    match = _ATTEMPT_SUFFIX.search(value)
    return match if match is not None and int(match.group(1)) <= MAX_ATTEMPT else None


def _check_rollout_id(value: str, where: str | None) -> None:
    """``where``: the field's path in a top-level body; ``None`` in a nested struct, whose path
    msgspec appends itself (a path of our own there would name a field the body lacks)."""
    # Runs for every id decoded or made (a 64,000-rollout restore makes a million): the
    # substring test spares the regex for ids that cannot end in -a<N>.
    if "-a" in value and _attempt_suffix(value):
        problem = (
            f"rollout_id {shown(value)} must not end in -a<N> (N in 1..{MAX_ATTEMPT}, the capture key"
            " suffix of attempt N): choose another ending, such as _a<N>"
        )
        raise InvalidValueError(problem if where is None else f"{where}: {problem} - at `$.{where}`")


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every request body: unknown fields are rejected (SPEC section 5), so a field
    the participant does not know is a 422 naming it, never silently dropped."""


class _Reply(msgspec.Struct, kw_only=True):
    """Base of every reply (and of ``manifest.json``): unknown fields are ignored, so a
    controller reads the replies of a participant one version newer (a field it added), and a
    newer participant's error body keeps its code. A field that changes what another one means
    needs a new route or ``schema_version``; an unknown enum value (a new ``phase``) is still
    a precise error naming it."""


class EpisodeId(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One dispatch of a rollout: attempt 0 is the first, a restore continues as attempt + 1."""

    rollout_id: RolloutId
    attempt: Attempt = 0

    def __post_init__(self) -> None:
        _check_rollout_id(self.rollout_id, None)

    @property
    def capture_key(self) -> str:
        """``rollout_id`` for attempt 0, else ``<rollout_id>-a<attempt>`` (invertible)."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    @classmethod
    def from_capture_key(cls, key: str) -> EpisodeId:
        """The inverse of ``capture_key``."""
        match = _attempt_suffix(key)
        if match is None:
            return cls(key, 0)
        return cls(key[: match.start()], int(match.group(1)))

    def next(self) -> EpisodeId:
        """The same rollout as the next attempt (what a restore installs)."""
        return EpisodeId(self.rollout_id, self.attempt + 1)


class _Base(_Body):
    checkpoint_id: CheckpointId
    deadline_ts: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.deadline_ts):
            raise InvalidValueError("deadline_ts must be a finite Unix time - at `$.deadline_ts`")


class PrepareRequest(_Base):
    """Close admission, park work at a boundary, wait until ready or ``deadline_ts``."""


class RenewRequest(_Base):
    """Extend the lease to ``deadline_ts + lease_grace_seconds``."""


class ResumeRequest(_Base):
    """Abort or finish the checkpoint: reopen admission, go idle, fence the id."""


class CommitRequest(_Base):
    """Export the episodes in scope (all when ``episode_ids`` is None), write records, then manifest."""

    checkpoint_dir: Path
    episode_ids: list[EpisodeId] | None = None
    stop: bool = False


class RestoreRequest(_Base):
    """Verify ``checkpoint_dir`` and install the records of ``episode_ids`` as attempt + 1."""

    checkpoint_dir: Path
    episode_ids: list[EpisodeId]

    def __post_init__(self) -> None:
        super().__post_init__()
        for i, episode in enumerate(self.episode_ids):
            if episode.attempt >= MAX_ATTEMPT:
                # Installed as attempt + 1, it could never be named by a call again.
                raise InvalidValueError(
                    f"episode_ids[{i}]: attempt {episode.attempt} is the last there is: a restore "
                    f"cannot continue it as attempt + 1 - at `$.episode_ids[{i}].attempt`"
                )


class RetireRequest(_Base):
    """Fence every attempt at or below each given one, and free its state."""

    episode_ids: Annotated[list[EpisodeId], msgspec.Meta(min_length=1)]


class ForgetRequest(_Base):
    """Clear the retired-attempt marks of these rollouts."""

    rollout_ids: Annotated[list[RolloutId], msgspec.Meta(min_length=1)]

    def __post_init__(self) -> None:
        super().__post_init__()
        for i, rollout_id in enumerate(self.rollout_ids):
            _check_rollout_id(rollout_id, f"rollout_ids[{i}]")


class PrepareReport(_Reply):
    """Readiness: ``blockers`` (capture keys, at most 100), their full count, per-kind counts."""

    ready: bool
    blockers: list[str] = msgspec.field(default_factory=list)
    blocker_count: int = 0
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    restarts: list[str] = msgspec.field(default_factory=list)


class WorkerEndpoint(_Reply):
    """One worker of a multi-worker server in ``GET /status``: its own work port, if up."""

    index: int
    connected: bool
    url: str | None = None


class StatusReply(_Reply):
    """``GET /status``: who this is and where its state machine stands (``workers``: a
    multi-worker server's workers, whose ports serve their sessions' work calls directly)."""

    kind: str
    instance: str
    phase: Phase
    checkpoint_id: str | None = None
    lease_expires_at: float | None = None
    admission_open: bool = True
    episodes: int = 0
    #: The newest retired marks (rollout id -> highest retired attempt), at most
    #: ``MAX_RETIRED_SHOWN``, oldest of them first: a summary, so the reply stays small
    #: whatever the number of retired rollouts.
    retired_rollouts: dict[str, int] = msgspec.field(default_factory=dict)
    #: How many retired marks the participant holds (``retired_rollouts`` shows the newest).
    retired_count: int = 0
    #: Marks forgotten by the retention (too old, or past the cap) since the server started.
    retired_expired: int = 0
    #: Readiness: live while ``preparing`` (what a waiting prepare sees now), else the last
    #: prepare's answer; ``None`` before any prepare of the active checkpoint.
    report: PrepareReport | None = None
    # UNSET (left out of the body) on a single-process server, so a client that predates the
    # field (unknown fields refused) still reads every single-process server's status.
    workers: list[WorkerEndpoint] | msgspec.UnsetType = msgspec.UNSET


class PrepareReply(_Reply):
    """``phase`` is ``prepared``, or ``preparing`` with the blockers in ``report``."""

    phase: Phase
    report: PrepareReport


class RenewReply(_Reply):
    lease_expires_at: float


class RecordsPart(_Reply):
    """One worker's records file of a multi-worker participant's checkpoint."""

    worker: int
    records_file: str
    records_sha256: str
    record_count: int


class Manifest(_Reply, omit_defaults=True):
    """``manifest.json``, written last and create-only next to the records file(s).

    A single-process participant names its one records file. A participant with several
    workers writes one file per worker, in parallel, and lists them in ``parts`` (in worker
    order); then ``records_file`` is empty, ``records_sha256`` is the SHA-256 of the parts'
    digests joined by newlines and ``record_count`` their sum.
    """

    schema_version: int
    kind: str
    instance: str
    checkpoint_id: str
    records_file: str
    records_sha256: str
    record_count: int
    parts: list[RecordsPart] = msgspec.field(default_factory=list)


class CommitReply(_Reply):
    """``episode_ids`` are the sorted capture keys exported; ``bytes`` the records file size."""

    phase: Phase
    manifest: Manifest
    episode_ids: list[str]
    bytes: int = 0
    staging_keys: list[str] | None = None


class RestoreReply(_Reply):
    """``restored`` are the capture keys installed (each as attempt + 1)."""

    phase: Phase
    restored: list[str]
    source_checkpoint_id: str | None = None


class ResumeReply(_Reply):
    """``idempotent`` is true when there was nothing to resume (or it was resumed already)."""

    phase: Phase
    idempotent: bool


class RetireReply(_Reply):
    """The attempts retired: ``retired`` (capture keys, at most ``MAX_RETIRED_KEYS_SHOWN``, the
    first in sorted order), ``retired_count`` (all of them, each once)."""

    retired: list[str]
    retired_count: int = 0


class ForgetReply(_Reply):
    """The rollouts whose marks were cleared: ``forgotten`` (at most ``MAX_FORGOTTEN_SHOWN``, the
    first in sorted order), ``forgotten_count`` (all of them, each once)."""

    forgotten: list[str]
    forgotten_count: int = 0


class ErrorDetail(_Reply):
    code: str
    detail: str


class ErrorBody(_Reply):
    """The body of every error reply."""

    error: ErrorDetail


# -- the uniform workload API (no auth) ------------------------------------------------------


class WorkStart(_Body):
    """``POST /work/start``: begin an episode of ``steps`` units of work.

    A missing ``rollout_id`` decodes (as None) so the server can answer 400
    ``rollout_id_required``, the protocol's code for work without a rollout id.
    """

    rollout_id: RolloutId | None = None
    attempt: Attempt = 0
    steps: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1

    def __post_init__(self) -> None:
        if self.rollout_id is not None:
            _check_rollout_id(self.rollout_id, "rollout_id")


class WorkStartReply(_Reply, omit_defaults=True):
    """``worker_url``: the own port of the worker that holds the session (multi-worker servers
    only): later work calls for it can go there directly, past the main process."""

    capture_key: str
    boundary: int
    worker_url: str | None = None


class WorkAdvance(_Body):
    """``POST /work/advance``: one unit of work on an episode (no ``rollout_id``: 400)."""

    rollout_id: RolloutId | None = None
    attempt: Attempt = 0

    def __post_init__(self) -> None:
        if self.rollout_id is not None:
            _check_rollout_id(self.rollout_id, "rollout_id")


class WorkAdvanceReply(_Reply, omit_defaults=True):
    """``worker_url`` as in ``WorkStartReply``: given when the call came through the main port."""

    boundary: int
    done: bool
    worker_url: str | None = None


# -- errors and codecs -------------------------------------------------------------------------


T = TypeVar("T")
_encoder: Final = msgspec.json.Encoder()


def decode(body: bytes, type: type[T]) -> T:
    """Decode a JSON body as ``type``; raise ``MalformedRequest`` naming the offending field."""
    try:
        return msgspec.json.decode(body, type=type)
    except msgspec.ValidationError as exc:
        raise MalformedRequest(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise MalformedRequest(f"body is not valid JSON: {exc}") from None


def error_body(error: ProtocolRefusal | MalformedRequest) -> ErrorBody:
    """The reply body of a refusal (its code) or of a malformed request (``invalid_request``)."""
    code = INVALID_REQUEST if isinstance(error, MalformedRequest) else error.code.value
    return error_reply_body(code, error.detail)


def error_reply_body(code: str, detail: str) -> ErrorBody:
    """Every error reply's body: ``detail`` redacted and bounded (``fitted_detail``). A detail
    can carry an exception's text (a worker's failed handler, an upstream's error), and with it
    a URL's ``user:password@`` or a ``Bearer`` token, which went to the client verbatim."""
    return ErrorBody(error=ErrorDetail(code=code, detail=fitted_detail(detail)))


def encode(value: Any) -> bytes:
    """Encode a reply as JSON."""
    return _encoder.encode(value)


def member_path(raw_path: bytes) -> bytes:
    """The part of a request's path that names its participant: everything before
    ``CONTROL_PREFIX`` (``b""`` if it has none). Participants behind one origin (a load balancer,
    logical members of one server) are told apart by it: a connection pool is one per member."""
    cut = raw_path.find(_CONTROL_PATH)
    return raw_path[:cut] if cut >= 0 else b""
