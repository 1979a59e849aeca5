"""The closed vocabularies of the checkpoint protocol, and every name built from them.

Span names, attribute keys and metric instrument names are contracts shared with
dashboards built for the original system: they are spelled here and nowhere else.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple, TypeVar

from ckpt_events._errors import UnknownNameError

__all__ = [
    "ATTR_PREFIX",
    "COLLECTION_END_ATTRS",
    "COLLECTION_SPANS",
    "CONTROLLER_INSTANCE",
    "COORDINATE_END_ATTRS",
    "COORDINATE_SPANS",
    "INSTRUMENTS",
    "METRIC_BYTES",
    "METRIC_EVENTS",
    "METRIC_LAST_PUBLISHED",
    "METRIC_LOOP_LAG",
    "METRIC_OLDEST_OPEN",
    "METRIC_OPEN_OPERATIONS",
    "METRIC_OPERATION_DURATION",
    "METRIC_RECORDS",
    "OPEN_WORK_INSTRUMENTS",
    "OPERATION_END_ATTRS",
    "OPERATION_SPANS",
    "PREPARE_ORDER",
    "RESUME_ORDER",
    "RETIRE_GROUPS",
    "SPAN_PREFIX",
    "STAGE_SPANS",
    "STEP_END_ATTRS",
    "STEP_SPANS",
    "Attr",
    "CollectionAction",
    "CountedEvent",
    "Disposition",
    "ErrorCode",
    "FieldAttrs",
    "Instrument",
    "InstrumentKind",
    "Kind",
    "Operation",
    "Outcome",
    "Phase",
    "SpanKind",
    "Step",
    "attr",
    "check_name",
    "coerce",
    "span_name",
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
    #: An operation stayed open past ``sinks.StallWatch``'s threshold (counted once per operation).
    STALLED = "stalled"


class Disposition(enum.StrEnum):
    """How one in-flight generation ended a cut round (``cut_skipped`` is not one)."""

    DURABLE_PREFIX = "durable_prefix"
    DURABLE_FAILURE = "durable_failure"


class CollectionAction(enum.StrEnum):
    """What a rollout collection's span covers: ``gym.checkpoint.collection.<action>``."""

    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    #: Writing the collection record of a checkpoint (a child of ``checkpoint``), so the
    #: report can name that time instead of leaving it as a gap.
    PUBLISH = "publish"


class SpanKind(enum.StrEnum):
    """OpenTelemetry's span kind of a checkpoint span (see ``span_kind_of``)."""

    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"


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

#: The coordinator reports as kind ``controller`` with this instance.
CONTROLLER_INSTANCE: Final = "coordination"

ATTR_PREFIX: Final = "nemo.gym.checkpoint."
SPAN_PREFIX: Final = "gym.checkpoint."

METRIC_OPERATION_DURATION: Final = "gym.checkpoint.operation_duration_ms"
METRIC_RECORDS: Final = "gym.checkpoint.records_total"
METRIC_BYTES: Final = "gym.checkpoint.bytes_total"
METRIC_EVENTS: Final = "gym.checkpoint.events_total"
#: Event-loop lag of a participant during one operation (max sleep overshoot), a histogram.
METRIC_LOOP_LAG: Final = "gym.checkpoint.loop_lag_ms"
#: Operations open now (started, not finished), an up-down counter.
METRIC_OPEN_OPERATIONS: Final = "gym.checkpoint.open_operations"
#: Age in seconds of the oldest open operation (0 when none), a gauge.
METRIC_OLDEST_OPEN: Final = "gym.checkpoint.oldest_open_s"
#: Unix time (s) the controller last published a checkpoint, a gauge.
METRIC_LAST_PUBLISHED: Final = "gym.checkpoint.last_published_ts"


class InstrumentKind(enum.StrEnum):
    """How a metric instrument aggregates: a monotonic sum, or an explicit-bucket histogram."""

    COUNTER = "counter"
    HISTOGRAM = "histogram"
    #: Open work: a sum that goes up and down (started minus finished).
    UP_DOWN_COUNTER = "up_down_counter"
    #: Open work: a value observed when the metrics are read (an age, a time).
    GAUGE = "gauge"


class Instrument(NamedTuple):
    """One metric instrument: its SPEC name, kind, UCUM unit and description."""

    name: str
    kind: InstrumentKind
    unit: str
    description: str


#: Every metric instrument, spelled once: the SDK-backed ``MetricSink`` creates these and our
#: OTLP encoder exports them, histograms and counters each in this order.
INSTRUMENTS: Final = (
    Instrument(
        METRIC_OPERATION_DURATION, InstrumentKind.HISTOGRAM, "ms", "Duration of a checkpoint operation"
    ),
    Instrument(METRIC_RECORDS, InstrumentKind.COUNTER, "1", "Records written by commit or read by restore"),
    Instrument(METRIC_BYTES, InstrumentKind.COUNTER, "By", "Bytes written by commit or read by restore"),
    Instrument(METRIC_EVENTS, InstrumentKind.COUNTER, "1", "Counted checkpoint events"),
    Instrument(
        METRIC_LOOP_LAG,
        InstrumentKind.HISTOGRAM,
        "ms",
        "A participant's worst event-loop lag during an operation",
    ),
)

#: The open-work instruments, spelled once: both metric sinks derive them from the
#: ``*Started``/``*Finished`` events (the up-down counter first, then the two gauges).
OPEN_WORK_INSTRUMENTS: Final = (
    Instrument(
        METRIC_OPEN_OPERATIONS,
        InstrumentKind.UP_DOWN_COUNTER,
        "{operation}",
        "Checkpoint operations started and not yet finished",
    ),
    Instrument(
        METRIC_OLDEST_OPEN,
        InstrumentKind.GAUGE,
        "s",
        "Age of the oldest open checkpoint operation (0 when none is open)",
    ),
    Instrument(
        METRIC_LAST_PUBLISHED,
        InstrumentKind.GAUGE,
        "s",
        "Unix time the controller last published a checkpoint",
    ),
)


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
    CollectionAction: "collection action",
    ErrorCode: "error code",
}


# -- span names and attribute keys (SPEC sections 2 and 3), spelled once ------------------------


class Attr:
    """Every attribute key of a span or a metric point, as a constant."""

    ID: Final = attr("id")
    PARTICIPANT_KIND: Final = attr("participant_kind")
    INSTANCE: Final = attr("instance")
    OUTCOME: Final = attr("outcome")
    PHASE: Final = attr("phase")
    BLOCKERS: Final = attr("blockers")
    RECORDS: Final = attr("records")
    BYTES: Final = attr("bytes")
    EPISODES: Final = attr("episodes")
    ROLLOUTS: Final = attr("rollouts")
    CALLS: Final = attr("calls")
    CUT_DURABLE_PREFIX: Final = attr("cut_durable_prefix")
    CUT_DURABLE_FAILURE: Final = attr("cut_durable_failure")
    PARTICIPANTS: Final = attr("participants")
    PREPARED: Final = attr("prepared")
    STOPPED_AT: Final = attr("stopped_at")
    IN_FLIGHT: Final = attr("in_flight")
    STOP: Final = attr("stop")
    PUBLISHED: Final = attr("published")
    ROWS: Final = attr("rows")
    RESTARTS: Final = attr("restarts")
    #: When the request reached the participant's app (Unix ns), before routing and parsing.
    RECEIVED_NS: Final = attr("received_ns")
    #: The participant's worst event-loop lag (ms) seen while the operation ran.
    LOOP_LAG_MS: Final = attr("loop_lag_ms")
    #: The worker process of a multi-worker participant (spans and JSON lines only, never metrics).
    WORKER: Final = attr("worker")
    # Metric point attributes.
    OPERATION: Final = attr("operation")
    EVENT: Final = attr("event")
    CODE: Final = attr("code")
    DISPOSITION: Final = attr("disposition")
    #: The metrics' outcome key is unprefixed, as in the original system.
    METRIC_OUTCOME: Final = "outcome"


#: One span per operation, except ``renew``, which has none.
OPERATION_SPANS: Final[dict[Operation, str]] = {
    op: span_name(op.value) for op in Operation if op is not Operation.RENEW
}
STEP_SPANS: Final[dict[Step, str]] = {step: span_name(step.value) for step in Step}
COORDINATE_SPANS: Final[dict[Operation, str]] = {op: span_name("coordinate", op.value) for op in Operation}
STAGE_SPANS: Final[dict[Kind, str]] = {kind: span_name("coordinate", "prepare", kind.value) for kind in Kind}
COLLECTION_SPANS: Final[dict[CollectionAction, str]] = {
    action: span_name("collection", action.value) for action in CollectionAction
}

#: (event field, attribute key) pairs each span adds when it ends, beyond id, kind, instance
#: and outcome. Fields left out here stay off the span.
FieldAttrs = tuple[tuple[str, str], ...]
_TIMING: Final = (("received_ns", Attr.RECEIVED_NS), ("loop_lag_ms", Attr.LOOP_LAG_MS))
OPERATION_END_ATTRS: Final[dict[Operation, FieldAttrs]] = {
    Operation.PREPARE: (("phase", Attr.PHASE), ("blockers", Attr.BLOCKERS), *_TIMING),
    Operation.COMMIT: (("records", Attr.RECORDS), *_TIMING),
    Operation.RESTORE: (("records", Attr.RECORDS), *_TIMING),
    Operation.RETIRE: (("episodes", Attr.EPISODES), *_TIMING),
    Operation.FORGET: (("rollouts", Attr.ROLLOUTS), *_TIMING),
    Operation.RESUME: _TIMING,
}
COORDINATE_END_ATTRS: Final[dict[Operation, FieldAttrs]] = {
    Operation.PREPARE: (("prepared", Attr.PREPARED), ("stopped_at", Attr.STOPPED_AT)),
    Operation.COMMIT: (("episodes", Attr.EPISODES),),
    Operation.RESTORE: (("episodes", Attr.EPISODES),),
    Operation.RETIRE: (("episodes", Attr.EPISODES),),
    Operation.FORGET: (("rollouts", Attr.ROLLOUTS),),
    Operation.RESUME: (),
    Operation.RENEW: (),
}
STEP_END_ATTRS: Final[dict[Step, FieldAttrs]] = {
    Step.WAIT_READY: (),
    Step.EXPORT: (("records", Attr.RECORDS),),
    Step.WRITE: (("records", Attr.RECORDS), ("bytes", Attr.BYTES)),
    Step.READ: (("records", Attr.RECORDS), ("bytes", Attr.BYTES)),
    Step.INSTALL: (("records", Attr.RECORDS),),
    Step.GENERATION_CUT: (
        ("calls", Attr.CALLS),
        ("cut_durable_prefix", Attr.CUT_DURABLE_PREFIX),
        ("cut_durable_failure", Attr.CUT_DURABLE_FAILURE),
    ),
}
COLLECTION_END_ATTRS: Final[dict[CollectionAction, FieldAttrs]] = {
    CollectionAction.CHECKPOINT: (
        ("in_flight", Attr.IN_FLIGHT),
        ("stop", Attr.STOP),
        ("published", Attr.PUBLISHED),
    ),
    CollectionAction.RESTORE: (("rows", Attr.ROWS), ("restarts", Attr.RESTARTS)),
    CollectionAction.PUBLISH: (),
}
