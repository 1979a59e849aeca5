"""A controller's stalled operation is counted against the participant it waited on, once
(``participants.cli.report.stall_blame``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpt_events import OperationFinished, OperationStarted, Stalled
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.stall_blame import MAX_KEPT, UNKNOWN_HOLDER, WAITING, StallBlame
from ckpt_events.participants.cli.report.timeline import counts
from ckpt_events.sinks import read_events
from ckpt_events.vocab import Kind, Operation, Phase

#: The aborted checkpoint of a real ``demo --fault stall --watch --rollouts 60`` run (its trace,
#: 23 lines): the controller's StallWatch counted its prepare stalled 0.5 s in, while
#: environment-0's prepare, stuck, was open (counted stalled too).
DEMO_STALL = Path(__file__).parent / "data" / "demo-fault-stall-checkpoint.jsonl"
S = 10**9


def _stalled(kind: str, instance: str, at_s: float, age_s: float = 0.5) -> Stalled:
    return Stalled(kind, instance, int(at_s * S), Operation.PREPARE, age_s, Phase.PREPARING, "c1")


def _prepare(
    instance: str, start_s: float, end_s: float | None
) -> list[OperationStarted | OperationFinished]:
    started = OperationStarted(
        Kind.ENVIRONMENT, instance, 1, 7, int(start_s * S), Operation.PREPARE, checkpoint_id="c1"
    )
    if end_s is None:
        return [started]
    finished = OperationFinished(
        Kind.ENVIRONMENT,
        instance,
        1,
        7,
        int(start_s * S),
        int(end_s * S),
        Operation.PREPARE,
        checkpoint_id="c1",
    )
    return [started, finished]


def test_the_demos_stall_is_counted_once_against_environment_0(capsys: pytest.CaptureFixture[str]) -> None:
    """The recorded demo: ``stalled`` counts environment/prepare once; the controller's prepare
    waits on environment-0 (was: ``stalled controller/prepare 1`` beside it, two stalls)."""
    events = [e for _, e in read_events(DEMO_STALL)]
    stalls = [e for e in events if isinstance(e, Stalled)]
    assert sorted(e.kind for e in stalls) == ["controller", "environment"]  # the log holds both
    tallies = counts(events)
    assert tallies["stalled"] == {"environment/prepare": 1}
    assert tallies[WAITING] == {"controller/prepare on environment/environment-0": 1}
    assert main(["report", str(DEMO_STALL)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"stalled +environment/prepare +1", out), out
    assert re.search(r"waiting +controller/prepare on environment/environment-0 +1", out), out
    assert not re.search(r"stalled +controller", out), out


def test_a_controller_with_nothing_in_flight_is_the_one_stalled() -> None:
    """Its checkpoint's calls all answered before the stall was reported: the controller stalled."""
    events = [*_prepare("environment-0", 1.0, 1.2), _stalled(Kind.CONTROLLER, "coordination", 2.0, 1.1)]
    tallies = counts(events)
    assert tallies["stalled"] == {"controller/prepare": 1}
    assert WAITING not in tallies


def test_a_call_still_open_at_the_end_of_the_logs_holds_the_controller() -> None:
    """A participant's prepare never finished in the logs (its server killed): the controller waited
    on it, whatever the order the events come in."""
    events = [_stalled(Kind.CONTROLLER, "coordination", 2.0), *_prepare("environment-1", 1.6, None)]
    assert counts(events) == {WAITING: {"controller/prepare on environment/environment-1": 1}}


def test_a_participants_stall_alone_names_it() -> None:
    """Only the participant's ``Stalled`` (its spans in a log not given) shows it open then."""
    events = [
        _stalled(Kind.ENVIRONMENT, "environment-0", 2.1, 0.6),
        _stalled(Kind.CONTROLLER, "coordination", 2.0),
    ]
    tallies = counts(events)
    assert tallies["stalled"] == {"environment/prepare": 1}
    assert tallies[WAITING] == {"controller/prepare on environment/environment-0": 1}


def test_without_its_calls_in_the_logs_whom_it_waited_on_is_unknown() -> None:
    """The controller's log alone: never a stall of the controller, never a made-up holder."""
    tallies = counts([_stalled(Kind.CONTROLLER, "coordination", 2.0)])
    assert tallies == {WAITING: {f"controller/prepare on {UNKNOWN_HOLDER}": 1}}


def test_the_calls_kept_are_bounded_and_a_forgotten_checkpoints_stall_is_unknown() -> None:
    """200,000 participant operations were kept to judge by: a report of participants' logs
    alone grew 61 -> 94 MiB (the flood test). Past ``MAX_KEPT`` the checkpoints first seen
    longest ago are forgotten: a controller's stall of one is unknown (never a stall), one of a
    recent checkpoint is still judged."""
    blame = StallBlame()
    checkpoints = MAX_KEPT // 2 + 10  # two calls each: past the bound
    for n in range(checkpoints):
        for span in (2 * n, 2 * n + 1):
            start = OperationStarted(
                Kind.ENVIRONMENT, "environment-0", 1, span, n * S, Operation.PREPARE, f"c{n}"
            )
            blame.add(start)
            end = OperationFinished(
                Kind.ENVIRONMENT, "environment-0", 1, span, n * S, n * S + 10, Operation.PREPARE, f"c{n}"
            )
            blame.add(end)
    assert blame.kept <= MAX_KEPT and sum(len(c) for c in blame.calls.values()) == blame.kept
    for cid, at in (("c0", 0), (f"c{checkpoints - 1}", checkpoints - 1)):
        blame.add(
            Stalled(Kind.CONTROLLER, "controller", at * S + 5, Operation.PREPARE, 0.5, Phase.PREPARING, cid)
        )
    stalled, waiting = blame.result()
    # c0 forgotten: unknown; the recent one's call was open at its stall: it waited on it.
    assert waiting == {
        f"controller/prepare on {UNKNOWN_HOLDER}": 1,
        "controller/prepare on environment/environment-0": 1,
    }
    assert stalled == {}


def test_logs_without_a_controllers_coordination_keep_no_call() -> None:
    """Participants' logs alone (the report's ``whole`` pass): no call is kept (the pass's
    memory grew with the logs: the flood test's 61 -> 69 MiB, over its bound) and a controller's
    stall there is unknown, never judged."""
    blame = StallBlame(keep_calls=False)
    for event in _prepare("environment-0", 1.0, None):
        blame.add(event)
    blame.add(_stalled(Kind.CONTROLLER, "controller", 2.0))
    assert blame.kept == 0 and not blame.calls
    assert blame.result() == ({}, {f"controller/prepare on {UNKNOWN_HOLDER}": 1})
