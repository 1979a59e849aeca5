"""The error trees (the library's, the command line's) drawn in participants.errors; bad arguments typed."""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import ckpt_events
import ckpt_events.participants.errors
from ckpt_events import (
    Bus,
    CkptEventsError,
    InvalidArgumentError,
    InvalidTypeError,
    InvalidValueError,
    Telemetry,
    participants,
    sinks,
)
from ckpt_events.participants import create_app
from ckpt_events.participants.controller import Collection, ControlClient, Coordinator, Member
from ckpt_events.participants.controller.run_directory import RunDir
from ckpt_events.participants.controller.types import PrepareResult
from ckpt_events.participants.errors import check_int, check_number
from ckpt_events.participants.protocol import EpisodeId, PrepareRequest
from ckpt_events.participants.server import create_inference_app
from ckpt_events.participants.server.connection_guard import ConnectionLimits
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.vocab import Kind

#: Walked on their own (participants, sinks) or not at all (the benchmarks import optional peers).
_NOT_THE_CORE = ("ckpt_events.sinks", "ckpt_events.participants", "ckpt_events.benchmarks")


def _modules(package: ModuleType) -> list[ModuleType]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if package is ckpt_events and info.name.startswith(_NOT_THE_CORE):
            continue
        found.append(importlib.import_module(info.name))
    return found


def _exceptions(*packages: ModuleType) -> set[type[BaseException]]:
    names = tuple(p.__name__ for p in packages)
    return {
        value
        for package in packages
        for module in _modules(package)
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith(names)
    }


def test_every_participants_exception_derives_from_one_of_the_two_roots():
    """Each exception class defined in participants is a CkptEventsError, except the command line's,
    which are CommandLineErrors and never CkptEventsErrors (a user's ``except CkptEventsError`` around
    the library never catches a demo's verdict). ``Interrupted`` is neither: a stop signal, a
    ``KeyboardInterrupt`` that no ``except Exception`` swallows."""
    errors = participants.errors
    found = _exceptions(participants)
    assert errors.ProtocolRefusal in found
    command_line = {c for c in found if issubclass(c, errors.CommandLineError)}
    assert {c.__name__ for c in command_line} == {
        "CommandLineError",
        "CommandError",
        "LaunchError",
        "DemoFailed",
    }
    assert {c.__qualname__ for c in command_line if issubclass(c, CkptEventsError)} == set()
    assert issubclass(errors.Interrupted, KeyboardInterrupt)
    assert not issubclass(errors.Interrupted, Exception)
    library = found - command_line - {errors.Interrupted}
    assert {c.__qualname__ for c in library if not issubclass(c, CkptEventsError)} == set()


def test_the_docstring_draws_every_exception_of_the_project():
    """participants.errors' docstring names every exception class of ckpt_events, sinks and participants."""
    doc = participants.errors.__doc__ or ""
    found = _exceptions(ckpt_events, sinks, participants)
    assert {c.__name__ for c in found if c.__name__ not in doc} == set()


def test_protocol_refusal_and_call_error_are_apart():
    """The server's refusal and the client's call error are different classes with different names."""
    refusal, call = participants.errors.ProtocolRefusal, participants.errors.ParticipantCallError
    assert not issubclass(refusal, call) and not issubclass(call, refusal)


def test_a_coordination_error_keeps_every_member_bounded_and_redacted():
    """A failure built from any text (discovery's, a user's) kept it whole and verbatim: a
    1,000,047-character message holding ``user:password@``; each is cut and redacted now, and
    the message names 16 members of 256 and counts the rest."""
    text = "GET https://u:pw@h.example/ failed " + "z" * 1_000_000
    many = {f"m{i:03}": f"refused: conflict (409): Bearer tok{i}" for i in range(256)}
    error = participants.errors.CoordinationError("discover", {"model-0": text, **many}, silent=["m001"])
    said = error.failures["model-0"]
    assert said.startswith("GET https://[REDACTED]@h.example/ failed zzz") and "pw@" not in said
    assert said.endswith("... (1,000,035 characters)") and len(said) < 2600
    assert set(error.failures) == {"model-0", *many} and error.silent == {"m001"}
    assert error.failures["m200"] == "refused: conflict (409): Bearer [REDACTED]"
    message = str(error)
    assert message.startswith("discover failed: m000: refused: conflict (409): Bearer [REDACTED]; m001:")
    assert message.endswith("; and 241 more members") and len(message) < 2000 and "tok" not in message


def _telemetry(kind: Kind) -> Telemetry:
    return Telemetry(Bus(), kind=kind, instance="t-0")


#: Each bad argument and the child of InvalidArgumentError it is (a ValueError or a TypeError).
BAD_ARGUMENTS: dict[str, tuple[Callable[[], object], type[InvalidArgumentError]]] = {
    "empty control token": (lambda: ControlClient(""), InvalidValueError),
    "coordinator not reporting as controller": (
        lambda: Coordinator((), token="t", telemetry=_telemetry(Kind.AGENT)),
        InvalidValueError,
    ),
    "unknown workload option": (
        lambda: create_app("agent", instance="a-0", token="t", step_seconds=1.0),
        InvalidTypeError,
    ),
    "inference worker without a token": (lambda: create_inference_app(token=""), InvalidValueError),
    "unsafe run directory checkpoint id": (lambda: RunDir("run").checkpoint_dir("../up"), InvalidValueError),
    "rollout id shaped like a capture key": (lambda: EpisodeId("r1-a2"), InvalidValueError),
    "deadline that is not finite": (
        lambda: PrepareRequest(checkpoint_id="c1", deadline_ts=float("nan")),
        InvalidValueError,
    ),
    "no worker processes": (lambda: WorkerCoordinator(0), InvalidValueError),
    "worker count as a string": (lambda: WorkerCoordinator("2"), InvalidTypeError),
    "instance name with a slash": (lambda: create_app("agent", instance="a/0", token="t"), InvalidValueError),
    "instance name not a string": (lambda: create_app("agent", instance=0, token="t"), InvalidTypeError),
    "body limit of zero": (
        lambda: create_app("agent", instance="a-0", token="t", max_body_bytes=0),
        InvalidValueError,
    ),
    "lease grace as a string": (
        lambda: create_app("agent", instance="a-0", token="t", lease_grace_seconds="5"),
        InvalidTypeError,
    ),
    "worker count as a bool": (lambda: WorkerCoordinator(True), InvalidTypeError),
    "body limit as a bool": (
        lambda: create_app("agent", instance="a-0", token="t", max_body_bytes=True),
        InvalidTypeError,
    ),
    "lease grace without end": (
        lambda: create_app("agent", instance="a-0", token="t", lease_grace_seconds=math.inf),
        InvalidValueError,
    ),
    "connection cap as a float": (lambda: ConnectionLimits(max_connections=2.5), InvalidTypeError),
    "header timeout of NaN": (lambda: ConnectionLimits(header_timeout=math.nan), InvalidValueError),
    "no steps per rollout": (
        lambda: Collection(
            Coordinator(
                [Member("model-0", "model", "model-0", "http://127.0.0.1:9")],
                token="t",
                telemetry=_telemetry(Kind.CONTROLLER),
            ),
            "run",
            telemetry=_telemetry(Kind.CONTROLLER),
            rollouts=1,
            steps=0,
        ),
        InvalidValueError,
    ),
}


@pytest.mark.parametrize(("call", "child"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_raise_invalid_argument_error(call, child):
    """A bad argument anywhere in participants raises the right child of InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert type(info.value) is child


async def test_retire_and_forget_need_ids():
    """The coordinator refuses an empty retire or forget with InvalidArgumentError."""
    async with Coordinator((), token="t", telemetry=_telemetry(Kind.CONTROLLER)) as coordinator:
        with pytest.raises(InvalidArgumentError, match="at least one episode"):
            await coordinator.retire([], checkpoint_id="c1", deadline_ts=0.0)
        with pytest.raises(InvalidArgumentError, match="at least one rollout id"):
            await coordinator.forget([], checkpoint_id="c1", deadline_ts=0.0)


def test_the_error_module_imports_only_the_core():
    """participants.errors imports nothing of ours but the core's public modules (ckpt_events,
    ckpt_events.vocab and ckpt_events.checks), not even for the type checker."""
    tree = ast.parse(Path(participants.errors.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    ours = {m for m in modules if m.split(".")[0] in ("ckpt_events", "sinks", "participants", "benchmarks")}
    assert ours == {"ckpt_events", "ckpt_events.vocab", "ckpt_events.checks"}


def test_nothing_raises_the_root_of_bad_arguments():
    """No module raises InvalidArgumentError itself: a bad value is an InvalidValueError (a ValueError),
    a wrong type an InvalidTypeError (a TypeError), so callers can catch either builtin."""
    root = Path(ckpt_events.__file__).resolve().parents[1]
    bare = []
    for package in ("ckpt_events", "sinks", "participants", "benchmarks"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Raise)
                    and isinstance(node.exc, ast.Call)
                    and ast.unparse(node.exc.func).endswith("InvalidArgumentError")
                ):
                    bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert bare == []


def test_a_prepare_result_is_a_prepare_outcome():
    """CheckpointNotPrepared keeps the controller's PrepareResult whole (typed by shape, not by import)."""
    result = PrepareResult("c1", False, Kind.MODEL, {})
    error = participants.errors.CheckpointNotPrepared(result)
    assert error.result is result
    assert str(error) == "checkpoint c1 not prepared: stopped at stage model with 0 blockers"


def test_every_protocol_code_has_its_http_status() -> None:
    """HTTP_STATUS (the harness's rule, not the core's) gives each ErrorCode the protocol's status,
    and a refusal answers with it."""
    from ckpt_events.participants.errors import HTTP_STATUS, ProtocolRefusal
    from ckpt_events.vocab import ErrorCode

    assert {code.value: HTTP_STATUS[code] for code in ErrorCode} == {
        "checkpoint_error": 409,
        "stale_checkpoint": 409,
        "checkpoint_conflict": 409,
        "invalid_phase": 409,
        "deadline_exceeded": 409,
        "stale_attempt": 409,
        "admission_closed": 409,
        "restart_in_scope": 409,
        "rollout_id_required": 400,
        "unauthorized": 401,
        "invalid_checkpoint_state": 422,
        "checkpoint_coordinator_unavailable": 503,
    }
    assert ProtocolRefusal("unauthorized", "no token").status == 401


@pytest.mark.parametrize(
    ("value", "child"),
    [(True, InvalidTypeError), (1.0, InvalidTypeError), ("2", InvalidTypeError), (None, InvalidTypeError)]
    + [(0, InvalidValueError), (-5, InvalidValueError)],
)
def test_check_int_refuses_a_non_int_by_type_and_a_small_one_by_value(value: object, child: type) -> None:
    """A bool, a float or a string is the wrong type, an int below ``minimum`` a wrong value; both
    carry the caller's message as it is."""
    with pytest.raises(child) as info:
        check_int(value, "workers must be an int >= 1", minimum=1)
    assert type(info.value) is child and str(info.value) == "workers must be an int >= 1"


def test_check_int_gives_back_an_int_at_or_above_its_minimum() -> None:
    """An int at or above ``minimum`` (0 unless given, negative allowed) is given back as it is."""
    assert check_int(0, "m") == 0
    assert check_int(7, "m", minimum=7) == 7
    assert check_int(-3, "m", minimum=-3) == -3


@pytest.mark.parametrize(
    ("value", "child"),
    [(True, InvalidTypeError), ("5", InvalidTypeError), (None, InvalidTypeError)]
    + [(0, InvalidValueError), (-1.5, InvalidValueError), (math.nan, InvalidValueError)]
    + [(10.5, InvalidValueError), (math.inf, InvalidValueError)],
)
def test_check_number_refuses_a_non_number_by_type_and_out_of_range_by_value(
    value: object, child: type
) -> None:
    """A bool or a string is the wrong type; out of ``(low, high]`` (NaN is in no range) a wrong value."""
    with pytest.raises(child) as info:
        check_number(value, "grace must be in (0, 10]", low=0, high=10, low_open=True)
    assert type(info.value) is child and str(info.value) == "grace must be in (0, 10]"


def test_check_number_gives_back_a_float_in_range() -> None:
    """A number in range comes back as a float; ``low`` is in the range unless ``low_open``, and
    the default range ``[0, inf]`` takes infinity (a limit that is no limit)."""
    assert check_number(3, "n") == 3.0 and type(check_number(3, "n")) is float
    assert check_number(0, "n") == 0.0
    assert check_number(math.inf, "n") == math.inf
    with pytest.raises(InvalidValueError):
        check_number(0, "n", low_open=True)


def test_the_harness_checks_with_the_librarys_public_pair() -> None:
    """One rule: the checks the harness imports with its errors are ``ckpt_events.checks``'s."""
    import ckpt_events.checks

    assert check_int is ckpt_events.checks.check_int
    assert check_number is ckpt_events.checks.check_number
