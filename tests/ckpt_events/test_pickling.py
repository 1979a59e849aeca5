"""Our objects across processes: pickle (every protocol), ``copy.copy`` and ``copy.deepcopy``.

Exceptions travel back from a worker process pickled, events and stats are pickled and copied,
and a bus, its ``Telemetry`` and a live span handle belong to the process that made them. The
classes are read from the public ``__all__`` lists, so a new public exception or Struct is
covered (or the guard tests ask for a sample of it).
"""

from __future__ import annotations

import copy
import inspect
import multiprocessing
import pickle
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ckpt_events
from ckpt_events import (
    Bus,
    CheckpointEvent,
    InvalidTypeError,
    SpanNotStartedError,
    Telemetry,
    UnknownNameError,
)
from ckpt_events import sinks as sinks_package
from ckpt_events._span_base import _SpanBase
from ckpt_events.participants import errors as participant_errors
from ckpt_events.participants.controller.types import PrepareResult
from ckpt_events.participants.protocol import PrepareReply, PrepareReport
from ckpt_events.sinks import JsonLinesSink, configure, read_events, read_otel_env, replay
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import ErrorCode, Operation, Phase, coerce
from tests.ckpt_events.strategies import event_strategy

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)
_MODULES = (ckpt_events, sinks_package, participant_errors)


def _public(base: type) -> list[type]:
    """The classes derived from ``base`` named in the ``__all__`` of ``_MODULES``."""
    found = {
        value
        for module in _MODULES
        for name in module.__all__
        if inspect.isclass(value := getattr(module, name)) and issubclass(value, base)
    }
    return sorted(found, key=lambda cls: cls.__name__)


def _raised(call: Callable[[], object]) -> BaseException:
    """What ``call`` raises (it must raise)."""
    try:
        call()
    except BaseException as exc:  # noqa: BLE001  # the exception is the sample
        return exc
    raise AssertionError(f"{call} did not raise")


def _prepare_stopped() -> PrepareResult:
    report = PrepareReport(ready=False, blockers=["env-0/e1"], blocker_count=1)
    return PrepareResult(
        "c1", False, "environment", {"env-0": PrepareReply(phase=Phase.PREPARING, report=report)}
    )


# How the library raises each exception whose __init__ takes arguments of its own (the raise
# sites: _vocab.coerce, _span_base._not_started, participants' server and controller). The
# others are raised with a message alone, which ``_sample`` passes.
RAISED: dict[str, Callable[[], BaseException]] = {
    "UnknownNameError": lambda: _raised(lambda: coerce(Operation, "comit")),
    "SpanNotStartedError": lambda: SpanNotStartedError("OperationSpan", "commit"),
    "ProtocolRefusal": lambda: participant_errors.ProtocolRefusal(
        ErrorCode.ADMISSION_CLOSED, "a checkpoint is open: retry after it resumes"
    ),
    "MalformedRequest": lambda: participant_errors.MalformedRequest("body is not valid JSON: x"),
    "EpisodeGone": lambda: participant_errors.EpisodeGone(
        "e1", "episode e1 was lost with worker 2: start it again"
    ),
    "CheckpointStoreError": lambda: participant_errors.CheckpointStoreError("records file missing"),
    "InvalidCheckpointError": lambda: participant_errors.InvalidCheckpointError(
        "runs/a/c1 does not exist: no checkpoint of environment env-0 was committed there"
    ),
    "WriteStopped": lambda: participant_errors.WriteStopped("resume ran during the write: not published"),
    "CheckpointWriteError": lambda: participant_errors.CheckpointWriteError(
        "writing records: [Errno 28] No space left on device", published=False
    ),
    "ParticipantCallError": lambda: participant_errors.ParticipantCallError(
        "http://127.0.0.1:9/checkpoint/commit", "attempt 2 is stale", raw_code="stale_attempt", status=409
    ),
    "ParticipantUnreachable": lambda: participant_errors.ParticipantUnreachable(
        "http://127.0.0.1:9/checkpoint/prepare", "ReadTimeout", reached=True
    ),
    "CoordinationError": lambda: participant_errors.CoordinationError(
        "commit", {"env-0": "409 checkpoint_error: disk full"}, silent=["model-0"]
    ),
    "CheckpointNotPrepared": lambda: participant_errors.CheckpointNotPrepared(_prepare_stopped()),
    "RunDirectoryInUse": lambda: participant_errors.RunDirectoryInUse(
        "run directory runs/a is in use by pid 12", holder="run-1 12 host"
    ),
    "ForeignCheckpoint": lambda: participant_errors.ForeignCheckpoint(
        "checkpoint c1 belongs to run run-2", checkpoint_id="c1", run_id="run-2"
    ),
    "Interrupted": lambda: participant_errors.Interrupted(
        15,
        "2 requests in flight were cut (POST /work/start x2)",
        stopped="at the 2 s shutdown deadline, 1 request in flight was cut (POST /work/advance)",
    ),
}
EXCEPTIONS = _public(BaseException)


def _own_init(cls: type[BaseException]) -> bool:
    return any("__init__" in vars(c) for c in cls.__mro__ if c.__module__ != "builtins")


def _sample(name: str) -> BaseException:
    """An instance of the public exception class ``name``, as the library raises it."""
    if name in RAISED:
        return RAISED[name]()
    cls = next(c for c in EXCEPTIONS if c.__name__ == name)
    return cls(f"{name}: what went wrong, and what to do")


def _same(copied: BaseException, original: BaseException) -> None:
    assert type(copied) is type(original)
    assert str(copied) == str(original) and copied.args == original.args
    assert vars(copied) == vars(original)


def test_every_exception_with_arguments_of_its_own_has_a_sample() -> None:
    """A public exception whose __init__ takes its own arguments is built here as it is raised."""
    assert len(EXCEPTIONS) >= 20
    missing = [c.__name__ for c in EXCEPTIONS if _own_init(c) and c.__name__ not in RAISED]
    assert missing == [], f"add how the library raises {missing} to RAISED"
    assert set(RAISED) <= {c.__name__ for c in EXCEPTIONS}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", [c.__name__ for c in EXCEPTIONS])
def test_an_exception_pickles_whole(name: str, protocol: int) -> None:
    """Type, message, args and attributes survive a pickle round trip at every protocol."""
    error = _sample(name)
    error.add_note("while committing c1")
    _same(pickle.loads(pickle.dumps(error, protocol)), error)


@pytest.mark.parametrize("name", [c.__name__ for c in EXCEPTIONS])
def test_an_exception_copies_whole(name: str) -> None:
    """``copy.copy`` and ``copy.deepcopy`` give the same type, message and attributes."""
    error = _sample(name)
    _same(copy.copy(error), error)
    _same(copy.deepcopy(error), error)


def test_the_rebuilt_exception_keeps_what_its_init_derived() -> None:
    """What __init__ computed (a coerced code, a redacted detail, a status) comes back as it was."""
    refusal = pickle.loads(pickle.dumps(_sample("ProtocolRefusal")))
    assert refusal.code is ErrorCode.ADMISSION_CLOSED and refusal.status == 409
    unknown = pickle.loads(pickle.dumps(_sample("UnknownNameError")))
    assert isinstance(unknown, UnknownNameError) and unknown.name == "comit" and "commit" in unknown.valid
    prepared = pickle.loads(pickle.dumps(_sample("CheckpointNotPrepared")))
    assert prepared.result.blocker_count() == 1


def _raise_in_worker(name: str) -> None:
    raise _sample(name)


class _Workers:
    """One real worker process (spawn: a fresh interpreter that imports this module, as on
    macOS and in Ray's workers), replaced when a test broke it."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None

    def run(self, call: Callable[..., object], *args: object) -> object:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return self.pool.submit(call, *args).result(timeout=60)
        except BrokenProcessPool:
            self.close()
            raise

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None


@pytest.fixture(scope="module")
def workers() -> Iterator[_Workers]:
    pool = _Workers()
    yield pool
    pool.close()


@pytest.mark.parametrize("name", [c.__name__ for c in EXCEPTIONS])
def test_an_exception_raised_in_a_worker_process_reaches_the_parent(workers: _Workers, name: str) -> None:
    """Raised in a real worker process, the parent gets the same type and message (it was a
    ``BrokenProcessPool`` for every exception whose __init__ takes arguments of its own)."""
    expected = _sample(name)
    with pytest.raises(type(expected)) as raised:
        workers.run(_raise_in_worker, name)
    _same(raised.value, expected)


# -- events and stats ------------------------------------------------------------------------

EVENT_TYPES: tuple[type[ckpt_events.Event], ...] = typing.get_args(CheckpointEvent)


def test_every_public_event_class_is_in_the_union() -> None:
    """The event classes of ``__all__`` (but the two bases) are the ones tested below."""
    public = set(_public(ckpt_events.Event)) - {ckpt_events.Event, ckpt_events.SpanEvent}
    assert public == set(EVENT_TYPES)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_an_event_pickles_and_copies_equal(cls: type[ckpt_events.Event], data: st.DataObject) -> None:
    """Every event type: pickle (every protocol), copy and deepcopy give an equal event."""
    event = data.draw(event_strategy(cls))
    for protocol in PROTOCOLS:
        assert pickle.loads(pickle.dumps(event, protocol)) == event
    assert copy.copy(event) == event and copy.deepcopy(event) == event


async def _emitted() -> list[Any]:
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("write") as step:
                step.set_attribute("note", "x" * 100)
            op.set(records=1)
    return sink.events


def test_emitted_events_keep_their_frozen_attributes_across_a_pickle() -> None:
    """A finished span's attributes come back read-only, equal, at every protocol."""
    finished = [e for e in anyio.run(_emitted) if isinstance(e, ckpt_events.StepFinished)]
    assert len(finished) == 1
    for protocol in PROTOCOLS:
        back = pickle.loads(pickle.dumps(finished[0], protocol))
        assert back == finished[0]
        with pytest.raises(TypeError):
            back.attributes["note"] = "changed"


class _Failing:
    def handle(self, batch: list[Any]) -> None:
        raise ValueError("boom")


async def _stats(tmp_path: Path) -> list[msgspec.Struct]:
    """One of each stats Struct, from real parts: a bus with a failing sink, a JSON-lines sink,
    an export process, a replay with a corrupt line, the OpenTelemetry settings."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        bus.subscribe(_Failing())
        jsonl = JsonLinesSink(log)
        bus.subscribe(jsonl)
        configured = configure(bus, jsonl_path=tmp_path / "child.jsonl", export_process=True, environ={})
        process = configured.export_process
        assert process is not None
        with Telemetry(bus, kind="resources", instance="r0").operation("commit", checkpoint_id="c1"):
            pass
        await configured.aclose()
    with log.open("ab") as file:
        file.write(b"{not json\n")
    corrupt = [event for _, event in read_events(log) if isinstance(event, sinks_package.CorruptLine)]
    result = await replay(log, _Failing())
    return [
        bus.stats(),
        bus.stats().sink("Failing"),
        jsonl.stats(),
        process.stats(),
        corrupt[0],
        result,
        result.failed[0],
        read_otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}),
    ]


HANDLES = _public(_SpanBase)
STRUCTS = [c for c in _public(msgspec.Struct) if not issubclass(c, (ckpt_events.Event, _SpanBase))]


def test_every_public_struct_pickles_and_copies_equal(tmp_path: Path) -> None:
    """Every stats and result Struct of ``__all__`` (built by real parts, one sample each):
    pickle (every protocol), copy and deepcopy give an equal value."""
    samples = anyio.run(_stats, tmp_path)
    assert {type(s) for s in samples} == set(STRUCTS), "add a sample of each public Struct"
    assert samples[1].error == "ValueError: boom"  # type: ignore[attr-defined]
    for sample in samples:
        for protocol in PROTOCOLS:
            assert pickle.loads(pickle.dumps(sample, protocol)) == sample, type(sample).__name__
        assert copy.copy(sample) == sample and copy.deepcopy(sample) == sample


# -- what belongs to its process -------------------------------------------------------------


def _handles(tel: Telemetry) -> dict[str, Any]:
    operation = tel.operation("commit", checkpoint_id="c1")
    coordinate = tel.coordinate("prepare", checkpoint_id="c1")
    return {
        "OperationSpan": operation,
        "StepSpan": operation.step("write"),
        "CoordinateSpan": coordinate,
        "StageSpan": coordinate.stage("environment"),
        "CollectionSpan": tel.collection("checkpoint", checkpoint_id="c1"),
    }


def _refused(value: object, name: str) -> None:
    copies: list[Callable[[object], object]] = [copy.copy, copy.deepcopy]
    copies += [lambda v, p=protocol: pickle.dumps(v, p) for protocol in PROTOCOLS]
    for attempt in copies:
        with pytest.raises(InvalidTypeError, match=rf"^cannot pickle or copy '{name}' object: .* process"):
            attempt(value)


async def _bound_objects() -> list[tuple[object, str]]:
    async with Bus() as bus:
        bus.subscribe(MemorySink())
        tel = Telemetry(bus, kind="resources", instance="r0")
        off = Telemetry(None, kind="resources", instance="r1")
        live = _handles(tel)
        for handle in live.values():
            assert handle._live
        with live["OperationSpan"]:
            found = [(bus, "Bus"), (tel, "Telemetry"), (off, "Telemetry")]
            found += [(handle, name) for name, handle in live.items()]
            # the no-op twins (nothing listening) refuse alike, under their public names
            found += [(handle, name) for name, handle in _handles(off).items()]
            for value, name in found:
                _refused(value, name)
    return found


def test_a_bus_its_telemetry_and_span_handles_refuse_to_be_pickled_or_copied() -> None:
    """Each says, in one line, that it belongs to its process and what to do instead: a
    copy.copy of a Telemetry was a twin the bus never told of a new sink (it emitted nothing);
    pickled, each said "cannot pickle 'weakref.ReferenceType' object"."""
    found = anyio.run(_bound_objects)
    assert {name for _, name in found} == {"Bus", "Telemetry"} | {c.__name__ for c in HANDLES}


def test_a_telemetry_passed_to_a_worker_process_fails_there_in_one_line(workers: _Workers) -> None:
    """Submitted to a real pool, the call fails with the refusal, not a weakref's TypeError,
    and the pool goes on."""
    off = Telemetry(None, kind="resources", instance="r0")
    with pytest.raises(InvalidTypeError, match="create a Telemetry in each process"):
        workers.run(repr, off)
    assert workers.run(len, "abc") == 3
