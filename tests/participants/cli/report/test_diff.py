"""``ckpt-events diff`` on two real runs, the second with one participant slowed on purpose."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import OperationFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.diff import real_change
from ckpt_events.participants.workloads.model import ModelWorkload
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import Operation, Outcome
from tests.participants.controller.test_coordinator import coordinated


async def _checkpoints(path: Path, ck: Path) -> None:
    async with coordinated() as (co, _, events):
        for n in range(3):
            await co.checkpoint(f"c{n}", str(ck / f"c{n}"), deadline_ts=time.time() + 10)
    sink = JsonLinesSink(path)
    sink.handle(events)
    sink.close()


async def test_diff_flags_the_slowed_step_and_fails_above_the_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's export slowed by 40 ms leads the table and makes --fail-above exit 1."""
    await _checkpoints(tmp_path / "base.jsonl", tmp_path / "base")
    export = ModelWorkload.export

    async def slow_export(self: Any, scope: Any) -> Any:
        await anyio.sleep(0.04)
        return await export(self, scope)

    monkeypatch.setattr(ModelWorkload, "export", slow_export)
    await _checkpoints(tmp_path / "new.jsonl", tmp_path / "new")
    assert main(["diff", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl"), "--fail-above", "3"]) == 1
    captured = capsys.readouterr()
    first_row = next(line for line in captured.out.splitlines() if line.strip().startswith(("model", "agent",
                     "environment", "resources", "controller")))  # fmt: skip
    assert first_row.split()[:3] == ["model", "commit", "export"], captured.out
    assert "worst model/commit/export" in captured.err
    # Without the gate the same comparison only reports.
    assert main(["diff", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]) == 0


def _log(path: Path, ms: dict[Operation, list[float]]) -> Path:
    """A log of model operations taking ``ms`` milliseconds each, one after the other."""
    events, t = [], 1_000_000_000
    for n, (operation, values) in enumerate(ms.items()):
        for i, value in enumerate(values):
            end = t + round(value * 1e6)
            events.append(
                OperationFinished(
                    "model", "model-0", 1, 100 * n + i + 1, t, end, operation, checkpoint_id=f"c{i}"
                )
            )
            t = end + 1_000_000
    sink = JsonLinesSink(path)
    sink.handle(events)
    sink.close()
    return path


def test_fail_above_ignores_a_sub_millisecond_change_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """renew 0.14 -> 0.27 ms over 3 checkpoints is 1.9x but noise: named in one line, not failed
    (it failed the run); a commit 10 -> 30 ms still fails it."""
    base = _log(
        tmp_path / "base.jsonl", {Operation.RENEW: [0.14, 0.13, 0.15], Operation.COMMIT: [10, 11, 10]}
    )
    new = _log(tmp_path / "new.jsonl", {Operation.RENEW: [0.27, 0.26, 0.28], Operation.COMMIT: [10, 11, 10]})
    assert main(["diff", str(base), str(new), "--fail-above", "1.5"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "ignored 1 median ratio above 1.5 as noise (a change under 1 ms or under the step's jitter): "
        "model/renew 0.14 -> 0.27 ms (n = 3, 3)"
    ]
    slower = _log(
        tmp_path / "slower.jsonl", {Operation.RENEW: [0.27, 0.26, 0.28], Operation.COMMIT: [30, 31, 29]}
    )
    assert main(["diff", str(base), str(slower), "--fail-above", "1.5"]) == 1
    err = capsys.readouterr().err
    assert "1 median ratio above 1.5: worst model/commit 3.00x" in err and "ignored 1 median ratio" in err


def test_a_real_change_clears_the_floor_and_the_jitter() -> None:
    """At least 1 ms, and at least the larger run's robust spread."""
    assert not real_change([0.14, 0.13, 0.15], [0.27, 0.26, 0.28])  # under 1 ms
    assert real_change([10.0, 11.0, 10.0], [30.0, 31.0, 29.0])
    assert not real_change([10.0, 30.0, 10.0, 30.0, 20.0], [12.0, 40.0, 5.0, 33.0, 22.0])  # within its jitter


def test_a_gate_that_compared_nothing_fails_and_a_cut_list_says_how_many_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No key in both runs: ``--fail-above`` fails in one line saying nothing was compared (it
    passed with an empty table), and "in one run only" counts the keys it leaves out."""
    base = _log(tmp_path / "base.jsonl", {op: [5.0] for op in Operation})
    agent = tmp_path / "agent.jsonl"
    agent.write_text(base.read_text().replace('"model"', '"agent"').replace('"model-0"', '"agent-0"'))
    new = _log(tmp_path / "new.jsonl", {Operation.COMMIT: [5.0]})
    new.write_text(new.read_text().replace('"model"', '"resources"'))
    keys = 2 * len(Operation) + 1
    assert main(["diff", f"{base},{agent}", str(new), "--fail-above", "1.1"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--fail-above 1.1: nothing was compared" in err, err
    assert f"and {keys - 8} more" in out, out
    assert main(["diff", f"{base},{agent}", str(new)]) == 0  # without the gate, a report


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_min_ms_must_be_a_finite_number_at_least_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """``--min-ms`` -1, nan, inf (a plain float took them) are refused by the parser, in one line."""
    log = _log(tmp_path / "a.jsonl", {Operation.COMMIT: [5.0]})
    with pytest.raises(SystemExit) as exit_:
        main(["diff", str(log), str(log), f"--min-ms={value}"])
    assert exit_.value.code == 2
    assert "--min-ms" in capsys.readouterr().err


def test_two_zero_medians_are_no_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step of 0 ms in both runs (a coarse or injected clock) is 1.00x, not ``infx`` at the top of
    the table and a ratio above the gate named as noise; 0 -> 5 ms is still an infinite ratio."""
    base = _log(tmp_path / "base.jsonl", {Operation.RENEW: [0.0, 0.0, 0.0], Operation.COMMIT: [10, 11, 10]})
    assert main(["diff", str(base), str(base), "--min-ms", "0", "--fail-above", "1.5"]) == 0
    out, err = capsys.readouterr()
    renew = next(line for line in out.splitlines() if "renew" in line)
    assert renew.split()[-1] == "1.00x", out
    assert err == ""
    new = _log(tmp_path / "new.jsonl", {Operation.RENEW: [5.0, 5.0, 5.0], Operation.COMMIT: [10, 11, 10]})
    assert main(["diff", str(base), str(new), "--min-ms", "0", "--fail-above", "1.5"]) == 1
    assert "worst model/renew infx" in capsys.readouterr().err


def test_a_narrow_terminal_folds_the_table_and_cuts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns (and 40) nothing ends in an ellipsis, long names fold onto more lines and at 80
    every number is whole (the ratio read "0.1…", a p50 "9.…" and the names "reso…")."""
    base = _log(
        tmp_path / "base.jsonl", {Operation.COMMIT: [10, 11, 10], Operation.RESTORE: [9.58, 9.6, 9.5]}
    )
    new = _log(tmp_path / "new.jsonl", {Operation.COMMIT: [30, 31, 29], Operation.RESTORE: [1.73, 1.7, 1.8]})
    for columns in ("80", "40"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["diff", f"{base},{base}", str(new)]) == 0
        out = capsys.readouterr().out
        assert "…" not in out, out
        assert max(len(line) for line in out.splitlines()) <= int(columns), out
        if columns == "80":
            assert all(cell in out.split() for cell in ("9.58", "0.18x", "3.00x", "model")), out


@pytest.mark.parametrize("value", ["0.1", "0.99", "0", "nan"])
def test_fail_above_is_a_ratio_of_1_or_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """``--fail-above 0.1`` (meant as 10%) is refused in one line: it failed a run whose commit got
    3x faster, naming the speed-up as the worst ratio."""
    base = _log(tmp_path / "base.jsonl", {Operation.COMMIT: [30, 31, 29]})
    new = _log(tmp_path / "new.jsonl", {Operation.COMMIT: [10, 11, 10]})
    with pytest.raises(SystemExit) as exit_:
        main(["diff", str(base), str(new), f"--fail-above={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fail-above" in err[0], err
    assert main(["diff", str(base), str(new), "--fail-above=1"]) == 0  # faster passes any gate


def test_a_tiny_ratio_is_not_shown_as_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """80 s -> 0.08 ms is ``<0.01x``: ``0.00x`` said the new run's step took no time at all."""
    base = _log(tmp_path / "base.jsonl", {Operation.COMMIT: [80_000.0]})
    new = _log(tmp_path / "new.jsonl", {Operation.COMMIT: [0.08]})
    assert main(["diff", str(base), str(new)]) == 0
    commit = next(line for line in capsys.readouterr().out.splitlines() if "commit" in line)
    assert commit.split()[-1] == "<0.01x", commit


def _outcomes(
    path: Path, spans: list[tuple[float, Outcome]], error_types: dict[int, str] | None = None
) -> Path:
    """A log of model commits taking ``ms`` milliseconds each, ending in ``outcome`` (span ``i``'s
    error type ``error_types[i]``, if given)."""
    events, t = [], 1_000_000_000
    for i, (value, outcome) in enumerate(spans):
        end = t + round(value * 1e6)
        events.append(
            OperationFinished(
                "model",
                "model-0",
                1,
                i + 1,
                t,
                end,
                Operation.COMMIT,
                checkpoint_id=f"c{i}",
                outcome=outcome,
                error_type=(error_types or {}).get(i),
            )  # fmt: skip
        )
        t = end + 1_000_000
    sink = JsonLinesSink(path)
    sink.handle(events)
    sink.close()
    return path


def test_failed_spans_are_counted_apart_not_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Commits that failed after 2 ms are not faster commits: the ok ones' times are compared
    (200 -> 210 ms, 1.05x), the failures shown per row (0 -> 3, marked and named); a run whose
    commits all failed shows no times rather than a 100x speed-up."""
    ok, error = Outcome.OK, Outcome.ERROR
    base = _outcomes(tmp_path / "base.jsonl", [(200, ok), (201, ok), (199, ok)])
    new = _outcomes(
        tmp_path / "new.jsonl", [(210, ok), (2, error), (2, error), (2, error), (211, ok), (209, ok)]
    )
    assert main(["diff", str(base), str(new), "--fail-above", "1.5"]) == 0
    out, err = capsys.readouterr()
    commit = next(line for line in out.splitlines() if "commit" in line and "model" in line)
    assert commit.split()[2:] == [
        "3",
        "3",
        "200.00",
        "201.00",
        "210.00",
        "211.00",
        "1.05x",
        "0",
        "->",
        "3",
        "*",
    ], out
    assert "failed spans differ (base -> new; not timed): model/commit 0 -> 3" in out, out
    assert err == ""
    failed = _outcomes(tmp_path / "failed.jsonl", [(2, error), (2, error)])
    assert main(["diff", str(base), str(failed), "--fail-above", "1.5"]) == 0
    commit = next(
        line for line in capsys.readouterr().out.splitlines() if "commit" in line and "model" in line
    )
    assert commit.split()[2:] == ["3", "0", "200.00", "201.00", "-", "-", "-", "0", "->", "2", "*"], commit


def test_cancelled_spans_are_counted_apart_from_the_failed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three commits cut by a server's stop (asyncio's and trio's cancellations) and one that raised:
    ``failed`` 0 -> 1 and ``cancelled`` 0 -> 3, each named in its own line, and neither gates
    ``--fail-above``. It read ``failed 0 -> 4`` and "failed spans differ: model/commit 0 -> 4"; a
    run whose only change was the three cut read as three more failures."""
    ok, error = Outcome.OK, Outcome.ERROR
    base = _outcomes(tmp_path / "base.jsonl", [(200, ok), (201, ok), (199, ok)])
    cut = {1: "asyncio.exceptions.CancelledError", 2: "trio.Cancelled", 3: "CancelledError", 4: "KeyError"}
    spans = [(210, ok), (2, error), (2, error), (2, error), (2, error), (211, ok), (209, ok)]
    new = _outcomes(tmp_path / "new.jsonl", spans, cut)
    assert main(["diff", str(base), str(new), "--fail-above", "1.5"]) == 0
    out, err = capsys.readouterr()
    header = next(line for line in out.splitlines() if "ratio p50" in line).split()
    assert header[-3:] == ["p50", "failed", "cancelled"], out
    commit = next(line for line in out.splitlines() if "commit" in line and "model" in line)
    assert commit.split()[-9:] == ["1.05x", "0", "->", "1", "*", "0", "->", "3", "*"], out
    assert "failed spans differ (base -> new; not timed): model/commit 0 -> 1\n" in out, out
    assert (
        "cancelled spans differ (base -> new; not timed, not failures, never gated): model/commit 0 -> 3\n"
    ) in out, out
    assert err == ""
    only_cut = _outcomes(tmp_path / "cut.jsonl", spans[:4] + spans[5:], cut)
    assert main(["diff", str(base), str(only_cut), "--fail-above", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "failed" not in out and " error" not in out, out
    commit = next(line for line in out.splitlines() if "commit" in line and "model" in line)
    assert commit.split()[-5:] == ["1.05x", "0", "->", "3", "*"], out
    every_one_cut = _outcomes(
        tmp_path / "every.jsonl",
        [(2, error)] * 3,
        {0: "trio.Cancelled"} | dict.fromkeys((1, 2), "CancelledError"),
    )
    assert main(["diff", str(base), str(every_one_cut), "--fail-above", "1.5"]) == 0
    commit = next(
        line for line in capsys.readouterr().out.splitlines() if "commit" in line and "model" in line
    )
    assert commit.split()[2:] == ["3", "0", "200.00", "201.00", "-", "-", "-", "0", "->", "3", "*"], commit


def test_an_empty_table_under_min_ms_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every median under ``--min-ms`` printed an empty table and nothing else."""
    log = _log(tmp_path / "a.jsonl", {Operation.COMMIT: [0.5, 0.6], Operation.RENEW: [0.2]})
    assert main(["diff", str(log), str(log), "--min-ms", "1"]) == 0
    _, err = capsys.readouterr()
    assert err.startswith("nothing compared: each operation and step in both runs (2) has its medians under ")
    assert err.endswith("--min-ms 1 ms: lower it\n") and err.count("\n") == 1
    assert main(["diff", str(log), str(log), "--min-ms", "0.1"]) == 0
    assert capsys.readouterr().err == ""
