"""A finished event's span name and attributes (``ckpt_events.sinks._span_attrs``): one rule for every
span exporter."""

from __future__ import annotations

from typing import Any

from ckpt_events import OperationFinished, Redactor, StageFinished, StepFinished
from ckpt_events._events import FINISHED_TYPES
from ckpt_events.sinks._span_attrs import FINISHED, plans_by_name, span_name_and_attributes, span_plan
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import Attr


def _events() -> list[Any]:
    with EventCapture() as capture:
        tel = capture.telemetry("agent", "agent-0", worker=2)
        ctl = capture.telemetry("controller", "coordination")
        with ctl.coordinate("prepare", checkpoint_id="c1") as coordinate, coordinate.stage("judge"):
            pass
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("upload") as step:
                step.set(records=4)
            op.set(records=4)
            op.set_attribute("user.token", "hunter2")
            op.set_attribute(Attr.PARTICIPANT_KIND, "spoofed")
        tel.refused("unauthorized")
        return capture.events


def test_every_finished_class_has_a_plan_and_other_events_none() -> None:
    """Each finished event gets a name and its pairs; a started or counted event has no span."""
    events = _events()
    assert set(FINISHED) == set(FINISHED_TYPES)
    for event in events:
        plan = span_plan(event)
        assert (plan is not None) == (type(event) in FINISHED_TYPES), event
        assert (span_name_and_attributes(event, Redactor()) is None) == (plan is None)


def test_ours_win_the_users_are_redacted_and_the_worker_rides_along() -> None:
    """The operation's own attributes, the worker, a user's attribute redacted by the rule; a user
    attribute spelled like one of ours does not replace it."""
    [op] = [e for e in _events() if isinstance(e, OperationFinished)]
    name, attributes = span_name_and_attributes(op, Redactor())  # type: ignore[misc]
    assert name == "gym.checkpoint.commit"
    assert attributes[Attr.PARTICIPANT_KIND] == "agent" and type(attributes[Attr.PARTICIPANT_KIND]) is str
    assert attributes[Attr.INSTANCE] == "agent-0" and attributes[Attr.ID] == "c1"
    assert attributes[Attr.WORKER] == 2
    assert attributes["user.token"] == "[REDACTED]"


def test_a_users_step_and_stage_get_the_open_rule() -> None:
    """A step or kind the user named is spanned as gym.checkpoint.<step> and ...prepare.<kind>."""
    events = _events()
    [step] = [e for e in events if isinstance(e, StepFinished)]
    [stage] = [e for e in events if isinstance(e, StageFinished)]
    assert span_plan(step)[0] == "gym.checkpoint.upload"  # type: ignore[index]
    assert span_plan(stage)[0] == "gym.checkpoint.coordinate.prepare.judge"  # type: ignore[index]


def test_the_rule_read_backwards_names_each_span_once() -> None:
    """plans_by_name maps every known span name back to its event class and naming value."""
    by_name = plans_by_name()
    assert by_name["gym.checkpoint.commit"][:3] == (OperationFinished, "operation", "commit")
    assert len(by_name) == len({(cls, value) for cls, _, value, _ in by_name.values()})
