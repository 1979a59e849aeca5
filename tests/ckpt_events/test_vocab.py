"""The vocabularies (closed and open) and the names built from them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckpt_events import InvalidTypeError, InvalidValueError, UnknownNameError
from ckpt_events.vocab import (
    NAME_RULE,
    STAGE_SPANS,
    STEP_END_ATTRS,
    STEP_SPANS,
    Attr,
    ErrorCode,
    Kind,
    Operation,
    Step,
    attr,
    coerce,
    kind_name,
    span_name,
    step_name,
)


def test_step_parents() -> None:
    """Each of the original system's steps runs under its operation."""
    assert {s.value: s.parent.value for s in Step} == {
        "wait_ready": "prepare",
        "generation_cut": "prepare",
        "export": "commit",
        "write": "commit",
        "read": "restore",
        "install": "restore",
    }


def test_names_built_in_one_place() -> None:
    """Attribute keys and span names have the contract prefixes."""
    assert attr("records") == "nemo.gym.checkpoint.records"
    assert span_name("coordinate", "prepare", "model") == "gym.checkpoint.coordinate.prepare.model"


def test_kinds_and_steps_are_open_names_of_one_shape() -> None:
    """A kind or a step is any name of NAME_RULE's shape: a constant comes back as its member,
    a user's name as a plain str; a bad one is one error naming the value and the rule."""
    assert kind_name("model") is Kind.MODEL and step_name(Step.WRITE) is Step.WRITE
    assert kind_name("judge") == "judge" and type(kind_name("judge")) is str
    assert step_name("upload-2_b") == "upload-2_b" and kind_name("7zip") == "7zip"
    assert kind_name("a" * 64) == "a" * 64
    for bad in ("Judge!", "a" * 65, "", "-x", "_x", "up load", "é"):
        assert NAME_RULE.fullmatch(bad) is None
        with pytest.raises(InvalidValueError, match=r"invalid participant kind .*1-64 characters of a-z"):
            kind_name(bad)
        with pytest.raises(InvalidValueError, match=r"invalid step"):
            step_name(bad)
    for wrong in (3, None, b"judge", ["judge"]):
        with pytest.raises(InvalidTypeError, match="must be a str"):
            kind_name(wrong)


def test_tables_keyed_by_kind_or_step_answer_for_a_users_name() -> None:
    """STAGE_SPANS, STEP_SPANS and STEP_END_ATTRS name a user's kind and step by their rule
    (records and bytes on a step of the user's), and list the constants' entries only."""
    assert STAGE_SPANS["judge"] == "gym.checkpoint.coordinate.prepare.judge"
    assert STEP_SPANS["upload"] == "gym.checkpoint.upload"
    assert STEP_END_ATTRS["upload"] == (("records", Attr.RECORDS), ("bytes", Attr.BYTES))
    assert STEP_SPANS[Step.WRITE] == STEP_SPANS["write"] == "gym.checkpoint.write"
    assert "upload" not in STEP_SPANS and "judge" not in STAGE_SPANS
    assert set(STEP_SPANS) == set(Step) and set(STAGE_SPANS) == set(Kind)


def test_closed_vocabularies_stay_closed() -> None:
    """Operations and codes keep their typo protection."""
    with pytest.raises(UnknownNameError, match="prepare, commit"):
        coerce(Operation, "upload")
    with pytest.raises(UnknownNameError, match="stale_attempt"):
        coerce(ErrorCode, "stale")


def test_coerce_accepts_members_and_values_only() -> None:
    """coerce() takes the member or its value, and names the valid values otherwise."""
    assert coerce(Operation, "commit") is Operation.COMMIT
    assert coerce(Kind, Kind.MODEL) is Kind.MODEL
    with pytest.raises(UnknownNameError, match="environment, model, agent, resources, controller"):
        coerce(Kind, "judge")
    with pytest.raises(UnknownNameError):
        coerce(Kind, {"model"})


def test_the_instrument_table_names_every_metric_constant_once() -> None:
    """INSTRUMENTS and OPEN_WORK_INSTRUMENTS hold each METRIC_* name exactly once between them,
    with a kind, a unit and a description."""
    from ckpt_events import vocab
    from ckpt_events.vocab import INSTRUMENTS, OPEN_WORK_INSTRUMENTS, InstrumentKind

    table = INSTRUMENTS + OPEN_WORK_INSTRUMENTS
    constants = {getattr(vocab, n) for n in vocab.__all__ if n.startswith("METRIC_")}
    names = [i.name for i in table]
    assert sorted(names) == sorted(constants)
    assert all(isinstance(i.kind, InstrumentKind) and i.unit and i.description for i in table)


# In a fresh interpreter: the table of names is the process's, and other tests fill it too.
_SHARDS = """
import logging, sys
from ckpt_events import StepFinished
from ckpt_events.testing import EventCapture

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
with EventCapture() as capture:
    tel = capture.telemetry("judge", "judge-0")
    with tel.operation("commit", checkpoint_id="c1") as op:
        for shard in range(3000):
            with op.step(f"upload-{shard}"):
                pass
    print("steps", len(capture.of_type(StepFinished)))
"""


def test_a_step_named_after_an_id_is_said_once() -> None:
    """``op.step(f"upload-{shard}")`` for 3,000 shards made 3,000 span names without a word; a
    tracing backend groups spans by name. Past 1,024 distinct names one warning says so and
    how to name it (an attribute for the id), and every step is still recorded."""
    result = subprocess.run(
        [sys.executable, "-c", _SHARDS], capture_output=True, text=True, timeout=60, check=True
    )
    warnings = [line for line in result.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, result.stdout
    assert "1,024 distinct step names" in warnings[0]
    assert "set_attribute('shard', shard)" in warnings[0]
    assert "steps 3000" in result.stdout
