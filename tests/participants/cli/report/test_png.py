"""The HTML report in a real browser (headless Chromium), and the PNG written by extension."""

from __future__ import annotations

import html
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ckpt_events.participants.cli.report.files import write_report
from ckpt_events.participants.cli.report.html import html_page, waterfall_svg
from ckpt_events.participants.cli.report.model import Span, finished_spans
from ckpt_events.participants.cli.report.png import browser_command, find_browser, screenshot
from ckpt_events.participants.cli.words import milliseconds
from ckpt_events.participants.errors import CommandError
from tests.participants.cli.report_events import checkpoint_and_restore as emit

BROWSER = find_browser()
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium on PATH (Debian: apt-get install chromium)"
)
PNG = b"\x89PNG\r\n\x1a\n"


def _dom(page: Path, profile: Path) -> str:
    assert BROWSER is not None
    command = browser_command(BROWSER, f"--user-data-dir={profile}", "--dump-dom", page.as_uri())
    run = subprocess.run(command, capture_output=True, timeout=60, check=True)
    return run.stdout.decode()


@needs_browser
async def test_page_in_chromium_shows_every_span_and_the_restore(tmp_path: Path) -> None:
    """After its script ran, the DOM holds every span of the log with its duration, both waterfalls,
    the attribution lines and the participant table; screenshots at 1000 and 1600 px render."""
    events = await emit()
    page = tmp_path / "report.html"
    page.write_text(html_page(events, title="browser test"))
    assert re.search(r"\b(src|href)=|@import|url\(", page.read_text()) is None  # nothing to fetch
    dom = _dom(page, tmp_path / "profile")
    spans = finished_spans(events)
    assert re.search(rf'data-ready="{len(spans)}"', dom), "the page's script did not run over every span"
    for e in spans:
        ms = (e.end_ns - e.start_ns) / 1e6
        assert re.search(rf'data-span-id="{e.span_id:016x}" data-ms="{ms:.2f}"', dom), e
        assert milliseconds(ms) in dom  # as the page says it: 0.56 ms, never 0.6 or 0.0
    assert '<section id="checkpoint">' in dom and '<section id="restore">' in dom
    restore = dom[dom.index('<section id="restore">') :]
    assert "collection.restore" in restore and "coordinate.restore" in restore and "read" in restore
    assert html.unescape(dom).count("ms unattributed") == 2 and 'id="participants"' in dom
    for width in (1000, 1600):
        shot = tmp_path / f"report-{width}.png"
        screenshot(page, shot, width=width, height=1800)
        assert shot.read_bytes()[:8] == PNG and shot.stat().st_size > 20_000


@needs_browser
async def test_png_by_extension_is_a_rendered_png(tmp_path: Path) -> None:
    """A .png report is a real PNG, and says which browser drew it."""
    events = await emit()
    said = write_report(tmp_path / "report.png", events, title="png")
    assert (tmp_path / "report.png").read_bytes()[:8] == PNG and "headless chromium" in said.lower()


#: Measures, once the SVG is laid out, how far right the furthest label of the label column
#: reaches (x under 300 marks a label; bars start at 380, their ms texts further right).
_MEASURE = """<script>
let right = 0;
document.querySelectorAll('svg > text').forEach(function (t) {
  const box = t.getBBox();
  if (box.x < 300) { right = Math.max(right, box.x + box.width); }
});
document.body.dataset.labelsEnd = String(Math.ceil(right));
</script>"""


@needs_browser
def test_a_long_instance_name_stays_in_the_label_column(tmp_path: Path) -> None:
    """SVG text does not wrap: a 90-character instance name (a pod name with its namespace and
    cluster) ran 300 px over the bars. Each label stays left of the bars (380 px), keeps the
    name's end, where instances differ, and holds the whole name in its hover title."""
    ms = 1_000_000
    long = "environment/environment-worker-7f9c8d6b5d-x2x9k.checkpointing.prod-cluster-us-east-1-az3"
    spans = [
        Span("gym.checkpoint.collection.checkpoint", "controller", 0, 10 * ms, 0, False, 1),
        Span("gym.checkpoint.coordinate.commit", "controller", ms, 9 * ms, 1, False, 2, 1, client=True),
        Span("gym.checkpoint.commit", long, 2 * ms, 8 * ms, 2, False, 3, 2),
        Span("gym.checkpoint.write", long, 3 * ms, 7 * ms, 3, False, 4, 3),
    ]
    svg = waterfall_svg(spans, title="long names")
    assert (
        svg.count(f"<title>commit  {long}</title>") == 1 and svg.count(f"<title>write  {long}</title>") == 1
    )
    assert (
        len(
            re.findall(
                r"<text [^>]*><title>[^<]*</title>(?:commit|write)  environment/[^<]*…[^<]*-az3</text>", svg
            )
        )
        == 2
    )
    page = tmp_path / "labels.html"
    page.write_text(f"<!doctype html><html><body style='margin:0;width:1350px'>{svg}{_MEASURE}</body></html>")
    end = re.search(r'data-labels-end="(\d+)"', _dom(page, tmp_path / "profile"))
    assert end is not None and 0 < int(end.group(1)) < 380, end


@needs_browser
def test_a_browser_that_never_finishes_is_one_line_and_stopped(tmp_path: Path) -> None:
    """Chromium waiting on a page that never loads (an image from a loopback socket that never
    answers) is stopped at the deadline and said in one line, not a ``TimeoutExpired``
    traceback; no browser process is left behind."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        page = tmp_path / "never.html"
        page.write_text(f"<!doctype html><img src='http://127.0.0.1:{listener.getsockname()[1]}/x.png'>")
        started = time.monotonic()
        with pytest.raises(CommandError) as raised:
            screenshot(page, tmp_path / "never.png", width=400, height=300, timeout_s=3)
    assert time.monotonic() - started < 20
    said = str(raised.value)
    assert "\n" not in said and "after 3 s and was stopped" in said and "never.html" in said
    assert not (tmp_path / "never.png").exists()
    assert _running_with(page.as_uri().encode()) == []


def _running_with(argument: bytes) -> list[str]:
    """The pids of processes with ``argument`` in their command line (Linux's ``/proc``)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and argument in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:  # ended while we looked
            continue
    return found
