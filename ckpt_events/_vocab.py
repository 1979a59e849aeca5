"""The closed vocabularies of the checkpoint protocol, and every name built from them.

Span names, attribute keys and metric instrument names are contracts shared with
dashboards built for the original system: they are spelled here and nowhere else.
"""

from __future__ import annotations

import enum
from typing import Final, TypeVar

from ckpt_events._errors import UnknownNameError

__all__ = [
    "ATTR_PREFIX",
    "METRIC_BYTES",
    "METRIC_EVENTS",
    "METRIC_OPERATION_DURATION",
    "METRIC_RECORDS",
    "PREPARE_ORDER",
    "RESUME_ORDER",
    "RETIRE_GROUPS",
    "CountedEvent",
    "Disposition",
    "ErrorCode",
    "Kind",
    "Operation",
    "Outcome",
    "Phase",
    "Step",
    "attr",
    "coerce",
]


class Kind(enum.StrEnum):
    """Who reports: the four participant kinds, and the coordinator as ``controller``."""

    ENVIRONMENT = "environment"
    MODEL = "model"
    AGENT = "agent"
    RESOURCES = "resources"
    CONTROLLER = "controller"


class Operation(enum.StrEnum):
    """Checkpoint operations. ``renew`` is counted in metrics but has no span."""

    PREPARE = "prepare"
    COMMIT = "commit"
    RESTORE = "restore"
    RESUME = "resume"
    RETIRE = "retire"
    FORGET = "forget"
    RENEW = "renew"


class Step(enum.StrEnum):
    """Children of an operation; each belongs to exactly one operation (``Step.parent``)."""

    WAIT_READY = "wait_ready"
    GENERATION_CUT = "generation_cut"
    EXPORT = "export"
    WRITE = "write"
    READ = "read"
    INSTALL = "install"

    @property
    def parent(self) -> Operation:
        """The operation this step nests under."""
        return _STEP_PARENT[self]


_STEP_PARENT: Final = {
    Step.WAIT_READY: Operation.PREPARE,
    Step.GENERATION_CUT: Operation.PREPARE,
    Step.EXPORT: Operation.COMMIT,
    Step.WRITE: Operation.COMMIT,
    Step.READ: Operation.RESTORE,
    Step.INSTALL: Operation.RESTORE,
}


class Phase(enum.StrEnum):
    """A participant's phase in the checkpoint state machine."""

    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"
    RESTORED = "restored"


class Outcome(enum.StrEnum):
    """How an operation, step or stage ended."""

    OK = "ok"
    ERROR = "error"


class CountedEvent(enum.StrEnum):
    """Values of the ``nemo.gym.checkpoint.event`` attribute on ``gym.checkpoint.events_total``."""

    LEASE_EXPIRED = "lease_expired"
    PREPARE_NOT_READY = "prepare_not_ready"
    REFUSED = "refused"
    GENERATION_CUT = "generation_cut"


class Disposition(enum.StrEnum):
    """How one in-flight generation ended a cut round (``cut_skipped`` is not one)."""

    DURABLE_PREFIX = "durable_prefix"
    DURABLE_FAILURE = "durable_failure"


class ErrorCode(enum.StrEnum):
    """Protocol error codes; ``ErrorCode.X.http_status`` is the status the protocol replies with."""

    CHECKPOINT_ERROR = "checkpoint_error"
    STALE_CHECKPOINT = "stale_checkpoint"
    CHECKPOINT_CONFLICT = "checkpoint_conflict"
    INVALID_PHASE = "invalid_phase"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    STALE_ATTEMPT = "stale_attempt"
    ADMISSION_CLOSED = "admission_closed"
    RESTART_IN_SCOPE = "restart_in_scope"
    ROLLOUT_ID_REQUIRED = "rollout_id_required"
    UNAUTHORIZED = "unauthorized"
    INVALID_CHECKPOINT_STATE = "invalid_checkpoint_state"
    CHECKPOINT_COORDINATOR_UNAVAILABLE = "checkpoint_coordinator_unavailable"

    @property
    def http_status(self) -> int:
        """The HTTP status that goes with this code."""
        return _HTTP_STATUS.get(self, 409)


_HTTP_STATUS: Final = {
    ErrorCode.ROLLOUT_ID_REQUIRED: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.INVALID_CHECKPOINT_STATE: 422,
    ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE: 503,
}

#: Participant kinds in prepare order; resume runs the reverse.
PREPARE_ORDER: Final = (Kind.ENVIRONMENT, Kind.MODEL, Kind.AGENT, Kind.RESOURCES)
RESUME_ORDER: Final = tuple(reversed(PREPARE_ORDER))
#: Retire and forget go callers before callees, one group at a time.
RETIRE_GROUPS: Final = ((Kind.ENVIRONMENT,), (Kind.AGENT,), (Kind.MODEL, Kind.RESOURCES))

ATTR_PREFIX: Final = "nemo.gym.checkpoint."
SPAN_PREFIX: Final = "gym.checkpoint."

METRIC_OPERATION_DURATION: Final = "gym.checkpoint.operation_duration_ms"
METRIC_RECORDS: Final = "gym.checkpoint.records_total"
METRIC_BYTES: Final = "gym.checkpoint.bytes_total"
METRIC_EVENTS: Final = "gym.checkpoint.events_total"


def attr(name: str) -> str:
    """The full attribute key for ``name``: ``attr("records") == "nemo.gym.checkpoint.records"``."""
    return ATTR_PREFIX + name


def span_name(*parts: str) -> str:
    """``span_name("coordinate", "prepare") == "gym.checkpoint.coordinate.prepare"``."""
    return SPAN_PREFIX + ".".join(parts)


E = TypeVar("E", bound=enum.StrEnum)

# Each vocabulary's lookup table, accepting the member itself or its string value.
_LOOKUP: dict[type[enum.StrEnum], dict[object, enum.StrEnum]] = {}


def coerce(vocabulary: type[E], value: object) -> E:
    """Return ``value`` as a member of ``vocabulary``, or raise ``UnknownNameError``.

    Accepts the member or its string value; anything else names the valid values.
    """
    table = _LOOKUP.get(vocabulary)
    if table is None:
        table = {member.value: member for member in vocabulary}
        _LOOKUP[vocabulary] = table
    try:
        return table[value]  # type: ignore[return-value]
    except (KeyError, TypeError):
        what = _WHAT.get(vocabulary, vocabulary.__name__)
        raise UnknownNameError(what, value, [m.value for m in vocabulary]) from None


def check_name(names: frozenset[str], value: object, vocabulary: type[enum.StrEnum]) -> None:
    """Raise ``UnknownNameError`` unless ``value`` is in ``names`` (the vocabulary's values).

    Allocates nothing when the name is known: the off path calls it on every site.
    """
    try:
        if value in names:
            return
    except TypeError:  # unhashable: certainly not a name
        pass
    coerce(vocabulary, value)


_WHAT: Final[dict[type[enum.StrEnum], str]] = {
    Kind: "participant kind",
    Operation: "operation",
    Step: "step",
    Phase: "phase",
    Outcome: "outcome",
    CountedEvent: "counted event",
    Disposition: "generation-cut disposition",
    ErrorCode: "error code",
}
