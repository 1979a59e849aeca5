"""Every exception the project raises on purpose, as two trees: the library's and the command line's.

The library's tree (``CkptEventsError``: the core, the sinks, the FastAPI integration and the
control plane's protocol)::

    CkptEventsError                 root: catch this to catch everything we raise
    ├── UnknownNameError            a name outside a closed vocabulary (also a ValueError)
    ├── InvalidArgumentError        a bad argument; raised as one of its two children:
    │   ├── InvalidValueError       the right type, a wrong value: out of range, empty, unsafe
    │   │                           (also a ValueError)
    │   └── InvalidTypeError        the wrong type of object (also a TypeError)
    ├── ConfigurationError          a bad setting or environment variable (also a ValueError)
    ├── SpanNotStartedError         a live span handle left (``__exit__``) without being entered
    │                               (also a RuntimeError)
    │
    │   participant side (raised in a participant process, answered over HTTP)
    ├── ProtocolRefusal             a participant refuses a call: ``code`` (an ``ErrorCode``),
    │                               ``detail``; answered with the code's HTTP status, counted
    │                               as ``refused``
    ├── MalformedRequest            a body that does not decode: 422 ``invalid_request``, not
    │                               counted as ``refused``
    ├── WorkError                   a unit of work failed upstream: 502 ``upstream_error``
    ├── EpisodeGone                 an episode lost with the worker that held it: a 404 that says
    │                               so (also a LookupError, as "no such episode" is)
    ├── CheckpointStoreError        the on-disk checkpoint could not be written or read
    │   ├── InvalidCheckpointError  missing, corrupt, unsafe or out of scope: the control plane
    │   │                           answers ``invalid_checkpoint_state`` (422)
    │   ├── CheckpointWriteError    an I/O error (ENOSPC, EIO, ...) during the write; ``published``
    │   │                           says whether the manifest exists: ``checkpoint_error`` (409)
    │   └── WriteStopped            resume ran during the write, no manifest was published:
    │                               the control plane answers ``stale_checkpoint`` (409)
    ├── WorkerChannelError          the socket between a server's coordinator and one of its
    │                               workers failed: a bad frame, a lost peer, no reply in time
    ├── RequestEnded                never raised: the error type an operation of the FastAPI
    │                               integration's ``operation(request)`` ends with when its request
    │                               ended first (a stream whose client left)
    │
    │   controller side (raised in the process that calls participants)
    ├── ParticipantCallError        a call to a participant failed (``code``, ``status``, ``url``)
    │   └── ParticipantUnreachable  no HTTP answer at all (connection refused, timeout, ...)
    ├── CoordinationError           an operation failed on some participants (``failures``)
    ├── CheckpointNotPrepared       prepare stopped at a stage that was not ready (aborted)
    ├── RolloutRetired              the participants fenced this attempt (``stale_attempt``)
    └── RunDirectoryError           a run directory is not this run's to use
        ├── RunDirectoryInUse       another fleet holds its lock (``holder`` says whose)
        └── ForeignCheckpoint       a checkpoint of another run (``run_id``): never restored
                                    unless named with that run's id

The command line's tree (``ckpt-events``: not library errors, so a user's ``except
CkptEventsError`` never catches a demo's verdict)::

    CommandLineError                root: one line on stderr and a non-zero exit, never a traceback
    ├── CommandError                a usage or setup problem: exit status 2
    ├── LaunchError                 a server process did not come up (also a RuntimeError)
    └── DemoFailed                  the demo ran but its result is wrong

    Interrupted                     a stop signal ended a command (a ``KeyboardInterrupt``):
                                    exit 128 + ``signum``; ``cut`` says what a forced exit cut

The benchmarks' own (``ckpt_events.benchmarks``: ``RuntimeError`` subclasses, each said in one
line by ``ckpt-events bench``)::

    CollectorError                  the ``rotel-agent`` found did not run (cannot be executed,
                                    exits at start, never listens)
    DriverError                     the load generator (``wrk``) failed or did not finish

The first seven of the library's tree live in ``ckpt_events`` (its ``_errors`` module draws them);
the sinks raise those and define none of their own for you to catch (the scrape server's
``Unavailable`` is a handler's signal that its request's deadline passed: answered 503, never
raised out of it). Everything else is defined here, so
each room of ``participants`` imports its errors from one module that imports only the core.
``ProtocolRefusal`` is what a participant *raises*; ``ParticipantCallError`` is what the
controller's client *receives* when a participant refused (or could not be reached).

A bad int or number argument anywhere in ``participants`` is checked by ``check_int`` or
``check_number``, the library's public pair (``ckpt_events.checks``, re-exported here so each
room imports its checks with its errors): a ``bool`` is never a number, the wrong type is an
``InvalidTypeError``, the right type out of range an ``InvalidValueError``. A message quotes
a caller's value with ``shown`` (re-exported too): its repr, cut with its size said when long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from ckpt_events import CkptEventsError, Redactor, UnknownNameError
from ckpt_events.checks import check_int, check_number, fit_text, shown
from ckpt_events.vocab import ErrorCode, coerce

__all__ = [
    "DETAIL_CHARS",
    "HTTP_STATUS",
    "CheckpointNotPrepared",
    "CheckpointStoreError",
    "CheckpointWriteError",
    "CommandError",
    "CommandLineError",
    "CoordinationError",
    "DemoFailed",
    "EpisodeGone",
    "ForeignCheckpoint",
    "Interrupted",
    "InvalidCheckpointError",
    "LaunchError",
    "MalformedRequest",
    "ParticipantCallError",
    "ParticipantUnreachable",
    "PrepareOutcome",
    "ProtocolRefusal",
    "RolloutRetired",
    "RunDirectoryError",
    "RunDirectoryInUse",
    "WorkError",
    "WorkerChannelError",
    "WriteStopped",
    "check_int",
    "failure_detail",
    "fitted_detail",
    "check_number",
    "shown",
]


# -- participant side --------------------------------------------------------------------------

#: The HTTP status a participant answers each protocol error code with (the harness's rule,
#: SPEC section 1: the core's ``ErrorCode`` names the codes only).
HTTP_STATUS: Final[Mapping[ErrorCode, int]] = {
    ErrorCode.CHECKPOINT_ERROR: 409,
    ErrorCode.STALE_CHECKPOINT: 409,
    ErrorCode.CHECKPOINT_CONFLICT: 409,
    ErrorCode.INVALID_PHASE: 409,
    ErrorCode.DEADLINE_EXCEEDED: 409,
    ErrorCode.STALE_ATTEMPT: 409,
    ErrorCode.ADMISSION_CLOSED: 409,
    ErrorCode.RESTART_IN_SCOPE: 409,
    ErrorCode.ROLLOUT_ID_REQUIRED: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.INVALID_CHECKPOINT_STATE: 422,
    ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE: 503,
}


class ProtocolRefusal(CkptEventsError):
    """A participant refuses a call: ``code`` (an ``ErrorCode``), ``detail``, and its HTTP ``status``."""

    def __init__(self, code: ErrorCode | str, detail: str) -> None:
        self.code = coerce(ErrorCode, code)
        self.detail = detail
        super().__init__(f"{self.code.value}: {detail}")

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]


class MalformedRequest(CkptEventsError):
    """A body that does not decode (HTTP 422, code ``invalid_request``); ``detail`` names the field."""

    status: Final = 422

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class WorkError(CkptEventsError):
    """A unit of work failed upstream (e.g. the inference worker): HTTP 502 ``upstream_error``."""


class EpisodeGone(CkptEventsError, LookupError):
    """An episode this server held and lost (the worker holding it ended): the 404's detail,
    ``detail``, says so, where "no episode" would read as if it had never been started."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(key)
        self.detail = detail


class CheckpointStoreError(CkptEventsError):
    """The on-disk checkpoint could not be written or read; ``detail`` says what is wrong."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class InvalidCheckpointError(CheckpointStoreError):
    """A checkpoint (or a record in it) is missing, corrupt, unsafe or cannot be written."""


class CheckpointWriteError(CheckpointStoreError):
    """An I/O error stopped the write; ``published`` is whether the manifest exists afterwards."""

    def __init__(self, detail: str, *, published: bool) -> None:
        self.published = published
        super().__init__(detail)


class WriteStopped(CheckpointStoreError):
    """Resume ran while the commit was writing: its manifest was not published."""


class WorkerChannelError(CkptEventsError):
    """The coordinator-worker socket failed: a bad frame, a lost peer, or no reply in time."""


# -- controller side ---------------------------------------------------------------------------


class PrepareOutcome(Protocol):
    """What ``CheckpointNotPrepared`` holds of a stopped prepare, typed by shape so this module
    imports only the core (the controller's ``PrepareResult`` is the one implementation)."""

    @property
    def checkpoint_id(self) -> str: ...

    @property
    def prepared(self) -> bool: ...

    @property
    def stopped_at(self) -> str | None: ...

    @property
    def replies(self) -> Mapping[str, object]: ...

    def blockers(self) -> dict[str, list[str]]: ...

    def blocker_count(self) -> int: ...


#: The default redaction rule, for the text of a failed call to a participant.
_RULE: Final = Redactor()
#: The longest text of one participant's failure kept (``ParticipantCallError.detail``, each of
#: ``CoordinationError.failures``): a few lines of a validation error stay whole; a reply body
#: of a megabyte was kept whole, in the exception and its message.
DETAIL_CHARS: Final = 2000
#: Each of ``CoordinationError.failures``: a detail and the words and URL around it
#: (``fan_out.described``), so a detail cut once keeps the size it said.
_FAILURE_CHARS: Final = DETAIL_CHARS + 500
#: Of that, what ``CoordinationError``'s message says per member, and members it names at most
#: (a fleet of 256 refusing at once is one readable line; ``failures`` keeps them all).
_SAID_CHARS: Final = 500
_SAID_MEMBERS: Final = 16


def fitted_detail(text: str, limit: int = DETAIL_CHARS, *, sized: bool = True) -> str:
    """``text`` (a failure's detail: a refusal's, a reply body's, an exception's message) as the
    library fits any text (``ckpt_events.checks.fit_text``): its credentials redacted, then cut
    at ``limit`` characters, its size said (if ``sized``) when longer."""
    return fit_text(text, limit, sized=sized)


def failure_detail(exc: BaseException) -> str:
    """What an unexpected failure's reply says: the exception's message, or its class name when
    it has none (``RuntimeError()``) or its ``__str__`` raises. One process and ``--workers``
    answer the same failure with the same detail (workers answered an empty one)."""
    try:
        said = str(exc)
    except Exception:  # its own __str__ raised; we are already answering a failure
        said = ""
    return said or type(exc).__name__


class ParticipantCallError(CkptEventsError):
    """A control call failed: the participant refused it, or its reply was not usable."""

    def __init__(
        self, url: str, message: str, *, raw_code: str | None = None, status: int | None = None
    ) -> None:
        self.url = url
        self.raw_code = raw_code
        try:
            self.code: ErrorCode | None = None if raw_code is None else coerce(ErrorCode, raw_code)
        except UnknownNameError:
            self.code = None
        self.status = status
        # A reply's text can echo what the call sent (a proxy's page showing the Authorization
        # header) and a URL can hold a password: this text is logged, printed and recorded on
        # spans, so it goes through the redaction rule here, once, for all of them.
        self.detail = fitted_detail(message, DETAIL_CHARS)
        where = " ".join(str(p) for p in (status, raw_code) if p) or "error"
        super().__init__(f"{_RULE.redact_message(url)}: {where}: {self.detail}")


class ParticipantUnreachable(ParticipantCallError):
    """The call got no HTTP reply (connection refused or reset, timeout). ``reached``: a
    connection was made and the request sent or being sent, but no whole reply came back (a read
    timeout, the connection closed mid-reply): the participant was there, so it is not said to
    be unreachable."""

    def __init__(self, url: str, message: str, *, reached: bool = False) -> None:
        super().__init__(url, message)
        self.reached = reached


class CoordinationError(CkptEventsError):
    """A coordinated operation failed on some participants: ``failures`` maps name to message;
    ``silent`` names those of them whose call got no whole answer (``ParticipantUnreachable``),
    which an abort resumes apart from the stages, so they hold no other participant closed.

    Each message is redacted and cut at about 2,500 characters (its size said; a participant's
    detail in it at ``DETAIL_CHARS``); the exception's own message names the first 16 members
    in name order, each said in at most 500 characters."""

    def __init__(self, operation: str, failures: Mapping[str, str], *, silent: Iterable[str] = ()) -> None:
        self.operation = operation
        self.failures = {name: fitted_detail(msg, _FAILURE_CHARS) for name, msg in failures.items()}
        self.silent = frozenset(silent)
        named = sorted(self.failures.items())
        parts = "; ".join(
            f"{name}: {fitted_detail(msg, _SAID_CHARS, sized=False)}" for name, msg in named[:_SAID_MEMBERS]
        )
        more = len(named) - _SAID_MEMBERS
        if more > 0:
            parts += f"; and {more:,} more member{'' if more == 1 else 's'}"
        super().__init__(f"{operation} failed: {parts}")


class CheckpointNotPrepared(CkptEventsError):
    """Prepare stopped at a stage that was not ready; everyone was resumed (the checkpoint aborted)."""

    def __init__(self, result: PrepareOutcome) -> None:
        self.result = result
        stage = str(result.stopped_at) if result.stopped_at is not None else "?"
        # In words as ``cli.words.counted`` says them (this module imports only the core).
        blockers = result.blocker_count()
        super().__init__(
            f"checkpoint {result.checkpoint_id} not prepared: stopped at stage {stage} "
            f"with {blockers:,} blocker{'' if blockers == 1 else 's'}"
        )


class RolloutRetired(CkptEventsError):
    """The participants fenced this attempt (``stale_attempt``): another attempt owns the rollout."""


class RunDirectoryError(CkptEventsError):
    """A run directory is not this run's to use; the message says why and what to do."""


class RunDirectoryInUse(RunDirectoryError):
    """Another fleet holds the run directory's lock; ``holder`` is what it wrote there (run id,
    pid, host), or ``""`` if unreadable."""

    def __init__(self, message: str, *, holder: str) -> None:
        self.holder = holder
        super().__init__(message)


class ForeignCheckpoint(RunDirectoryError):
    """A checkpoint that belongs to another run (``run_id``); it is not restored, nor pruned."""

    def __init__(self, message: str, *, checkpoint_id: str, run_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.run_id = run_id
        super().__init__(message)


# -- command line ------------------------------------------------------------------------------


class CommandLineError(Exception):
    """The root of the command line's errors: ``ckpt-events`` prints one line and exits non-zero.

    Not a ``CkptEventsError``: these are verdicts of the harness's commands, never raised by the
    library a user's server imports."""


class CommandError(CommandLineError):
    """A usage or setup problem, reported as one line on stderr with exit status 2."""


class LaunchError(CommandLineError, RuntimeError):
    """A server process did not come up (it exited, or did not listen in time)."""


class Interrupted(KeyboardInterrupt):
    """A stop signal ended a command: ``signum`` the one that started the stop (SIGINT, SIGTERM),
    reported as a shell reports a process it ended (exit 128 + ``signum``: 130, 143); ``cut``,
    when a later signal forced the exit, what that cut short, else ``None``; ``stopped``, what
    the stop itself cut short before (a server's graceful-shutdown deadline), else ``None``."""

    def __init__(self, signum: int, cut: str | None = None, stopped: str | None = None) -> None:
        super().__init__(signum, cut, stopped)
        self.signum = signum
        self.cut = cut
        self.stopped = stopped


class DemoFailed(CommandLineError):
    """The run finished but its result is wrong (a rollout lost, run twice, or a wrong attempt)."""
