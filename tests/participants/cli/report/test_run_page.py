"""The run's HTML page from a real run: the strip of checkpoints linked to their rows and its
legend, the table linked to each waterfall, the trends collapsed after them; every string from
the log escaped; rendered by Chromium."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_events import Refused
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.events import event_time
from ckpt_events.participants.cli.report.html import FILLS
from ckpt_events.participants.cli.report.png import screenshot
from ckpt_events.participants.cli.report.run_page import OUTCOME_FILLS
from ckpt_events.participants.workloads.registry import OTHER_COLOURS
from ckpt_events.vocab import ErrorCode, Kind
from tests.participants.cli.report.test_png import PNG, _dom, needs_browser
from tests.participants.cli.report.test_run_report import _write

HOSTILE = '"><img src=x onerror=alert(1)><script>alert(2)</script>'


def _hostile(events: list[Any]) -> list[Any]:
    """c1 renamed to markup, as a log could carry it."""
    return [
        msgspec.structs.replace(e, checkpoint_id=HOSTILE + "c1") if e.checkpoint_id == "c1" else e
        for e in events
    ]


async def test_run_page_links_strip_rows_and_waterfalls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    log = tmp_path / "run.jsonl"
    _write(log, _hostile(aborted_run))
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    assert "HTML page: the run overview and 4 waterfalls" in capsys.readouterr().out
    text = page.read_text()
    assert HOSTILE not in text and "<script>alert" not in text and "<img" not in text
    assert html_escaped(HOSTILE) in text
    strip = re.findall(
        r'<a href="#row-(\d+)"><rect class="checkpoint" data-row="\d+" data-outcome="([^"]+)"', text
    )
    assert strip == [("1", "published"), ("2", "published"), ("3", "aborted"), ("4", "aborted")]
    for n in range(1, 5):
        assert f'<tr id="row-{n}">' in text and f'<a href="#detail-{n}">waterfall</a>' in text
        assert f'<section id="detail-{n}">' in text
    # The overview comes first, then the waterfalls in row order, then the trends (collapsed).
    order = [
        text.index(s)
        for s in (
            'class="strip"',
            'id="strip-legend"',
            'id="overview"',
            'id="detail-1"',
            'id="detail-4"',
            '<details id="trends-details">',
            'id="trends"',
        )
    ]
    assert order == sorted(order)
    lease = text[text.index('<section id="detail-4">') :]
    assert "lease expired on model/model-0 in phase prepared" in lease
    # Nothing to fetch: every link is to an anchor of the page.
    assert re.search(r'\b(?:src|href)=(?!"#)', text.replace(html_escaped(HOSTILE), "")) is None


def html_escaped(text: str) -> str:
    return html.escape(text, quote=True)


@needs_browser
async def test_run_page_renders_in_chromium(tmp_path: Path, aborted_run: list[Any]) -> None:
    log = tmp_path / "run.jsonl"
    _write(log, _hostile(aborted_run))
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    dom = _dom(page, tmp_path / "profile")
    assert "<img" not in dom and "alert(2)" not in dom.replace(html_escaped("<script>alert(2)</script>"), "")
    ready = re.search(r'data-ready="(\d+)"', dom)
    assert ready is not None and int(ready.group(1)) > 20, "the page's script did not run over the waterfalls"
    assert dom.count('class="checkpoint"') == 4
    shot = tmp_path / "run.png"
    screenshot(page, shot, width=1400, height=1600)
    assert shot.read_bytes()[:8] == PNG and shot.stat().st_size > 20_000


#: Markup a missed escape would let through: a script that renames the page, and an element whose
#: handler adds one; under the page's Content-Security-Policy neither runs.
SPLICED = (
    "<script>document.title='pwned'</script>"
    "<img src=x onerror=\"document.body.appendChild(document.createElement('mark')).id='pwned'\">"
)


@needs_browser
@pytest.mark.parametrize("chosen", [[], ["--checkpoint", "c2"]], ids=["run page", "one checkpoint's page"])
async def test_a_script_a_missed_escape_let_in_does_not_run(
    tmp_path: Path, aborted_run: list[Any], chosen: list[str]
) -> None:
    """Both HTML pages carry a Content-Security-Policy that lets only their own script run: markup
    spliced in raw (as a missed escape would put it) neither retitles the page nor adds an element,
    while the page's own tooltip script still runs. Without it, both ran."""
    log = tmp_path / "run.jsonl"
    _write(log, aborted_run)
    page = tmp_path / "run.html"
    assert main(["report", str(log), *chosen, "--report", str(page)]) == 0
    text = page.read_text()
    assert text.count("Content-Security-Policy") == 1
    assert text.index("Content-Security-Policy") < text.index("<title>")  # governs all that follows
    page.write_text(text.replace("<h1>", SPLICED + "<h1>", 1))
    dom = _dom(page, tmp_path / "profile")
    assert "pwned" not in re.sub(r"<script>.*?</script>|<img[^>]*>", "", dom, flags=re.DOTALL)
    assert re.search(r"<title>report of run\.jsonl</title>", dom)
    ready = re.search(r'data-ready="(\d+)"', dom)
    assert ready is not None and int(ready.group(1)) > 0, "the page's own script was blocked too"


async def test_run_page_reads_at_a_glance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    """Without a browser: outcome colours are none of the participants' colours; the strip has a
    legend naming every outcome, each waterfall a legend naming every kind and the critical
    path; the trends table sits in a ``<details>`` after the first waterfall."""
    assert not set(OUTCOME_FILLS.values()) & set(FILLS.values())
    assert not set(OTHER_COLOURS) & (set(FILLS.values()) | set(OUTCOME_FILLS.values()))
    assert len(set(OUTCOME_FILLS.values())) == len(OUTCOME_FILLS)
    assert len(set(OTHER_COLOURS)) == len(OTHER_COLOURS)
    log = tmp_path / "run.jsonl"
    _write(log, aborted_run)
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    text = page.read_text()
    legend = re.search(r'<div class="legend" id="strip-legend">(.*?)</div>', text)
    assert legend is not None
    for outcome, fill in OUTCOME_FILLS.items():
        assert f'data-outcome="{outcome}"><i class="swatch" style="background:{fill}">' in legend.group(1)
    strip_fills = set(re.findall(r'<rect class="checkpoint"[^>]* fill="(#[0-9a-f]{6})"', text))
    assert strip_fills and strip_fills <= set(OUTCOME_FILLS.values())
    waterfalls = re.findall(r'<g class="legend">(.*?)</g>', text, re.S)
    # Every waterfall (a row run by a bare coordinator has one per coordinate operation).
    assert len(waterfalls) == text.count('preserveAspectRatio="xMinYMin meet"') >= 4
    for kind in FILLS:
        assert f">{kind}</text>" in waterfalls[0]
    assert "critical path" in waterfalls[0]
    details = text[text.index("<details") : text.index("</details>")]
    assert "<summary>" in details and 'id="trends"' in details and "<details open" not in text
    assert text.index('<section id="detail-1">') < text.index("<details") < text.index('id="trends"')


async def test_run_page_says_the_terminals_run_wide_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    """Refusals that named no checkpoint (401s before the body was read) were a yellow line in the
    terminal and nowhere on the run's page; the fleet's pause total was missing from it too."""
    last = max(event_time(e) for e in aborted_run)
    refusals = [Refused(Kind.AGENT, "agent-0", last + i, ErrorCode.UNAUTHORIZED) for i in range(3)]
    log = tmp_path / "run.jsonl"
    _write(log, [*aborted_run, *refusals])
    assert main(["report", str(log)]) == 0
    terminal = capsys.readouterr().out
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    text = page.read_text()
    run = text[text.index("<section id='run'>") : text.index('<section id="detail-1">')]
    lines = re.findall(r'<p class="run-line( warning)?">([^<]*)</p>', run)
    said = [(bool(warning), html.unescape(line)) for warning, line in lines]
    assert (True, "3 refusals without a checkpoint id: unauthorized (401) 3 on agent/agent-0") in said
    assert [line for _, line in said if line.startswith("checkpointing paused the fleet")]
    for _, line in said:  # each is what the terminal printed (its table wraps, its lines do not)
        assert line[:60] in " ".join(terminal.split())
