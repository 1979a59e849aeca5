"""The report as one HTML page (``participants.cli.report.html``): the checkpoint's and the restore's
waterfalls and attribution, the table, nothing fetched from elsewhere, the title escaped."""

from __future__ import annotations

import re

from ckpt_events.participants.cli.report.html import html_page
from tests.participants.cli.report_events import checkpoint_and_restore as emit


async def test_a_page_holds_both_waterfalls_the_table_and_no_external_resource() -> None:
    """One SVG waterfall each for the checkpoint and the restore, every participant named, and
    no src or href leading off the page (it opens offline)."""
    events = await emit()
    page = html_page(events, title="a report")
    assert page.count("<svg") >= 2
    assert "<h2>checkpoint" in page and "<h2>restore" in page
    for instance in ("environment-0", "model-0", "agent-0", "resources-0"):
        assert instance in page
    assert "ms unattributed" in page
    assert re.findall(r"""(?:src|href)=["']?(?:https?:)?//""", page) == []


async def test_the_title_is_escaped() -> None:
    """A title with markup in it is text on the page, not markup."""
    page = html_page(await emit(), title="<script>alert(1)</script>")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
