"""Kinds and steps are the user's: ``Telemetry(kind="judge")`` and ``op.step("upload")``, on and off."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import (
    CheckpointEvent,
    CoordinateFinished,
    InvalidTypeError,
    InvalidValueError,
    OperationFinished,
    StageFinished,
    StepFinished,
    StepStarted,
    Telemetry,
)
from ckpt_events.benchmarks.allocount import NOTHING, AllocCounterUnavailable, build, calls_per_run
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind, Step, span_name_of

RULE = r"1-64 characters of a-z, 0-9, '_' and '-', starting with a letter or digit"


async def test_a_judge_commits_with_an_upload_step() -> None:
    """The judge's commit and its upload step are events of kind ``judge`` (a plain str), the
    step a child of the operation, with its records and bytes."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        assert tel.kind == "judge" and type(tel.kind) is str and "judge" in repr(tel)
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("upload") as step:
                step.set(records=2, bytes=10)
    started = next(e for e in events if isinstance(e, StepStarted))
    finished = next(e for e in events if isinstance(e, StepFinished))
    operation = next(e for e in events if isinstance(e, OperationFinished))
    assert (started.kind, started.step) == ("judge", "upload")
    assert (finished.kind, finished.step, finished.records, finished.bytes) == ("judge", "upload", 2, 10)
    assert finished.parent_span_id == operation.span_id and operation.kind == "judge"
    assert span_name_of(finished) == "gym.checkpoint.upload"
    assert span_name_of(operation) == "gym.checkpoint.commit"


async def test_a_users_kind_is_a_prepare_stage_and_a_stopping_point() -> None:
    """``coordinate(...).stage("judge")`` is ``gym.checkpoint.coordinate.prepare.judge``, and
    ``stopped_at="judge"`` is kept as given."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind=Kind.CONTROLLER, instance="coordination")
        with ctl.coordinate("prepare", checkpoint_id="c1") as co:
            with co.stage("judge"):
                pass
            co.set(prepared=False, stopped_at="judge")
    stage = next(e for e in events if isinstance(e, StageFinished))
    coordinate = next(e for e in events if isinstance(e, CoordinateFinished))
    assert stage.stage == "judge" and span_name_of(stage) == "gym.checkpoint.coordinate.prepare.judge"
    assert coordinate.stopped_at == "judge"


def test_a_users_names_decode_from_json_as_plain_strings() -> None:
    """An event of kind ``judge`` with step ``upload`` round-trips through JSON; the constants'
    names decode as plain strings too, equal to their members."""
    event = StepFinished("judge", "judge-0", 1, 2, 3, 4, "upload", "c1", records=5)
    back = msgspec.json.decode(msgspec.json.encode(event), type=CheckpointEvent)
    assert back == event and type(back.kind) is str
    live = StepFinished(Kind.MODEL, "model-0", 1, 2, 3, 4, Step.WRITE)
    decoded = msgspec.json.decode(msgspec.json.encode(live), type=CheckpointEvent)
    assert decoded == live and decoded.kind == Kind.MODEL and decoded.step == Step.WRITE
    assert type(decoded.kind) is str


@pytest.mark.parametrize("bad", ["Judge!", "j" * 65, "", "-judge", "judge kind"])
def test_a_bad_kind_is_one_clear_value_error(bad: str) -> None:
    """A kind of the wrong shape names the value and the rule."""
    with pytest.raises(InvalidValueError, match=RULE) as caught:
        Telemetry(None, kind=bad, instance="j0")
    assert repr(bad) in str(caught.value)


@pytest.mark.parametrize("wrong", [3, None, b"judge", ("judge",)])
def test_a_kind_that_is_not_a_str_is_a_type_error(wrong: object) -> None:
    """A kind that is not a ``str`` is an ``InvalidTypeError`` naming the value and the rule."""
    with pytest.raises(InvalidTypeError, match="participant kind must be a str"):
        Telemetry(None, kind=wrong, instance="j0")  # type: ignore[arg-type]


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
async def test_a_bad_step_fails_whether_or_not_telemetry_is_on(enabled: bool) -> None:
    """A step or stage of the wrong shape fails on the off path too; a good one works on both."""
    async with capture_events(interests=None if enabled else [CoordinateFinished]) as (bus, _):
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with tel.operation("commit") as op:
            with op.step("upload"):
                pass
            with pytest.raises(InvalidValueError, match=r"invalid step 'Upload!'"):
                op.step("Upload!")
            with pytest.raises(InvalidValueError, match=RULE):
                op.step("u" * 65)
            with pytest.raises(InvalidTypeError, match="a step must be a str"):
                op.step(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match=r"invalid participant kind 'Judge!'"):
            tel.coordinate("prepare").stage("Judge!")


def test_a_users_step_on_the_off_path_allocates_nothing() -> None:
    """With no sink, ``op.step("upload")`` is the shared no-op after one dict lookup, like a
    constant's step: no allocation beyond the ``with`` statements themselves."""
    try:
        build()
    except AllocCounterUnavailable as exc:  # no C compiler on this machine
        pytest.skip(str(exc))
    tel = Telemetry(None, kind="judge", instance="judge-0")

    def site() -> None:
        with tel.operation("commit") as op:
            with op.step("upload"):
                pass

    def baseline() -> None:
        with NOTHING:
            with NOTHING:
                pass

    site()  # the first use checks the name once and remembers it
    assert calls_per_run(site, baseline) == 0
