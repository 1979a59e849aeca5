"""``demo --jsonl PATH`` holds every process's and worker's events in time order, so ``report PATH``
reads what the demo read."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.demo.logs import merge_into
from ckpt_events.participants.cli.report.model import finished_spans
from ckpt_events.sinks.jsonl import CorruptLine, read_events
from ckpt_events.vocab import Kind
from tests.participants.demo_runs import DemoRun, demo_run


def _who(events: list[object]) -> set[str]:
    """Every kind/instance(/w<i>) that closed a span."""
    return {
        f"{e.kind}/{e.instance}" + ("" if getattr(e, "worker", None) is None else f"/w{e.worker}")
        for e in finished_spans(events)  # type: ignore[arg-type]
    }


def _times(events: list[object]) -> list[int]:
    return [next(t for n in ("end_ns", "time_ns", "start_ns") if (t := getattr(e, n, None)) is not None)
            for e in events]  # fmt: skip


def test_merge_keeps_every_line_in_time_order_and_a_corrupt_line_in_place(tmp_path: Path) -> None:
    main, other = tmp_path / "x.jsonl", tmp_path / "other.jsonl"
    main.write_bytes(b'{"end_ns":30}\n{"end_ns":10}\nnot json\n\n')
    other.write_bytes(b'{"time_ns":20}\n{"start_ns":5}\n')
    assert merge_into(main, [other, tmp_path / "missing.jsonl"]) == 5
    assert main.read_bytes().splitlines() == [
        b'{"start_ns":5}', b'{"end_ns":10}', b"not json", b'{"time_ns":20}', b'{"end_ns":30}'
    ]  # fmt: skip
    assert not list(tmp_path.glob("*.merging"))


def test_merge_through_a_link_rewrites_the_file_it_names_and_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    target, link, other = tmp_path / "logs" / "run.jsonl", tmp_path / "run.jsonl", tmp_path / "w.jsonl"
    target.write_bytes(b'{"end_ns":30}\n')
    link.symlink_to(target)
    other.write_bytes(b'{"end_ns":20}\n')
    assert merge_into(link, [other]) == 2
    assert link.is_symlink() and link.resolve() == target
    assert target.read_bytes() == b'{"end_ns":20}\n{"end_ns":30}\n'
    assert not list(tmp_path.rglob("*.merging"))


@pytest.fixture(params=[(True, 1), (False, 2)], ids=["True-1", "False-2"])
def demo(request: pytest.FixtureRequest, tmp_path: Path) -> DemoRun:
    """A demo run: server processes, or in-process servers of two worker processes each (that
    one shared with the other tests that read a two-worker demo's logs)."""
    processes, workers = request.param
    if workers == 2:
        run: DemoRun = request.getfixturevalue("two_worker_demo")
        return run
    return demo_run(tmp_path, processes=processes, workers=workers)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_demo_log_holds_every_process_and_worker(demo: DemoRun) -> None:
    """The log names the same span owners as the demo's own report (the controller, every
    participant instance, and each worker ``w0``/``w1``), in time order, nothing corrupt."""
    result = demo.result
    read = [e for _, e in read_events(demo.log)]
    assert not any(isinstance(e, CorruptLine) for e in read)
    assert _who(read) == _who(result.events)
    participants = {w for w in _who(read) if not w.startswith(Kind.CONTROLLER.value)}
    assert len({w.split("/")[1] for w in participants}) >= 3
    if demo.workers == 2:
        assert {w.rsplit("/", 1)[-1] for w in participants} >= {"w0", "w1"}
    assert len(read) == len(result.events)
    assert _times(read) == sorted(_times(read))
    assert "processes' and workers' logs" in demo.printed
