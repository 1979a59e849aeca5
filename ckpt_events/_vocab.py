"""The vocabularies of the checkpoint protocol, and every name built from them.

Span names, attribute keys and metric instrument names are contracts shared with
dashboards built for the original system: they are spelled here and nowhere else.
Operations, phases, outcomes, codes and dispositions are closed (a typo is an
``UnknownNameError``); participant kinds and steps are the user's, open like OpenTelemetry's
span names: any name of ``NAME_RULE``'s shape, with the original system's as constants.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Final, NamedTuple, TypeVar

from ckpt_events._errors import InvalidTypeError, InvalidValueError, UnknownNameError, shown
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish

__all__ = [
    "ATTR_PREFIX",
    "COLLECTION_END_ATTRS",
    "COLLECTION_SPANS",
    "CONTROLLER_INSTANCE",
    "COORDINATE_END_ATTRS",
    "COORDINATE_SPANS",
    "INSTRUMENTS",
    "KIND_NAMES",
    "METRIC_BYTES",
    "METRIC_EVENTS",
    "METRIC_LAST_PUBLISHED",
    "METRIC_LOOP_LAG",
    "METRIC_OLDEST_OPEN",
    "METRIC_OPEN_OPERATIONS",
    "METRIC_OPERATION_DURATION",
    "METRIC_RECORDS",
    "NAME_RULE",
    "OPEN_WORK_INSTRUMENTS",
    "OPERATION_END_ATTRS",
    "OPERATION_SPANS",
    "SAFE_NAME",
    "SPAN_PREFIX",
    "STAGE_SPANS",
    "STEP_END_ATTRS",
    "STEP_NAMES",
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
    "OpenTable",
    "Operation",
    "Outcome",
    "Phase",
    "SpanKind",
    "Step",
    "attr",
    "check_name",
    "coerce",
    "kind_name",
    "span_name",
    "step_name",
]

logger: Final = library_logger("ckpt_events")


class Kind(enum.StrEnum):
    """The original system's participant kinds, and the coordinator as ``controller``.

    Kinds are open: any name of ``NAME_RULE``'s shape is a kind (``Telemetry(bus,
    kind="judge", ...)``); these are the ones the original system named. Members are ``str``,
    so compare a kind with ``==``: an event read from a log holds a plain ``str``.
    """

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
    """The original system's steps (children of an operation), each under one operation.

    Steps are open like kinds: ``op.step("upload")`` is a child span ``gym.checkpoint.upload``
    of whatever operation it runs under. ``Step.X.parent`` is where the original system runs
    ``X``; a step of the user's has no fixed parent.
    """

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
    """Protocol error codes (the HTTP status of each is the harness's rule, not the core's)."""

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


#: The shape of a participant kind or a step name (SPEC section 1): 1 to 64 lowercase letters,
#: digits, ``_`` and ``-``, starting with a letter or a digit (a kind is also a command-line
#: argument and a file name part, where a leading ``-`` would read as an option).
NAME_RULE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_RULE_TEXT: Final = "1-64 characters of a-z, 0-9, '_' and '-', starting with a letter or digit"
#: The pattern of checkpoint ids, rollout ids and instance names (also safe as a path part).
SAFE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: Validated kind and step names -> the name events carry (the member, for a constant).
#: Seeded with the constants; a user's names join on first use (up to ``_REMEMBERED``), so
#: a hot path checks a name it has seen with one dict lookup, and never builds anything.
KIND_NAMES: Final[dict[object, str]] = {k.value: k for k in Kind}
STEP_NAMES: Final[dict[object, str]] = {s.value: s for s in Step}
_REMEMBERED: Final = 1024


def kind_name(value: object) -> str:
    """``value`` as a participant kind: the ``Kind`` member for a constant, else a plain ``str``.

    Raises ``InvalidTypeError`` unless ``value`` is a ``str``, ``InvalidValueError`` unless it
    has ``NAME_RULE``'s shape; both messages name the value and the rule.
    """
    try:
        return KIND_NAMES[value]
    except (KeyError, TypeError):
        return _learn("participant kind", value, KIND_NAMES)


def step_name(value: object) -> str:
    """``value`` as a step: the ``Step`` member for a constant, else a plain ``str`` (as ``kind_name``)."""
    try:
        return STEP_NAMES[value]
    except (KeyError, TypeError):
        return _learn("step", value, STEP_NAMES)


def _learn(what: str, value: object, names: dict[object, str]) -> str:
    if not isinstance(value, str):
        raise InvalidTypeError(f"a {what} must be a str ({_RULE_TEXT}), not {shown(value)}")
    if NAME_RULE.fullmatch(value) is None:
        raise InvalidValueError(f"invalid {what} {shown(value)}: a {what} is {_RULE_TEXT}")
    name = str(value)  # a user's own StrEnum member goes out as its value
    if len(names) < _REMEMBERED:
        names[name] = name
    elif what not in _SAID_FULL:
        _said_full(what, name)
    return name


#: The names whose table filled (``_REMEMBERED``), said once each: a step made of an id
#: (``op.step(f"upload-{shard}")``) gave 10,002 span names for 10,000 shards, without a word.
_SAID_FULL: Final[set[str]] = set()
_WHY_FULL: Final = {
    "step": (
        "each is a span name (gym.checkpoint.<step>), and tracing backends group and index spans "
        "by name: name the step for what it does and put the id in an attribute "
        "(with op.step('upload') as step: step.set_attribute('shard', shard))"
    ),
    "participant kind": (
        "a kind is an attribute of every metric (folded into one overflow series past its "
        "cardinality limit): put the instance's own name in instance=, not in kind="
    ),
}


def _said_full(what: str, latest: str) -> None:
    _SAID_FULL.add(what)
    logger.warning(
        "%s distinct %s names in this process (the latest %r), which looks like ids in names: %s; "
        "names past these are still used, checked each time (said once)",
        f"{_REMEMBERED:,}",
        what,
        latest,
        _WHY_FULL[what],
    )


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
    #: A span closed by a reader, not by its process: open at the end of its process's log (a
    #: crash), ended at that process's last event with status ERROR (as nemo-lens marks them).
    TRUNCATED: Final = attr("truncated")
    # Metric point attributes.
    OPERATION: Final = attr("operation")
    EVENT: Final = attr("event")
    CODE: Final = attr("code")
    DISPOSITION: Final = attr("disposition")
    #: The metrics' outcome key is unprefixed, as in the original system.
    METRIC_OUTCOME: Final = "outcome"
    #: OpenTelemetry's semantic-convention ``error.type`` on a failed span (its exception's
    #: qualified type, ``_OTHER`` when unknown), so a backend groups our failures
    #: with its own instrumentations' (spans only, never metrics).
    ERROR_TYPE: Final = "error.type"


V = TypeVar("V")


class OpenTable(dict[str, V]):
    """A table keyed by kind or step: the constants' entries, and ``table[name]`` for any other
    name answered by the table's rule (``default(name)``), built on each lookup, never stored.

    ``in``, ``get``, iteration and ``len`` see the constants' entries only.
    """

    __slots__ = ("_default",)

    def __init__(self, entries: dict[str, V], default: Callable[[str], V]) -> None:
        super().__init__(entries)
        self._default = default

    def __missing__(self, key: str) -> V:
        return self._default(key)


#: One span per operation, except ``renew``, which has none.
OPERATION_SPANS: Final[dict[Operation, str]] = {
    op: span_name(op.value) for op in Operation if op is not Operation.RENEW
}
#: A step's span, ``gym.checkpoint.<step>`` (a user's step too), a child of its operation's.
STEP_SPANS: Final[OpenTable[str]] = OpenTable({step: span_name(step) for step in Step}, span_name)
COORDINATE_SPANS: Final[dict[Operation, str]] = {op: span_name("coordinate", op.value) for op in Operation}
#: A prepare stage's span, ``gym.checkpoint.coordinate.prepare.<kind>`` (a user's kind too).
STAGE_SPANS: Final[OpenTable[str]] = OpenTable(
    {kind: span_name("coordinate", "prepare", kind) for kind in Kind},
    lambda kind: span_name("coordinate", "prepare", kind),
)
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
#: A user's step carries ``records`` and ``bytes`` when set (``StepSpan.set``); ``calls`` and
#: ``cut_*`` belong to ``generation_cut`` and stay off every other step's span.
_USER_STEP_ATTRS: Final[FieldAttrs] = (("records", Attr.RECORDS), ("bytes", Attr.BYTES))
STEP_END_ATTRS: Final[OpenTable[FieldAttrs]] = OpenTable(
    {
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
    },
    lambda step: _USER_STEP_ATTRS,
)
COLLECTION_END_ATTRS: Final[dict[CollectionAction, FieldAttrs]] = {
    CollectionAction.CHECKPOINT: (
        ("in_flight", Attr.IN_FLIGHT),
        ("stop", Attr.STOP),
        ("published", Attr.PUBLISHED),
    ),
    CollectionAction.RESTORE: (("rows", Attr.ROWS), ("restarts", Attr.RESTARTS)),
    CollectionAction.PUBLISH: (),
}


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish(
    "ckpt_events.vocab",
    Attr,
    CollectionAction,
    CountedEvent,
    Disposition,
    ErrorCode,
    Instrument,
    InstrumentKind,
    Kind,
    OpenTable,
    Operation,
    Outcome,
    Phase,
    SpanKind,
    Step,
    attr,
    coerce,
    kind_name,
    span_name,
    step_name,
)
