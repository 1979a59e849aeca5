"""The report's model (``participants.cli.report.model``): every millisecond attributed, children
after their parents. Its terminal view: ``test_terminal.py``."""

from __future__ import annotations

import re

from ckpt_events import CollectionFinished
from ckpt_events.participants.cli.report.model import attribute, checkpoint_and_restore, trace_spans
from ckpt_events.participants.cli.report.paths import on_critical_path
from ckpt_events.vocab import CollectionAction
from tests.participants.cli.report_events import checkpoint_and_restore as emit


def _numbers(line: str) -> list[float]:
    return [float(n) for n in re.findall(r"([\d.]+) ms", line)]


async def test_attribution_line_adds_up_to_the_root_span() -> None:
    """N = M + K + L + U within 1%, N is the collection span's duration, and each part is where it belongs."""
    events = await emit()
    checkpoint, restore = checkpoint_and_restore(events)
    for trace_id, action in ((checkpoint, CollectionAction.CHECKPOINT), (restore, CollectionAction.RESTORE)):
        assert trace_id is not None
        (root,) = [e for e in events if isinstance(e, CollectionFinished) and e.trace_id == trace_id
                   and e.action is action]  # fmt: skip
        attribution = attribute(trace_spans(events, trace_id))
        assert attribution is not None
        total, handlers, transit, controller, unattributed = _numbers(attribution.line())
        assert abs(total - (root.end_ns - root.start_ns) / 1e6) <= 0.05
        assert abs(handlers + transit + controller + unattributed - total) <= total / 100
        assert handlers > 0 and transit > 0 and attribution.unattributed_share < 0.05
        assert attribution.max_loop_lag_ms == 1.5
    spans = trace_spans(events, checkpoint)  # type: ignore[arg-type]
    parts = attribute(spans).parts  # type: ignore[union-attr]
    assert parts["controller (collection.publish)"] >= 2.5  # publishing is named, not a gap
    assert parts["queued in participants"] >= 0.3 * 16  # 16 calls queued >= 0.5 ms each (minus rounding)
    assert parts["unattributed"] >= 0.2  # the pause after resume is the only unnamed time


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
