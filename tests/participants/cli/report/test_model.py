"""The report's model (``participants.cli.report.model``): a trace's spans as a tree, children
after their parents. Where its time went: ``test_attribution.py``; its terminal view:
``test_terminal.py``."""

from __future__ import annotations

from ckpt_events.participants.cli.report.model import checkpoint_and_restore, trace_spans
from ckpt_events.participants.cli.report.paths import on_critical_path
from tests.participants.cli.report_events import checkpoint_and_restore as emit


async def test_children_follow_their_parents_in_start_order() -> None:
    """Each span comes right after its parent or an earlier sibling's subtree; siblings by start time."""
    events = await emit()
    spans = trace_spans(events, checkpoint_and_restore(events)[0])  # type: ignore[arg-type]
    assert spans[0].name == "gym.checkpoint.collection.checkpoint" and spans[0].depth == 0
    seen = {spans[0].span_id}
    for before, span in zip(spans, spans[1:], strict=False):
        assert span.parent_span_id in seen and span.depth <= before.depth + 1
        seen.add(span.span_id)
    siblings = [s for s in spans if s.depth == 1]
    expected = ["prepare", "commit", "renew", "publish", "resume"]
    assert [s.short.rsplit(".", 1)[-1] for s in siblings] == expected
    assert [s.start_ns for s in siblings] == sorted(s.start_ns for s in siblings)
    # The critical path holds the root and, walking back from its end, the resume that ended last.
    critical = on_critical_path(spans)
    last_resume = max((s for s in spans if s.short == "resume"), key=lambda s: s.end_ns)
    resume_stage = next(s for s in spans if s.short == "coordinate.resume")
    assert {spans[0].span_id, resume_stage.span_id, last_resume.span_id} <= critical
