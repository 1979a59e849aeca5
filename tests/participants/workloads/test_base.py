"""What every workload shares (``participants.workloads.base``): episodes advanced a boundary per unit
of work, admission, export and install as the next attempt, the fence, records checked first."""

from __future__ import annotations

import math
import random
import time
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.errors import InvalidCheckpointError, ProtocolRefusal
from ckpt_events.participants.protocol import (
    MAX_BLOCKERS,
    MAX_RETIRED_KEYS_SHOWN,
    EpisodeId,
    PrepareReport,
    RetireReply,
)
from ckpt_events.participants.workloads.agent import AgentWorkload
from ckpt_events.participants.workloads.base import RETIRE_CHUNK, Episode, RetiredKeys, Workload, finite_sleep
from ckpt_events.participants.workloads.resources import ResourcesRecord, ResourcesWorkload
from ckpt_events.vocab import ErrorCode


def _agent() -> AgentWorkload:
    return AgentWorkload(Telemetry(None, kind="agent", instance="agent-0"), turn_seconds=0)


async def test_an_episode_advances_one_boundary_per_unit_until_done() -> None:
    """start() makes the episode once; advance() moves it a boundary, and not past its steps."""
    workload = _agent()
    episode = workload.start(EpisodeId("r1"), 2)
    assert workload.start(EpisodeId("r1"), 2) is episode and episode.boundary == 0
    for _ in range(3):
        await workload.advance(EpisodeId("r1"))
    assert (episode.boundary, episode.done, episode.status) == (2, True, "idle")
    with pytest.raises(LookupError):
        await workload.advance(EpisodeId("never-started"))


async def test_closed_admission_and_a_stopped_episode_are_refused() -> None:
    """While a checkpoint is open nothing starts or advances; an exported-and-stopped episode
    takes no more work; the report counts what blocks a prepare."""
    workload = _agent()
    workload.start(EpisodeId("r1"), 3)
    workload.close_admission()
    with pytest.raises(ProtocolRefusal) as refused:
        workload.start(EpisodeId("r2"), 3)
    assert refused.value.code is ErrorCode.ADMISSION_CLOSED
    with pytest.raises(ProtocolRefusal):
        await workload.advance(EpisodeId("r1"))
    assert workload.report().ready and workload.report().counts == {"sessions": 1, "at_boundary": 1}
    workload.open_admission()
    workload.stop(["r1"])
    with pytest.raises(ProtocolRefusal, match="stopped by a checkpoint"):
        await workload.advance(EpisodeId("r1"))


async def test_export_then_install_continues_as_the_next_attempt_and_fences_the_old() -> None:
    """Records come out sorted by key; installed, each episode is attempt + 1 at the same
    boundary, and its old attempt is refused from then on."""
    source, target = _agent(), _agent()
    for rollout in ("r2", "r1"):
        source.start(EpisodeId(rollout), 3)
        await source.advance(EpisodeId(rollout))
    records = await source.export(None)
    assert [r.episode_id.rollout_id for r in records] == ["r1", "r2"]
    states = [target.check_record(record) for record in records]
    assert await target.install(records, states) == ["r1-a1", "r2-a1"]
    restored = target.get("r1-a1")
    assert restored is not None and restored.boundary == 1
    assert restored.state.history == source.episodes["r1"].state.history
    with pytest.raises(ProtocolRefusal):
        target.start(EpisodeId("r1", 0), 3)
    assert await source.export([EpisodeId("r2"), EpisodeId("absent")]) == records[1:]


def test_a_record_of_another_kind_or_an_impossible_boundary_is_refused() -> None:
    """check_record validates before anything is installed."""
    workload = _agent()
    other = ResourcesRecord(
        episode_id=EpisodeId("r1"), boundary=0, steps=1, session_id="s", counter=0, document=[]
    )
    with pytest.raises(InvalidCheckpointError, match="not a agent record"):
        workload.check_record(other)
    record = workload.record_type(
        episode_id=EpisodeId("r1"), boundary=3, steps=2, session_key="k", history=[]
    )
    with pytest.raises(InvalidCheckpointError, match="boundary 3 of 2"):
        workload.check_record(record)


def test_unknown_options_and_odd_delays() -> None:
    """An unknown option is an error naming it; a delay is clamped to [0, 60] seconds."""
    with pytest.raises(TypeError, match="unknown agent workload options: colour"):
        AgentWorkload(Telemetry(None, kind="agent", instance="agent-0"), colour="red")
    assert [finite_sleep(s) for s in (-1.0, math.nan, math.inf, 0.5, 600.0)] == [0.0, 0.0, 0.0, 0.5, 60.0]


async def test_an_install_that_raises_or_is_cancelled_inside_installing_leaves_nothing() -> None:
    """installing(): an install that put in part of its records and then raised, or was
    cancelled, leaves the episodes and the fence as they were, and the error goes on."""
    import anyio

    source, target = _agent(), _agent()
    for rollout in ("r1", "r2", "r3"):
        source.start(EpisodeId(rollout), 3)
    records = await source.export(None)
    states = [target.check_record(record) for record in records]
    target.fence.mark(EpisodeId("old", 4))
    with pytest.raises(InvalidCheckpointError, match="r3"), target.installing():
        await target.install(records[:2], states[:2])
        raise InvalidCheckpointError("r3 does not fit")
    assert (target.episodes, target.fence.snapshot()) == ({}, {"old": 4})
    with anyio.CancelScope() as scope, target.installing():
        await target.install(records[:1], states[:1])
        scope.cancel()
        await anyio.sleep(1)
    assert scope.cancelled_caught and (target.episodes, target.fence.snapshot()) == ({}, {"old": 4})
    with target.installing():
        assert await target.install(records, states) == ["r1-a1", "r2-a1", "r3-a1"]
    assert target.fence.snapshot() == {"old": 4, "r1": 0, "r2": 0, "r3": 0}


class _CountedKey(str):
    """A capture key that counts the comparisons made between keys."""

    compared = 0

    def __lt__(self, other: object) -> bool:
        _CountedKey.compared += 1
        return str.__lt__(self, other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        _CountedKey.compared += 1
        return str.__gt__(self, other)  # type: ignore[operator]


def _blocked_agent(keys: list[str], blocking: list[bool]) -> AgentWorkload:
    """An agent workload holding an episode per key, running where ``blocking`` says."""
    workload = _agent()
    for i, (key, running) in enumerate(zip(keys, blocking, strict=True)):
        episode_id = EpisodeId(f"r{i}")  # the report reads the key alone
        episode = workload.episode(episode_id, 3, 0, workload.initial_state(episode_id, 3))
        episode.key = key
        episode.status = "running" if running else "idle"
        workload.episodes[key] = episode
    return workload


def test_the_report_shows_the_same_blockers_as_a_full_sort() -> None:
    """On random keys and sizes around MAX_BLOCKERS, the shown blockers and their count are
    those of the former full sort, in its order."""
    rng = random.Random(20261204)
    for size in (0, 1, 2, MAX_BLOCKERS - 1, MAX_BLOCKERS, MAX_BLOCKERS + 1, 2 * MAX_BLOCKERS, 3000):
        for share in (0.0, 0.01, 0.5, 1.0):
            drawn = (f"{uuid.UUID(int=rng.getrandbits(128))}-a{rng.randrange(3)}" for _ in range(size))
            keys = list(set(drawn))
            blocking = [rng.random() < share for _ in keys]
            report = _blocked_agent(keys, blocking).report()
            before = sorted(k for k, b in zip(keys, blocking, strict=True) if b)
            assert report.blockers == before[:MAX_BLOCKERS], (size, share)
            assert (report.blocker_count, report.ready) == (len(before), not before)


def test_the_report_orders_only_the_shown_blockers() -> None:
    """With 20,000 blockers the report compares keys about once each (the shown 100 are kept
    in a heap), not the ~280,000 times a full sort of them does: prepare's wait runs it on
    every change of any episode."""
    rng = random.Random(7)
    count = 20_000
    keys = [_CountedKey(uuid.UUID(int=rng.getrandbits(128))) for _ in range(count)]
    workload = _blocked_agent(list(keys), [True] * count)
    _CountedKey.compared = 0
    report = workload.report()
    compared = _CountedKey.compared
    assert report.blockers == sorted(keys)[:MAX_BLOCKERS] and report.blocker_count == count
    # Measured: ~1.2 comparisons a key with the heap, ~13 with a full sort.
    assert compared < 3 * count, compared


def test_retired_keys_reply_as_a_full_sort_would() -> None:
    """On random chunks with repeats, across chunks and within one, the reply names the first
    MAX_RETIRED_KEYS_SHOWN keys of the former full sort and counts each key once."""
    rng = random.Random(20261205)
    for size in (1, MAX_RETIRED_KEYS_SHOWN - 1, MAX_RETIRED_KEYS_SHOWN, MAX_RETIRED_KEYS_SHOWN + 1, 3000):
        ids = [EpisodeId(f"r{rng.randrange(size)}", rng.randrange(3)) for _ in range(size)]
        retired = RetiredKeys()
        at = 0
        while at < len(ids):
            step = rng.randrange(1, 300)
            retired.add(ids[at : at + step])
            at += step
        before = sorted({e.capture_key for e in ids})
        assert retired.reply() == RetireReply(
            retired=before[:MAX_RETIRED_KEYS_SHOWN], retired_count=len(before)
        )


async def test_a_big_retire_orders_its_reply_a_chunk_at_a_time() -> None:
    """A retire of 20,000 ids compares keys at most a few thousand times between two yields to
    the loop, not the ~280,000 times a sort of every key did in one stretch after the last
    mark (64,000 ids held the loop ~20-35 ms for the sort alone)."""
    rng = random.Random(11)
    count = 20_000
    keys = [_CountedKey(f"r{rng.getrandbits(64):016x}") for _ in range(count)]
    ids = [EpisodeId(key) for key in keys]
    workload = _agent()
    done = anyio.Event()
    stretches: list[int] = []

    async def count_between_yields() -> None:
        # Runs once at every yield of the retire: each difference is one stretch's comparisons.
        last = _CountedKey.compared
        for _ in range(100_000):
            if done.is_set():
                break
            await anyio.lowlevel.checkpoint()
            stretches.append(_CountedKey.compared - last)
            last = _CountedKey.compared

    _CountedKey.compared = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(count_between_yields)
        reply = await workload.retire(ids)
        done.set()
    assert reply == RetireReply(retired=sorted(keys)[:MAX_RETIRED_KEYS_SHOWN], retired_count=count)
    # Measured: ~1,200 at most a stretch (a chunk's new keys and the 100 kept), 285,000 with the sort.
    assert max(stretches) < 4 * RETIRE_CHUNK, max(stretches)


def _full_recount(workload: Workload[Any, Any]) -> PrepareReport:
    """Readiness by asking every episode, as ``report`` did before it kept counts."""
    blocking = workload.blocking
    blockers = sorted(e.key for e in workload.episodes.values() if blocking(e))
    statuses = [e.status for e in workload.episodes.values()]
    counts = {"episodes": len(statuses)}
    if isinstance(workload, AgentWorkload):
        counts = {"sessions": len(statuses), "at_boundary": statuses.count("idle")}
    elif isinstance(workload, ResourcesWorkload):
        counts = {"inflight": statuses.count("running"), "sessions": len(statuses)}
    return PrepareReport(
        ready=not blockers, blockers=blockers[:MAX_BLOCKERS], blocker_count=len(blockers), counts=counts
    )


class _HeldBlocks(ResourcesWorkload):
    """A user's kind whose ``blocking`` reads something else than ``running``."""

    def blocking(self, episode: Episode[Any]) -> bool:
        return episode.status == "held" or episode.boundary == 2


@pytest.mark.parametrize("seed", range(6))
async def test_the_kept_readiness_is_the_full_recount_after_every_random_change(seed: int) -> None:
    """1,500 random changes (status written on live and dropped episodes, starts, direct pops,
    a key taken over by a new episode, an install taken back, ``blocking`` overridden on the
    instance for a while): after each, ``report()`` equals asking every episode, and so do
    the counts of each status."""
    rng = random.Random(seed)
    tel = Telemetry(None, kind="x", instance="x-0")
    workload: Workload[Any, Any] = [
        _agent(),
        ResourcesWorkload(tel, request_seconds=0),
        _HeldBlocks(tel, request_seconds=0),
    ][seed % 3]
    dropped: list[Episode[Any]] = []  # out of ``episodes``, still written to (a retired unit ending)
    statuses = ("idle", "running", "held")
    for step in range(1500):
        live = list(workload.episodes.values())
        match rng.randrange(12):
            case 0 | 1:
                workload.start(EpisodeId(f"r{rng.randrange(250):03d}", rng.randrange(2)), 3)
            case 2 | 3 | 4 if live:
                rng.choice(live).status = rng.choice(statuses)
            case 5 if dropped:
                rng.choice(dropped).status = rng.choice(statuses)
            case 6 if live:
                dropped.append(workload.episodes.pop(rng.choice(live).key))
            case 7 if live:
                old = rng.choice(live)
                new = workload.episode(old.episode_id, 3, rng.randrange(3), old.state)
                new.status = rng.choice(statuses)
                writes = workload.episodes
                match rng.randrange(3):
                    case 0:
                        writes[new.key] = new
                    case 1:
                        writes.update({new.key: new})
                    case _:
                        writes |= {new.key: new}
                dropped.append(old)
            case 8:
                with pytest.raises(InvalidCheckpointError), workload.installing():
                    record = ResourcesRecord(
                        episode_id=EpisodeId(f"r{rng.randrange(250):03d}", 1),
                        boundary=1,
                        steps=3,
                        session_id="s",
                        counter=1,
                        document=["line 1"],
                    )
                    for key in await workload.install([record], [live[0].state if live else None]):
                        workload.episodes[key].status = "running"
                    raise InvalidCheckpointError("taken back")
            case 9 if live:
                key = rng.choice(live).key
                dropped.append(workload.episodes[key])
                del workload.episodes[key]
            case 10 if live:
                dropped.append(workload.episodes.popitem()[1])
            case 11 if dropped:
                # Back in under its key (a retire's pop undone), unless another took the key.
                back = dropped.pop(rng.randrange(len(dropped)))
                if back.key not in workload.episodes:
                    workload.episodes.setdefault(back.key, back)
        if step == 500:
            workload.blocking = lambda e: e.status == "held"  # type: ignore[method-assign]
        elif step == 1000:
            del workload.blocking
        assert workload.report() == _full_recount(workload), step
        got = {s: workload.episodes.count(s) for s in statuses}
        assert got == {s: [e.status for e in workload.episodes.values()].count(s) for s in statuses}, step


def test_readiness_costs_what_the_unsettled_episodes_cost_not_all_of_them() -> None:
    """100,000 idle episodes and 10 running: a readiness check costs about what it costs with
    1,000 idle ones (measured ~0.01 ms either way). Was: every episode was asked, ~8 ms
    here, ~100 times the small case; a prepare's wait and /status ran it."""

    def best_report_seconds(idle: int) -> float:
        workload = ResourcesWorkload(Telemetry(None, kind="resources", instance="r-0"), request_seconds=0)
        for i in range(idle + 10):
            episode = workload.start(EpisodeId(f"r{i:06d}"), 3)
            episode.status = "running" if i % (idle // 10 + 1) == 0 and i < idle else "idle"
        assert workload.report().blocker_count == 10
        times = []
        for _ in range(7):
            began = time.perf_counter()
            workload.report()
            times.append(time.perf_counter() - began)
        return min(times)

    small, large = best_report_seconds(1_000), best_report_seconds(100_000)
    assert large < 10 * small + 0.0005, (small, large)


def test_an_episode_goes_in_only_under_its_key_and_into_its_own_table() -> None:
    """An episode under another key, or made by another workload, or already in a table is
    refused (its status would be counted in the wrong place); nothing changes."""
    workload, other = _agent(), _agent()
    episode = workload.start(EpisodeId("r1"), 3)
    stranger = other.start(EpisodeId("r2"), 3)
    made = workload.episode(EpisodeId("r3"), 3, 0, episode.state)
    with pytest.raises(ValueError, match="put under another key"):
        workload.episodes["r9"] = made
    with pytest.raises(ValueError, match="another workload"):
        workload.episodes["r2"] = stranger
    with pytest.raises(ValueError, match="idle episodes are not listed"):
        workload.episodes.with_status("idle")
    assert list(workload.episodes) == ["r1"] and workload.report().blocker_count == 0
