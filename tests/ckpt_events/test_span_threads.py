"""Span handles used from several threads at once, as a server's threadpool uses them."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    StageFinished,
    StepFinished,
    Telemetry,
)
from ckpt_events.testing import capture_events

ROUNDS = 10_000  # at most, and at most SECONDS: the double end showed about once in 500 rounds
SECONDS = 2.0


def _end_in_two_threads_at_once(handles: list[Any]) -> None:
    """Leave each handle from two threads released together by a barrier."""
    barrier = threading.Barrier(2, timeout=10)

    def leave(handle: Any) -> None:
        barrier.wait()
        handle.__exit__(None, None, None)

    for handle in handles:
        barrier.reset()
        threads = [threading.Thread(target=leave, args=(handle,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)


async def _ended_twice(open_handles: Callable[[Telemetry], list[Any]], finished: tuple[type, ...]) -> None:
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as possible, where the race is
    try:
        async with capture_events() as (bus, events):
            tel = Telemetry(bus, kind="resources", instance="r0")
            deadline = time.monotonic() + SECONDS
            rounds = handles = 0
            while rounds < ROUNDS and time.monotonic() < deadline:
                opened = open_handles(tel)
                _end_in_two_threads_at_once(opened)
                rounds += 1
                handles += len(opened)
            await bus.flush()
    finally:
        sys.setswitchinterval(switch)
    ended = [e.span_id for e in events if isinstance(e, finished)]
    assert len(ended) == len(set(ended)) == handles


async def test_a_handle_left_by_two_threads_at_once_ends_once() -> None:
    """An operation and a step left by two threads at once emit one Finished each: both
    threads found the handle live and queued it, two events with one span id."""

    def open_handles(tel: Telemetry) -> list[Any]:
        op = tel.operation("commit", checkpoint_id="c1").__enter__()
        op.set_attribute("upload", "a")  # attributes to freeze: a call, where a thread may switch
        step = op.step("upload").__enter__()
        step.set_attribute("part", 1)
        return [step, op]

    await _ended_twice(open_handles, (OperationFinished, StepFinished))


async def test_a_handle_without_attributes_left_by_two_threads_at_once_ends_once() -> None:
    """The same without attributes: nothing is called between the test that the handle is live
    and the store that ends it (no thread switch there), and it is not tested twice."""

    def open_handles(tel: Telemetry) -> list[Any]:
        op = tel.operation("commit", checkpoint_id="c1").__enter__()
        return [op.step("upload").__enter__(), op]

    await _ended_twice(open_handles, (OperationFinished, StepFinished))


async def test_a_controller_span_left_by_two_threads_at_once_ends_once() -> None:
    """A coordination or stage left by two threads at once emits one Finished."""

    def open_handles(tel: Telemetry) -> list[Any]:
        coordinate = tel.coordinate("prepare", checkpoint_id="c1").__enter__()
        coordinate.set_attribute("round", 1)
        stage = coordinate.stage("agent").__enter__()
        stage.set_attribute("round", 1)
        return [stage, coordinate]

    await _ended_twice(open_handles, (CoordinateFinished, StageFinished))


async def test_a_collection_left_by_two_threads_at_once_ends_once() -> None:
    """A collection left by two threads at once emits one Finished."""

    def open_handles(tel: Telemetry) -> list[Any]:
        collection = tel.collection("checkpoint", checkpoint_id="c1").__enter__()
        collection.set_attribute("round", 1)
        return [collection]

    await _ended_twice(open_handles, (CollectionFinished,))


async def test_a_handle_entered_by_two_threads_at_once_starts_once() -> None:
    """A handle entered by two threads at once (or again inside its own block) emits one
    Started and keeps its first start: each entry emitted a Started with the one span id, and
    the second moved the span's start, so its duration lost the time before it."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        async with capture_events() as (bus, events):
            tel = Telemetry(bus, kind="resources", instance="r0")
            kinds = [
                lambda: tel.operation("commit", checkpoint_id="c1"),
                lambda: tel.operation("commit").__enter__().step("upload"),
                lambda: tel.coordinate("prepare"),
                lambda: tel.coordinate("prepare").__enter__().stage("agent"),
                lambda: tel.collection("checkpoint"),
            ]
            handles = []
            for make in kinds:
                nested = make()
                with nested:
                    start = nested.start_ns
                    with nested:
                        assert nested.start_ns == start
                handles.append(nested)
            barrier = threading.Barrier(2, timeout=10)

            def enter(handle: Any) -> None:
                barrier.wait()
                handle.__enter__()

            deadline = time.monotonic() + SECONDS
            rounds = 0
            while rounds < ROUNDS and time.monotonic() < deadline:
                handle = kinds[rounds % len(kinds)]()
                barrier.reset()
                threads = [threading.Thread(target=enter, args=(handle,)) for _ in range(2)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(10)
                handles.append(handle)
                rounds += 1
            await bus.flush()
    finally:
        sys.setswitchinterval(switch)
    started = [e.span_id for e in events if type(e).__name__.endswith("Started")]
    assert len(started) == len(set(started))  # parents of steps and stages started too, once
    assert {h.span_id for h in handles} <= set(started)
