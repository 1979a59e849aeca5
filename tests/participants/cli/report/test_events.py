"""The events as the report reads them: every class's stamp, process and trace, read by a
``match`` on the class (or, on the reader's per-line path, an exact class test guarded here)."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StageStarted,
    Stalled,
    StepFinished,
    StepStarted,
)
from ckpt_events.participants.cli.report.clocks import shifted
from ckpt_events.participants.cli.report.events import (
    duration_ns,
    event_start,
    event_time,
    trace_of,
    what_of,
    who_wrote,
)
from ckpt_events.participants.cli.report.logs import identity
from ckpt_events.vocab import CollectionAction, Disposition, ErrorCode, Operation, Phase

#: One event of every class, each stamp a distinct value: start 10, end 20, received 15, time 30.
EVERY: list[CheckpointEvent] = [
    OperationStarted("model", "m0", 1, 2, 10, Operation.COMMIT, worker=3),
    OperationFinished("model", "m0", 1, 2, 10, 20, Operation.COMMIT, received_ns=15, worker=3),
    StepStarted("model", "m0", 1, 4, 10, "write"),
    StepFinished("model", "m0", 1, 4, 10, 20, "write"),
    CoordinateStarted("controller", "c", 1, 5, 10, Operation.PREPARE),
    CoordinateFinished("controller", "c", 1, 5, 10, 20, Operation.PREPARE),
    StageStarted("controller", "c", 1, 6, 10, "model"),
    StageFinished("controller", "c", 1, 6, 10, 20, "model"),
    CollectionStarted("controller", "c", 1, 7, 10, CollectionAction.CHECKPOINT),
    CollectionFinished("controller", "c", 1, 7, 10, 20, CollectionAction.CHECKPOINT),
    LeaseExpired("model", "m0", 30, Phase.PREPARED),
    PrepareNotReady("model", "m0", 30, 2),
    Refused("model", "m0", 30, ErrorCode.STALE_CHECKPOINT),
    GenerationCut("model", "m0", 30, Disposition.DURABLE_PREFIX, 4),
    Stalled("model", "m0", 30, Operation.COMMIT, 5.0),
]


def test_every_event_class_is_covered() -> None:
    """EVERY holds one event of each class of the union, so the tests below see them all."""
    assert {type(e) for e in EVERY} == set(CheckpointEvent.__args__)


@pytest.mark.parametrize("event", EVERY, ids=lambda e: type(e).__name__)
def test_event_time_reads_the_stamp_of_every_event_class(event: CheckpointEvent) -> None:
    """A finished span's end, a started span's start, a counted event's instant: event_time's
    exact class tests (the reader's per-line path) agree with the fields of every class."""
    fields = msgspec.structs.asdict(event)
    expected = fields.get("end_ns") or fields.get("time_ns") or fields["start_ns"]
    assert event_time(event) == expected
    assert event_start(event) == fields.get("start_ns", fields.get("time_ns"))
    assert trace_of(event) == fields.get("trace_id")


@pytest.mark.parametrize("event", EVERY, ids=lambda e: type(e).__name__)
def test_shifted_moves_every_stamp_of_every_class(event: CheckpointEvent) -> None:
    """Each wall-clock stamp moves by the offset, nothing else changes."""
    moved = msgspec.structs.asdict(shifted(event, 1000))
    for name, value in msgspec.structs.asdict(event).items():
        stamp = name in ("start_ns", "end_ns", "received_ns", "time_ns") and value is not None
        assert moved[name] == (value + 1000 if stamp else value), name


def test_identity_names_a_span_by_its_ids_and_process_and_a_counted_event_by_all_of_it() -> None:
    """Two events of one span differ by class; a counted event equal in every field is the same."""
    started, finished = EVERY[0], EVERY[1]
    assert identity(started) != identity(finished)
    assert identity(finished) == identity(msgspec.structs.replace(finished, end_ns=99))
    assert identity(finished) != identity(msgspec.structs.replace(finished, worker=4))
    refused = EVERY[12]
    assert identity(refused) == identity(msgspec.structs.replace(refused))
    assert identity(refused) != identity(msgspec.structs.replace(refused, time_ns=31))


def test_words_for_who_and_what() -> None:
    """who_wrote names the process (its worker too); what_of the operation, step, stage, action."""
    assert who_wrote(EVERY[1]) == "model/m0/w3" and who_wrote(EVERY[5]) == "controller"
    assert [what_of(e) for e in EVERY[1:10:2]] == [
        "commit",
        "write",
        "prepare",
        "prepare stage model",
        "checkpoint",
    ]
    back = msgspec.structs.replace(EVERY[1], end_ns=5)
    assert duration_ns(EVERY[1]) == 10 and duration_ns(back) is None
