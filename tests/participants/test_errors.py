"""The error trees (the library's, the command line's) drawn in participants.errors; bad arguments typed."""

from __future__ import annotations

import ast
import importlib
import inspect
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
from ckpt_events.participants.controller import ControlClient, Coordinator
from ckpt_events.participants.controller.run_directory import RunDir
from ckpt_events.participants.controller.types import PrepareResult
from ckpt_events.participants.protocol import EpisodeId, PrepareRequest
from ckpt_events.participants.server import create_inference_app
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
    the library never catches a demo's verdict)."""
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
    library = found - command_line
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
    """participants.errors imports nothing of ours but the core's public modules (ckpt_events and
    ckpt_events.vocab), not even for the type checker."""
    tree = ast.parse(Path(participants.errors.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    ours = {m for m in modules if m.split(".")[0] in ("ckpt_events", "sinks", "participants", "benchmarks")}
    assert ours == {"ckpt_events", "ckpt_events.vocab"}


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
