"""Where a checkpoint's time went (``participants.cli.report.attribution``): every millisecond
attributed to one part, the parts adding up to the root's time. Its terminal view:
``test_terminal.py``."""

from __future__ import annotations

import re

from ckpt_events import CollectionFinished
from ckpt_events.participants.cli.report.attribution import attribute
from ckpt_events.participants.cli.report.model import Span, checkpoint_and_restore, trace_spans
from ckpt_events.vocab import CollectionAction
from tests.participants.cli.report_events import checkpoint_and_restore as emit


def _numbers(line: str) -> list[float]:
    return [float(n) for n in re.findall(r"([\d.]+) ms", line)]


def _uncovered_ms(spans: list[Span]) -> float:
    """The root's time that none of its children covers, by a walk of its own (not the sweep)."""
    root, covered_to, gaps = spans[0], spans[0].start_ns, 0
    for child in sorted((s for s in spans if s.depth == 1), key=lambda s: s.start_ns):
        gaps += max(0, child.start_ns - covered_to)
        covered_to = max(covered_to, child.end_ns)
    return (gaps + max(0, root.end_ns - covered_to)) / 1e6


async def test_attribution_line_adds_up_to_the_root_span() -> None:
    """N = M + K + L + U within 1%, N is the collection span's duration, and each part is where it belongs."""
    events = await emit()
    checkpoint, restore = checkpoint_and_restore(events)
    for trace_id, action in ((checkpoint, CollectionAction.CHECKPOINT), (restore, CollectionAction.RESTORE)):
        assert trace_id is not None
        (root,) = [e for e in events if isinstance(e, CollectionFinished) and e.trace_id == trace_id
                   and e.action is action]  # fmt: skip
        spans = trace_spans(events, trace_id)
        attribution = attribute(spans)
        assert attribution is not None
        # Unattributed is exactly the time between the controller's spans, nothing else.
        assert abs(attribution.unattributed_ms - _uncovered_ms(spans)) < 1e-9
        total, handlers, transit, controller, unattributed = _numbers(attribution.line())
        assert abs(total - (root.end_ns - root.start_ns) / 1e6) <= 0.05
        assert abs(handlers + transit + controller + unattributed - total) <= total / 100
        assert handlers > 0 and transit > 0 and attribution.unattributed_share < 0.05
        assert attribution.max_loop_lag_ms == 1.5
    parts = attribute(trace_spans(events, checkpoint)).parts  # type: ignore[union-attr]
    assert parts["controller (collection.publish)"] >= 2.5  # publishing is named, not a gap
    assert parts["queued in participants"] >= 0.3 * 16  # 16 calls queued >= 0.5 ms each (minus rounding)
    # The pause after resume is the only unnamed time (and the clock's 1 us per reading).
    assert 0.3 <= parts["unattributed"] < 0.31


def test_a_participants_operation_at_a_rounding_tie_prints_one_figure_for_total_and_handlers() -> None:
    """A 27 500 ns commit with a 1 000 ns step: all of it is handler time, so its total and its
    handlers must print the same. The handlers were a float sum of the sweep's pieces, 1000 +
    1000 + 25 500 ns read 0.027499999999999997 ms, printed ``0.027 ms`` beside the total's
    ``0.028 ms``; they are summed in whole nanoseconds now, exactly the total's 27 500."""
    start = 1_764_000_000_000_000_000
    root = Span("gym.checkpoint.commit", "judge-0", start, start + 27_500, 0, False, span_id=1)
    step = Span(
        "gym.checkpoint.upload",
        "judge-0",
        start + 1_000,
        start + 2_000,
        1,
        False,
        span_id=2,
        parent_span_id=1,
    )
    attribution = attribute([root, step])
    assert attribution is not None and not attribution.coordinated
    assert attribution.handlers_ms == attribution.total_ms == 27_500 / 1e6
    assert _numbers(attribution.line()) == [0.028, 0.028]
