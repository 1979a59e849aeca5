"""Report benchmark: reading logs (lines/s, peak memory) and the overview of a long run.

A log of many checkpoints is made by emitting one real collection checkpoint through the
emitter (four participants' prepare, commit with steps, resume) and repeating its events
with shifted times and fresh trace ids, written by the JSON-lines sink and split over two
files (controller and participants) so the heap merge does real work.

* read: ``merged_events`` over both files, lines per second (one core);
* memory: peak traced memory of the streaming read (tracemalloc, separate pass), and of
  the overview, which folds the events into per-checkpoint summaries as they stream past;
  its peak at 10M lines is extrapolated from its growth between a run and one of half the
  checkpoints, beside what it holds whatever the size (bounded caches: the peak over the
  lines of one run counted them once a line, 1.017 GiB said of 0.627 measured at 1M lines);
* overview: ``overview`` of the whole run (every checkpoint judged and its slowest path).

Run ``python -m ckpt_events.benchmarks.bench_report [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ckpt_events import Telemetry
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind

__all__ = ["run"]

TARGET_LINES_PER_S = 300_000
TARGET_OVERVIEW_S = 10.0


async def _one_checkpoint() -> list[Any]:
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        who = {kind: Telemetry(bus, kind=kind, instance=f"{kind}-0") for kind in PREPARE_ORDER}
        with ctl.collection("checkpoint", checkpoint_id="c") as coll:
            with ctl.coordinate("prepare", checkpoint_id="c", parent=coll) as coord:
                for kind in PREPARE_ORDER:
                    with coord.stage(kind) as stage:
                        with who[kind].operation(
                            "prepare", checkpoint_id="c", traceparent=stage.traceparent()
                        ) as op:
                            with op.step("wait_ready"):
                                pass
            for operation, steps in (("commit", ("export", "write")), ("resume", ())):
                with ctl.coordinate(operation, checkpoint_id="c", parent=coll) as coord:
                    for kind in PREPARE_ORDER:
                        with who[kind].operation(
                            operation, checkpoint_id="c", traceparent=coord.traceparent()
                        ) as op:
                            for step in steps:
                                with op.step(step):
                                    pass
    return events


def _write_run(folder: Path, checkpoints: int) -> int:
    template = anyio.run(_one_checkpoint)
    start = min(getattr(e, "start_ns", 0) or e.time_ns for e in template)
    span = max(getattr(e, "end_ns", 0) or 0 for e in template) - start
    controller = JsonLinesSink(folder / "controller.jsonl")
    participants = JsonLinesSink(folder / "participants.jsonl")
    replace = msgspec.structs.replace
    lines = 0
    for n in range(checkpoints):
        shift = n * (span + 1_000_000)
        batch = []
        for e in template:
            changes: dict[str, Any] = {"trace_id": e.trace_id + n + 1, "checkpoint_id": f"c{n}"}
            for name in ("start_ns", "end_ns", "received_ns"):
                if getattr(e, name, None) is not None:
                    changes[name] = getattr(e, name) + shift
            batch.append(replace(e, **changes))
        controller.handle([e for e in batch if e.kind == Kind.CONTROLLER])
        participants.handle([e for e in batch if e.kind != Kind.CONTROLLER])
        lines += len(batch)
    controller.close()
    participants.close()
    return lines


def _overview_peak(paths: list[Path]) -> int:
    """The overview's peak traced memory over ``paths`` (bytes, above what was traced before)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        overview(merged_events(paths, LogProblems()))
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _measure(quick: bool, checkpoints: int | None = None) -> dict[str, Any]:
    checkpoints = checkpoints or (200 if quick else 1000)
    with tempfile.TemporaryDirectory() as tmp:
        folder, half_folder = Path(tmp) / "run", Path(tmp) / "half"
        folder.mkdir()
        half_folder.mkdir()
        lines = _write_run(folder, checkpoints)
        half_lines = _write_run(half_folder, checkpoints // 2)
        paths = sorted(folder.iterdir())
        best = float("inf")
        for _ in range(1 if quick else 3):
            began = time.perf_counter()
            count = sum(1 for _ in merged_events(paths, LogProblems()))
            best = min(best, time.perf_counter() - began)
        assert count == lines, (count, lines)
        began = time.perf_counter()
        run = overview(merged_events(paths, LogProblems()))
        overview_s = time.perf_counter() - began
        assert len(run.rows) == checkpoints and all(r.outcome == "published" for r in run.rows)
        tracemalloc.start()
        try:
            for _ in merged_events(paths, LogProblems()):
                pass
            read_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        overview_peak = _overview_peak(paths)
        half_peak = _overview_peak(sorted(half_folder.iterdir()))
    per_line = max(0, overview_peak - half_peak) / (lines - half_lines)
    return {
        "checkpoints": checkpoints,
        "lines": lines,
        "read_lines_per_s": lines / best,
        "overview_s": overview_s,
        "read_peak_bytes": read_peak,
        "overview_peak_bytes": overview_peak,
        "overview_half_peak_bytes": half_peak,
        "overview_bytes_per_line": per_line,
        "overview_peak_10m_bytes": overview_peak + per_line * (10_000_000 - lines),
    }


def run(quick: bool = False, checkpoints: int | None = None) -> dict[str, Any]:
    """Run the report benchmark (over ``checkpoints``: 200 quick, else 1,000); returns the
    figures and the rows of the ratio table."""
    f = _measure(quick, checkpoints)
    per_10m = f["overview_peak_10m_bytes"] / 2**30
    rows: list[Any] = [
        (
            f"report: read+merge 2 logs, lines/s ({f['lines']:,} lines)",
            f["read_lines_per_s"],
            f">= {TARGET_LINES_PER_S:,}",
            f["read_lines_per_s"] >= TARGET_LINES_PER_S,
        ),
        ("report: streaming read, peak MiB (tracemalloc)", f["read_peak_bytes"] / 2**20, "", None),
        (
            f"report: overview of {f['checkpoints']:,} checkpoints, s",
            f["overview_s"],
            f"< {TARGET_OVERVIEW_S}",
            f["overview_s"] < TARGET_OVERVIEW_S,
        ),
        ("report: overview, peak GiB per 10M lines (extrapolated)", per_10m, "< 1", per_10m < 1),
    ]
    return {**f, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from ckpt_events.benchmarks.report import failure_in_one_line, output_path, print_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=output_path)
    args = parser.parse_args(argv)
    with failure_in_one_line("report"):
        result = run(quick=args.quick)
        print_table("report benchmark", result.pop("rows"))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)  # as output_path promised
            args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
