"""Trends across a run, from real fleets: a step slowed a little more at every checkpoint is
flagged as growing, one instance slowed at every checkpoint is flagged as the straggler, a
healthy run flags neither; and the overview folded from a stream matches the one from a list.
From synthetic timings (seeded): jitter, outliers and a machine's drifting load flag nothing,
and the same noise over a real growth or a real straggler is still flagged."""

from __future__ import annotations

import gzip
import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

from ckpt_events import CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.judge import PUBLISHED
from ckpt_events.participants.cli.report.overview import RunRow, overview
from ckpt_events.participants.cli.report.trends import Trends, binomial_tail, growth, spearman, theil_sen
from ckpt_events.participants.controller.coordinator import CheckpointNotPrepared
from ckpt_events.participants.workloads.environment import EnvironmentWorkload
from ckpt_events.vocab import Kind, Operation, Step
from tests.participants.controller.test_coordinator import FOUR, coordinated, start_work

TWO_ENVIRONMENTS = (("environment", "environment-1"), *FOUR)
CHECKPOINTS = 8


async def _checkpoints(tmp_path: Path, members: Any = FOUR) -> list[Any]:
    async with coordinated(members=members) as (co, _, events):
        for n in range(CHECKPOINTS):
            await co.checkpoint(f"c{n}", str(tmp_path / f"ck{n}"), deadline_ts=time.time() + 10)
    return list(events)


#: What the straggler tests slow environment-1's export by. With two environments it must be
#: the slower in every checkpoint (5 of 5: 4 of 5 is luck among two), so the delay is well
#: above what a loaded machine adds to the other's export (its file writes): at 0.05 s a
#: clean-clone run beside other work flagged no one.
STRAGGLER_DELAY: Final = 0.2


def _slowed_export(monkeypatch: pytest.MonkeyPatch, seconds: Any) -> None:
    real = EnvironmentWorkload.export

    async def export(self: EnvironmentWorkload, scope: Any) -> Any:
        await anyio.sleep(seconds(self))
        return await real(self, scope)

    monkeypatch.setattr(EnvironmentWorkload, "export", export)


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4]) == pytest.approx(1.0)
    assert spearman([4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1]) is None and spearman([1, 2]) is None
    assert spearman([1, 3, 2, 4, 5]) == pytest.approx(0.9)


def test_theil_sen_ignores_an_outlier_and_the_binomial_tail() -> None:
    """The fitted line is the one under the points, whatever one point does; the tail sums."""
    assert theil_sen([1, 3, 5, 7, 9]) == pytest.approx((1.0, 2.0))
    assert theil_sen([1, 3, 5, 700, 9, 11]) == pytest.approx((1.0, 2.0))
    assert binomial_tail(8, 8, 0.5) == pytest.approx(1 / 256)
    assert binomial_tail(7, 8, 0.5) == pytest.approx(9 / 256)
    assert binomial_tail(0, 8, 0.5) == 1.0
    assert binomial_tail(600, 1000, 0.5) < 1e-9


def test_growth_needs_a_significant_slope_well_above_its_jitter() -> None:
    """A clean ramp is growth; the same ramp under jitter as large as the ramp, a single late
    spike, fewer than seven points or a rise under the absolute floor are not."""
    ramp = [10.0 + 5 * i for i in range(8)]
    found = growth(ramp)
    assert found is not None and found.start == pytest.approx(10) and found.end == pytest.approx(45)
    assert found.slope == pytest.approx(5) and found.rho == pytest.approx(1) and math.isinf(found.over_jitter)
    assert growth([10, 10, 10, 10, 10, 10, 10, 500]) is None  # one stall is a slow checkpoint
    assert growth(ramp[:6]) is None  # six points cannot make a rank correlation significant
    assert growth([0.1 + 0.05 * i for i in range(8)]) is None  # 0.35 ms is under the floor
    noisy = random.Random(7)
    jittered = [v + noisy.uniform(-25, 25) for v in ramp]
    assert growth(jittered) is None, jittered
    # 1,000 checkpoints are judged on 16 block medians, the line still per checkpoint.
    long = growth([10.0 + 0.05 * i + noisy.uniform(-2, 2) for i in range(1000)])
    assert long is not None and long.points == 16 and long.slope == pytest.approx(0.05, rel=0.05)
    assert long.start == pytest.approx(10, abs=0.5) and long.end == pytest.approx(60, abs=0.5)


def _synthetic(
    seed: int, checkpoints: int, ms: Callable[[random.Random, str, int], float], environments: int = 4
) -> Trends:
    """A fleet of ``environments`` environments and 2 models checkpointed ``checkpoints`` times, each
    instance's commit (one export step inside) taking ``ms(rng, who, n)`` times the machine's
    load, a log-AR(1) drift shared by everyone, times its own log-normal jitter, and 5% of
    the time an outlier 2-6x (a preempted process)."""
    rng = random.Random(seed)
    trends = Trends()
    members = [(Kind.ENVIRONMENT, f"environment-{i}") for i in range(environments)]
    members += [(Kind.MODEL, f"model-{i}") for i in range(2)]
    log_load, span, now = 0.0, 1, 1_000_000_000
    for n in range(checkpoints):
        log_load = 0.8 * log_load + rng.gauss(0, 0.1)
        spans: list[Any] = []
        for kind, instance in members:
            took = ms(rng, f"{kind.value}/{instance}", n) * math.exp(log_load + rng.gauss(0, 0.2))
            if rng.random() < 0.05:
                took *= rng.uniform(2, 4)
            end = now + int(took * 1e6)
            trace, name = n + 1, f"c{n}"
            spans += [
                StepFinished(kind, instance, trace, span + 1, now, end, Step.EXPORT, name, span),
                OperationFinished(kind, instance, trace, span, now, end, Operation.COMMIT, name),
            ]
            span += 2
        root = CoordinateFinished(
            Kind.CONTROLLER, "controller", n + 1, span, now, now + 10**8, Operation.COMMIT, f"c{n}"
        )
        trends.add_trace(spans, root)
        span += 1
        now += 10**9
    return trends


@pytest.mark.parametrize("checkpoints", [8, 30, 300])
def test_noisy_but_healthy_timings_flag_nothing(checkpoints: int) -> None:
    """A hundred seeded runs of equal instances under jitter, outliers and a drifting load:
    no straggler, no growing step."""
    for seed in range(100):
        flags = _synthetic(seed, checkpoints, lambda _rng, _who, _n: 10.0).flags()
        assert flags == [], (seed, flags)


@pytest.mark.parametrize(
    ("checkpoints", "grown", "slower"), [(8, None, 2.5), (30, None, 2.5), (300, 5.0, 2.5)]
)
def test_the_same_noise_over_a_real_trend_or_straggler_is_flagged(
    checkpoints: int, grown: float | None, slower: float
) -> None:
    """Under that noise, a model whose commit grows ``grown``-fold through the run is growing,
    and an environment ``slower`` times its peers at every checkpoint is the straggler (five
    seeds each; fewer checkpoints need a larger change to stand out of this much noise)."""

    def ramp(_rng: random.Random, who: str, n: int) -> float:
        assert grown is not None
        return 10.0 * (1 + (grown - 1) * n / (checkpoints - 1) if who.startswith("model") else 1)

    def straggling(_rng: random.Random, who: str, _n: int) -> float:
        return 10.0 * (slower if who == "environment/environment-2" else 1)

    for seed in range(5):
        if grown is not None:
            flags = _synthetic(seed, checkpoints, ramp).flags()
            named = {f.split(" went")[0] for f in flags}
            assert named == {"growing: model commit", "growing: model commit.export"}, (seed, flags)
        flags = _synthetic(seed, checkpoints, straggling).flags()
        assert len(flags) == 1, (seed, flags)
        assert flags[0].startswith("straggler: environment/environment-2 was the slowest environment in")


@pytest.mark.parametrize("checkpoints", [8, 30, 300])
def test_a_wide_healthy_fleet_flags_nothing(checkpoints: int) -> None:
    """Sixteen equal environments under the same noise: judging among the few slowest (not only
    the slowest) names none of them."""
    for seed in range(100):
        flags = _synthetic(seed, checkpoints, lambda _rng, _who, _n: 10.0, environments=16).flags()
        assert [f for f in flags if f.startswith("straggler: ")] == [], (seed, flags)


@pytest.mark.parametrize("checkpoints", [8, 30])
def test_two_slow_servers_among_sixteen_are_both_named(checkpoints: int) -> None:
    """Two environments of sixteen, each 2.5x its peers at every checkpoint, take turns at the
    top: both are named, and no healthy one (the slowest alone named neither, in most seeds)."""
    slow = ("environment/environment-3", "environment/environment-11")

    def two_slow(_rng: random.Random, who: str, _n: int) -> float:
        return 10.0 * (2.5 if who in slow else 1)

    for seed in range(5):
        flags = _synthetic(seed, checkpoints, two_slow, environments=16).flags()
        named = sorted(f.split(" was ")[0].removeprefix("straggler: ") for f in flags)
        assert named == sorted(slow), (seed, flags)


def test_workers_are_not_the_peers_of_participants() -> None:
    """Two equal models of two workers each: a worker's share of a commit (2 ms) is no peer of
    a participant's whole commit (10 ms), so neither participant is its kind's straggler, and
    one slowed 3x among its peers still is."""
    for seed in range(20):
        for slower in (1.0, 3.0):
            rng = random.Random(seed)
            trends, span, now = Trends(), 1, 1_000_000_000
            for n in range(8):
                spans: list[Any] = []
                for instance, worker, ms in [
                    (f"model-{i}", w, (2.0 if w is not None else 10.0 * (slower if i == 1 else 1)))
                    for i in range(2)
                    for w in (None, 0, 1)
                ]:
                    end = now + int(ms * math.exp(rng.gauss(0, 0.2)) * 1e6)
                    spans.append(
                        OperationFinished(
                            Kind.MODEL,
                            instance,
                            n + 1,
                            span,
                            now,
                            end,
                            Operation.COMMIT,
                            f"c{n}",
                            worker=worker,
                        )
                    )
                    span += 1
                root = CoordinateFinished(
                    Kind.CONTROLLER, "controller", n + 1, span, now, now + 10**8, Operation.COMMIT, f"c{n}"
                )
                trends.add_trace(spans, root)
                span, now = span + 1, now + 10**9
            stragglers = [f for f in trends.flags() if f.startswith("straggler: ")]
            if slower == 1.0:
                assert stragglers == [], (seed, stragglers)
            else:
                assert len(stragglers) == 1 and stragglers[0].startswith("straggler: model/model-1 "), seed


async def test_a_step_slowed_progressively_is_flagged_growing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = iter(range(1000))
    # 0, 15, 30 ... ms more at every checkpoint; the last one stalls half a second.
    _slowed_export(monkeypatch, lambda _: 0.5 if (n := next(calls)) == CHECKPOINTS - 1 else 0.015 * n)
    run = overview(await _checkpoints(tmp_path))
    assert [r.outcome for r in run.rows] == ["published"] * CHECKPOINTS
    flags = run.trends.flags()
    slow = [f for f in flags if f.startswith("checkpoint #")]
    assert any(f.startswith(f"checkpoint #{CHECKPOINTS} c{CHECKPOINTS - 1} took ") for f in slow), flags
    # The stall is the slowest; the ramp's upper half (60-90 ms more) can reach 2x the median on
    # a loaded machine (c6 took 2.1-2.6x it in four of five runs beside a CPU hog, c5 2.0x once in
    # a full suite), never its lower half (0-45 ms more), which no flag may name.
    # A CI machine once stalled c3 itself (260.1 ms, 3.0x the median, against the ramp's 45 ms
    # more): a flag on the lower half is true only for such a stall, far past what the ramp gave.
    lower_half = tuple(f"checkpoint #{n} " for n in range(1, CHECKPOINTS // 2 + 1))
    for flag in (f for f in slow if f.startswith(lower_half)):
        said = re.match(
            r"checkpoint #(\d+) c(\d+) took ([\d.,]+) ms, ([\d.]+)x the run's median ([\d.,]+) ms", flag
        )
        assert said is not None, flag
        took, median = float(said[3].replace(",", "")), float(said[5].replace(",", ""))
        assert took >= 2 * median and 15 * int(said[2]) < took / 4, flags
    growing = [f for f in flags if f.startswith("growing:")]
    assert any("environment commit.export" in f for f in growing), flags
    # The export's time reaches the commit and the collection around it; nothing else grew.
    assert not any("model" in f or "agent" in f or "resources" in f for f in growing), flags
    (export,) = [t for t in run.trends.table() if t.key == ("environment", "commit", "export")]
    assert export.count == CHECKPOINTS and export.rho is not None and export.rho > 0.9
    assert export.max >= 500 and export.p50 < 100


async def test_one_slowed_instance_is_named_the_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slowed_export(monkeypatch, lambda w: STRAGGLER_DELAY if w.tel.instance == "environment-1" else 0.0)
    run = overview(await _checkpoints(tmp_path, TWO_ENVIRONMENTS))
    flags = run.trends.flags()
    stragglers = [f for f in flags if f.startswith("straggler:")]
    assert len(stragglers) == 1, flags
    assert "environment/environment-1 was the slowest environment in" in stragglers[0]
    # The slowed step is slower by a constant, never growing (other steps may grow on a loaded
    # machine as the run's files accumulate: commit.write went 4.6 -> 11.3 ms in one CI-like run).
    assert not any(f.startswith("growing:") and "export" in f for f in flags), flags


async def test_a_healthy_run_flags_nothing_and_a_stream_folds_like_a_list(tmp_path: Path) -> None:
    events = await _checkpoints(tmp_path, TWO_ENVIRONMENTS)
    listed = overview(events)
    streamed = overview(iter(events), again=lambda: iter(events))
    assert not [f for f in listed.trends.flags() if not f.startswith("checkpoint #")]
    assert [(r.checkpoint_id, r.outcome, r.ms, r.critical_path, r.paused_ms) for r in listed.rows] == [
        (r.checkpoint_id, r.outcome, r.ms, r.critical_path, r.paused_ms) for r in streamed.rows
    ]
    row = streamed.rows[3]
    detail = streamed.events_of(row)
    assert detail == listed.events_of(listed.rows[3])
    assert {e.trace_id for e in detail if hasattr(e, "trace_id")} == row.trace_ids
    assert 0 < len(detail) < len(events) / (CHECKPOINTS - 1)
    with pytest.raises(RuntimeError, match="again="):
        overview(iter(events)).events_of(row)


async def test_a_stalled_aborted_checkpoint_does_not_hide_the_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two faults: environment-0 stalls one checkpoint to its deadline (aborted, said as its
    cause), environment-1 is slowed at every checkpoint. The aborted one ranks no one: counted,
    environment-0 was its slowest, environment-1 the slowest in 5 of 6 (luck among two) and the
    straggler went unflagged."""
    _slowed_export(monkeypatch, lambda w: STRAGGLER_DELAY if w.tel.instance == "environment-1" else 0.0)
    slow = {"environment-0": {"step_seconds": 1.0}}
    async with coordinated(members=TWO_ENVIRONMENTS, options=slow) as (co, http, events):
        await start_work(http, co, "r1")
        env = next(m for m in co.of_kind("environment") if m.instance == "environment-0")
        async with anyio.create_task_group() as tg:
            running = anyio.Event()

            async def run_step() -> None:
                running.set()
                await http.post(
                    env.url + "/work/advance", json={"rollout_id": "r1", "attempt": 0}, timeout=10
                )

            tg.start_soon(run_step)
            await running.wait()
            await anyio.sleep(0.2)  # the step is running: the prepare waits for it, to its deadline
            with pytest.raises(CheckpointNotPrepared):
                await co.checkpoint("c-stalled", str(tmp_path / "stalled"), deadline_ts=time.time() + 0.4)
        for n in range(5):
            await co.checkpoint(f"c{n}", str(tmp_path / f"ck{n}"), deadline_ts=time.time() + 10)
    run = overview(list(events))
    assert [r.outcome for r in run.rows] == ["aborted"] + ["published"] * 5
    assert "environment/environment-0" in run.rows[0].causes[0]
    stragglers = [f for f in run.trends.flags() if f.startswith("straggler:")]
    assert len(stragglers) == 1, (run.trends.flags(), [(t.key, t.p50, t.max) for t in run.trends.table()])
    assert "environment/environment-1 was the slowest environment in 5 of 5 checkpoints" in stragglers[0]


#: A real demo run (2 servers of each kind, 5 checkpoints, then a restore) with two faults:
#: ``slow:model-1:5`` through generation 1 and ``slow-restore:model-0:0.5`` in its restore.
_SLOW_AND_SLOW_RESTORE = Path(__file__).parent / "data" / "slow-model-1-and-slow-restore-model-0.jsonl.gz"


def test_a_slow_restore_is_none_of_the_checkpoint_it_restored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The restore names the last checkpoint's id, but its time is not that checkpoint's:
    summed into it, model-0's 1 s read made it the slowest model there, model-1 (the slowest
    in every checkpoint) was so in 4 of 5 (luck among two) and the report flagged no straggler,
    naming the slow restore alone. Both are said."""
    log = tmp_path / "run.jsonl"
    log.write_bytes(gzip.decompress(_SLOW_AND_SLOW_RESTORE.read_bytes()))
    assert main(["report", str(log)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "flag: straggler: model/model-1 was the slowest model in 5 of 5 checkpoints" in text
    assert text.count("straggler:") == 1
    assert "#6 restore, critical path: coordinate.restore 1028.6 ms, model/model-0 restore" in text
    assert "read on model/model-0 1002.9 ms dominated" in text


def test_checkpoints_stamped_to_the_whole_millisecond_flag_none_slower_and_divide_by_nothing() -> None:
    """A clock stamping whole milliseconds made a run of sub-millisecond checkpoints a median of
    0.0 ms and one of them 1.0 ms: "slower than twice the median", its ratio a ZeroDivisionError
    (the report's traceback). One ms over a median of nothing is the clock's grain, no slow
    checkpoint; one well over it is still said, without a ratio."""

    def run(ends_ms: list[int]) -> list[str]:
        trends = Trends()
        for n, ms in enumerate(ends_ms):
            start = (n + 1) * 10**9
            trends.rows.append(RunRow("checkpoint", f"c{n}", start, start + ms * 10**6, outcome=PUBLISHED))
        return trends.flags()

    assert run([0, 0, 0, 1, 0]) == []
    (said,) = run([0, 0, 0, 7, 0])
    assert said.endswith("took 7.0 ms, where the run's median is 0.0 ms"), said
    (said,) = run([10, 10, 10, 30, 10])
    assert said.endswith("took 30.0 ms, 3.0x the run's median 10.0 ms"), said
