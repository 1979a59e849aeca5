"""The report: breakdown, waterfall and counts, built from events alone."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from ckpt_events import Stalled, Telemetry
from ckpt_events.participants.cli.report.html import write_timeline
from ckpt_events.participants.cli.report.terminal import render
from ckpt_events.participants.cli.report.timeline import breakdown, counts, spans_of
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind, Operation, Phase


async def _one_checkpoint() -> list:
    async with capture_events() as (bus, events):
        controller = Telemetry(bus, kind="controller", instance="coordination")
        model = Telemetry(bus, kind="model", instance="m0")
        env = Telemetry(bus, kind="environment", instance="e0")
        with controller.collection("checkpoint", checkpoint_id="c1") as coll:
            with controller.coordinate("prepare", checkpoint_id="c1", parent=coll) as coord:
                for kind in ("environment", "model", "agent", "resources"):
                    with coord.stage(kind) as stage:
                        tp = stage.traceparent()
                        tel = {"environment": env, "model": model}.get(kind)
                        if tel is not None:
                            with tel.operation("prepare", checkpoint_id="c1", traceparent=tp) as op:
                                with op.step("wait_ready"):
                                    pass
            with controller.coordinate("commit", checkpoint_id="c1", parent=coll) as coord:
                for tel in (env, model):
                    with tel.operation("commit", checkpoint_id="c1", traceparent=coord.traceparent()) as op:
                        with op.step("export"):
                            pass
                        with op.step("write") as write:
                            write.set(records=10, bytes=1000)
                        op.set(records=10)
        model.refused("stale_attempt")
        model.refused("stale_attempt")
        model.generation_cut("durable_prefix", 3)
        env.lease_expired("prepared")
    return events


async def test_breakdown_sums_per_participant() -> None:
    """Each participant gets its operation and step times, records and bytes."""
    rows = breakdown(await _one_checkpoint())
    assert [(r.kind, r.instance) for r in rows] == [(Kind.ENVIRONMENT, "e0"), (Kind.MODEL, "m0")]
    assert rows[0].records == 10 and rows[0].bytes == 1000
    assert {"prepare", "wait_ready", "commit", "export", "write"} <= set(rows[1].ms)


async def test_waterfall_is_one_trace_parents_first(tmp_path: Path) -> None:
    """The timeline covers the collection trace, with depth from parent links."""
    events = await _one_checkpoint()
    spans = spans_of(events)
    names = [s.name for s in spans]
    assert names[0] == "gym.checkpoint.collection.checkpoint" and spans[0].depth == 0
    assert "gym.checkpoint.coordinate.prepare.resources" in names
    assert max(s.depth for s in spans) == 4  # collection > coordinate > stage > prepare > wait_ready
    write_timeline(tmp_path / "t.svg", spans)
    write_timeline(tmp_path / "t.html", events=events)
    assert (tmp_path / "t.svg").read_text().startswith("<svg")
    assert "<svg" in (tmp_path / "t.html").read_text()


async def test_counts_and_render() -> None:
    """Counted events are tallied and everything renders to a terminal."""
    events = await _one_checkpoint()
    # What sinks.StallWatch counts for a prepare held past its threshold.
    events.append(Stalled(Kind.ENVIRONMENT, "e0", 1, Operation.PREPARE, 31.0, Phase.PREPARING, "c1"))
    tallies = counts(events)
    assert tallies["stalled"] == {"environment/prepare": 1}
    assert tallies["refused"] == {"stale_attempt": 2}
    assert tallies["generation_cut"] == {"durable_prefix": 3}
    assert tallies["lease_expired"] == {"environment/prepared": 1}
    out = io.StringIO()
    render(Console(file=out, width=150), events)
    text = out.getvalue()
    assert "environment/e0" in text and "waterfall" in text and "stale_attempt" in text
    assert "environment/prepare" in text


async def test_a_span_of_unknown_duration_shows_a_question_mark_never_zero() -> None:
    """The model's clock went back 5 s during its commit: the waterfall row and the breakdown
    cell say ``?`` (terminal and HTML), never 0.0; the attribution line names the checkpoint."""
    import msgspec

    from ckpt_events import OperationFinished
    from ckpt_events.participants.cli.report.html import html_page

    events = [
        msgspec.structs.replace(e, end_ns=e.start_ns - 5_000_000_000)
        if isinstance(e, OperationFinished) and e.instance == "m0" and e.operation == Operation.COMMIT
        else e
        for e in await _one_checkpoint()
    ]
    out = io.StringIO()
    render(Console(file=out, width=200), events)
    text = out.getvalue()
    row = next(line for line in text.splitlines() if line.strip().startswith("commit m0"))
    assert row.split()[2] == "?"
    # The walk stopped at the commit stage (it entered it): marked, its unknown child not.
    stage = next(line for line in text.splitlines() if line.strip().startswith("coordinate.commit"))
    assert "▶" in stage and "▶" not in row
    table = next(line for line in text.splitlines() if line.strip().startswith("model/m0"))
    assert " ? " in table
    assert "checkpoint c1 (collection.checkpoint): " in text
    page = html_page(events)
    assert 'data-ms="?"' in page and "? ms</text>" in page and "<td>?</td>" in page
    assert "its clock went back during it" in page
    assert "<h2>checkpoint c1</h2>" in page


async def test_the_html_table_says_it_sums_every_checkpoint_and_restore() -> None:
    """Two checkpoints in the events: the per-participant heading says what it adds up, as the
    terminal's does."""
    from ckpt_events.participants.cli.report.html import html_page
    from ckpt_events.participants.cli.report.timeline import summed_over

    one = await _one_checkpoint()
    two = one + await _one_checkpoint()
    assert summed_over(one) == "summed over 1 checkpoint and 0 restores"
    assert summed_over(two) == "summed over 2 checkpoints and 0 restores"
    assert summed_over([]) == ""
    assert "<h2>time per participant (ms), summed over 2 checkpoints and 0 restores</h2>" in html_page(two)


async def test_an_exception_leaving_a_step_and_its_operation_is_one_error() -> None:
    """A judge's prepare whose ``validate`` step raised, three times: 3 errors, not 6 (63 failed
    requests read "126 errors: ValueError"). A step's error the operation caught is one; caught
    and then another of the operation's own, two; each error's type is named."""
    async with capture_events() as (bus, events):
        judge = Telemetry(bus, kind="judge", instance="judge-0")
        for n in range(3):
            try:
                with judge.operation("prepare", checkpoint_id=f"c{n}") as op, op.step("validate"):
                    raise ValueError("bad rows")
            except ValueError:
                pass
        with judge.operation("commit", checkpoint_id="c3") as op:
            try:
                with op.step("upload"):
                    raise OSError("disk full")
            except OSError:
                pass  # caught: the commit went on and ended ok
        try:
            with judge.operation("restore", checkpoint_id="c4") as op:
                try:
                    with op.step("read"):
                        raise OSError("gone")
                except OSError:
                    raise KeyError("c4") from None
        except KeyError:
            pass
    (row,) = breakdown(events)
    assert row.errors == 3 + 1 + 2
    assert row.errors_said == " (6 errors: KeyError, OSError, ValueError)"


async def test_bytes_written_are_the_commits_own_when_it_says_them() -> None:
    """The SPEC's and the FastAPI guide's commit, ``op.set(records=12, bytes=4096)`` around a step
    ``upload``: the table read records 12, bytes written ``-`` (only a ``write`` step's bytes were
    read). The commit's own figure counts; a commit that says its bytes and has a write step
    that says them too (the reference participants) counts them once; a commit that says none
    takes its write step's."""
    async with capture_events() as (bus, events):
        judge = Telemetry(bus, kind="judge", instance="judge-0")
        store = Telemetry(bus, kind="resources", instance="resources-0")
        with judge.operation("commit", checkpoint_id="c1") as op:
            with op.step("upload"):
                pass
            op.set(records=12, bytes=4096)
        for said in (True, False):
            with store.operation("commit", checkpoint_id="c1") as op:
                with op.step("write") as write:
                    write.set(records=3, bytes=300)
                op.set(records=3, bytes=300 if said else None)
    rows = {r.kind: r for r in breakdown(events)}
    assert (rows["judge"].records, rows["judge"].bytes) == (12, 4096)
    assert (rows[Kind.RESOURCES].records, rows[Kind.RESOURCES].bytes) == (6, 600)


async def test_a_users_step_named_as_an_operation_has_a_column_of_its_own() -> None:
    """A judge's commit with a step ``commit`` (its database's own): the step's time was added to
    the commit operation's column (a 30 ms commit read 40), and the step had no column. Kinds and
    steps are open names, so ``commit`` is a valid step: it is its own column, ``commit (step)``."""
    async with capture_events() as (bus, events):
        judge = Telemetry(bus, kind="judge", instance="judge-0")
        with judge.operation("commit", checkpoint_id="c1") as op, op.step("commit"):
            pass
    (row,) = breakdown(events)
    (commit,) = [e for e in events if e.__class__.__name__ == "OperationFinished"]
    (step,) = [e for e in events if e.__class__.__name__ == "StepFinished"]
    assert row.ms == {
        "commit": (commit.end_ns - commit.start_ns) / 1e6,
        "commit (step)": (step.end_ns - step.start_ns) / 1e6,
    }
