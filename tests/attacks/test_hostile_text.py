"""Issue 29's hostile log: a kind, an instance name, a checkpoint id, a step and an error message
holding ``ESC[2J`` (clear the screen), an OSC window title, a C1 CSI, an OSC 8 link, a bidi
override, a zero-width space and rich markup, and a corrupt line holding the raw bytes. Every
renderer that reads the log (the report on the terminal and as files, ``diff``, ``watch``) writes
no control byte of it, with colour off or forced, and shows the payload in its visible form: the
report printed them raw (20 ESC bytes on a pipe with ``NO_COLOR=1``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import anyio
import msgspec
import pytest

from ckpt_events import Bus, OperationStarted, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import Kind, Operation

#: Stands for the payload while the log is written by the real sink (names must be safe there:
#: lower case, as a kind's and a step's must be).
MARK = "hostilemark"
#: The payload as JSON escapes: CSI clear screen, OSC title ended by BEL, C1 CSI, OSC 8 ended by
#: ST, a right-to-left override and a zero-width space, then rich markup (an OSC 8 link if obeyed).
PAYLOAD = (
    rb"\u001b[2J\u001b]0;owned\u0007\u009b31m\u001b]8;;http://x\u001b\\\u202e\u200b"
    rb"[link=http://evil]lure[/link][reverse]"
)
#: Control characters that must never come out (ESC, BEL, and the C1 CSI, ST and OSC), and the
#: format characters that reorder or hide text.
CONTROL = ("\x1b", "\x07", "\x9b", "\x9c", "\x9d", "\u202e", "\u200b")
#: How the payload must be shown instead (pieces of it: a long name may be folded in a table).
VISIBLE = ("\\x1b[2J", "\\x1b]0;owned\\x07", "\\x9b31m", "\\u202e\\u200b", "[link=http://evil]lure[/link]")
#: Rich's own styling with colour forced: SGR sequences only.
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _hostile(text: str) -> str:
    """``text`` with ``MARK`` replaced by the decoded payload."""
    payload: str = msgspec.json.decode(b'"' + PAYLOAD + b'"')
    return text.replace(MARK, payload)


async def _events(log: Path) -> None:
    """A published checkpoint, one whose commit failed, a refusal, and a prepare still open."""
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        controller = Telemetry(bus, kind="controller", instance=f"controller-{MARK}")
        environment = Telemetry(bus, kind="environment", instance=f"environment-{MARK}")
        judge = Telemetry(bus, kind=f"judge-{MARK}", instance=f"judge-{MARK}")
        for n in range(2):
            checkpoint_id = f"c{n}-{MARK}"
            with controller.collection("checkpoint", checkpoint_id=checkpoint_id) as collection:
                with controller.coordinate(
                    "prepare", checkpoint_id=checkpoint_id, parent=collection
                ) as coord:
                    with environment.operation(
                        "prepare", checkpoint_id=checkpoint_id, traceparent=coord.traceparent()
                    ):
                        time.sleep(0.001)
                try:
                    with controller.coordinate(
                        "commit", checkpoint_id=checkpoint_id, parent=collection
                    ) as coord:
                        with environment.operation(
                            "commit", checkpoint_id=checkpoint_id, traceparent=coord.traceparent()
                        ) as operation:
                            with operation.step("write"):
                                time.sleep(0.001)
                        with judge.operation(
                            "commit", checkpoint_id=checkpoint_id, traceparent=coord.traceparent()
                        ) as operation:
                            with operation.step(f"score-{MARK}"):
                                time.sleep(0.001)
                            if n == 1:
                                raise OSError(f"disk {MARK} full")
                except OSError:
                    pass
        environment.refused("unauthorized", checkpoint_id=f"c1-{MARK}")
        bus.emit(
            OperationStarted(
                kind=Kind.ENVIRONMENT,
                instance=f"environment-{MARK}",
                trace_id=7,
                span_id=7,
                start_ns=time.time_ns(),
                operation=Operation.PREPARE,
                checkpoint_id=f"c2-{MARK}",
            )
        )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """The hostile log: the real sink's lines with the payload put in, then a corrupt line."""
    path = tmp_path / f"environment-{MARK}.jsonl"
    anyio.run(_events, path)
    written = path.read_bytes()
    assert written.count(MARK.encode()) > 10
    path.write_bytes(
        written.replace(MARK.encode(), PAYLOAD) + b'{"instance":"\x1b]0;owned\x07\x1b[2J\xc2\x9b"\n'
    )
    return path


def _leaks(text: str) -> list[str]:
    return [repr(c) for c in CONTROL if c in text]


def _hidden(text: str) -> list[str]:
    """The pieces of the payload's visible form that ``text`` does not show."""
    return [piece for piece in VISIBLE if piece not in text]


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped output this wide folds no name, so each visible piece is on one line; no colour."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


def _strings(value: object) -> set[str]:
    """Every string in a decoded JSON document, keys and values."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in value.items()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    return set()


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out + err


def test_the_reports_terminal_output_holds_no_control_byte(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report LOG``: the overview, the details of the failed checkpoint and of the open one,
    and the corrupt line's notice; the payload shown in its visible form."""
    text = _run(["report", str(log)], capsys)
    assert "environment-" in text and "corrupt line skipped" in text
    assert _leaks(text) == []
    assert _hidden(text) == []


def test_one_checkpoints_report_holds_no_control_byte(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``report LOG --checkpoint ID`` with the hostile id itself: the per-participant table, the
    waterfall's labels, the hostile kind and step."""
    text = _run(["report", str(log), "--checkpoint", _hostile(f"c1-{MARK}")], capsys)
    assert "commit" in text and "\\x1b[2J\\x1b]0;owned" in text.split("waterfall", 1)[1]
    assert _leaks(text) == []
    assert _hidden(text) == []


def test_an_unknown_checkpoint_is_refused_naming_the_known_ones_escaped(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report LOG --checkpoint nope``: the refusal names the log's ids, escaped."""
    assert main(["report", str(log), "--checkpoint", "nope"]) != 0
    err = capsys.readouterr().err
    assert "no checkpoint 'nope'" in err and "c0-\\x1b[2J" in err
    assert _leaks(err) == []


def test_with_colour_forced_only_riches_own_styling_comes_out(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FORCE_COLOR=1``: rich's SGR sequences are expected, and nothing else: no OSC, no clear
    screen, no BEL, no C1, no format character; the payload shown in its visible form."""
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    for argv in (["report", str(log)], ["report", str(log), "--checkpoint", _hostile(f"c1-{MARK}")]):
        text = _run(argv, capsys)
        assert _SGR.search(text), "colour was not forced: the test would prove nothing"
        assert "\x1b]" not in text and "\x1b[2J" not in text
        assert _leaks(_SGR.sub("", text)) == []
        assert _hidden(_SGR.sub("", text)) == []


def test_the_real_command_on_a_pipe_writes_no_escape_byte(log: Path) -> None:
    """``python -m ckpt_events.participants.cli.main report LOG`` in its own process, stdout and
    stderr on a pipe with ``NO_COLOR=1``: not one ESC, BEL or C1 byte (it wrote 20 ESC bytes)."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400", "PYTHONWARNINGS": "ignore"}
    env.pop("FORCE_COLOR", None)
    for chosen in ([], ["--checkpoint", _hostile(f"c1-{MARK}")]):
        run = subprocess.run(
            [sys.executable, "-m", "ckpt_events.participants.cli.main", "report", str(log), *chosen],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr.decode(errors="replace")
        both = run.stdout + run.stderr
        assert b"environment-" in both
        found = {name: both.count(byte) for name, byte in (("ESC", b"\x1b"), ("BEL", b"\x07"))}
        assert found == {"ESC": 0, "BEL": 0}
        assert _leaks(both.decode()) == []


@pytest.mark.parametrize(
    ("name", "one_checkpoint"),
    [("run.html", False), ("one.html", True), ("run.svg", False), ("run.perfetto.json", False)],
)
def test_report_files_hold_no_control_byte(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, one_checkpoint: bool
) -> None:
    """``report LOG --report FILE``: what lands in the file (opened in a browser, or cat to a
    terminal) holds no control byte of the log either; each SVG in it is well-formed XML (a C0
    control is not allowed in XML), and the JSON reads back with the payload intact."""
    out = tmp_path / name
    chosen = ["--checkpoint", _hostile(f"c1-{MARK}")] if one_checkpoint else []
    _run(["report", str(log), *chosen, "--report", str(out)], capsys)
    text = out.read_text(encoding="utf-8")
    assert _leaks(text) == []
    if name.endswith(".json"):
        assert text.isascii()  # json.dumps wrote every control and format character as an escape
        assert _hostile(f"c1-{MARK}") in _strings(json.loads(text))
        return
    assert _hidden(text) == []
    svgs = re.findall(r"<svg\b.*?</svg>", text, flags=re.DOTALL)
    assert svgs
    for svg in svgs:
        ET.fromstring(svg)  # raises ParseError on a control character or stray markup


def test_diff_holds_no_control_byte(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``diff LOG LOG``: kinds, operations and steps from the log (the hostile kind and step)."""
    text = _run(["diff", str(log), str(log)], capsys)
    assert "commit" in text and "judge-\\x1b[2J" in text and "score-\\x1b[2J" in text
    assert _leaks(text) == []
    assert _hidden(text) == []


def test_watch_following_the_log_holds_no_control_byte(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``watch --follow LOG --once``: the open prepare and the finished work of the hostile
    instance, shown escaped."""
    text = _run(["watch", "--follow", str(log), "--once"], capsys)
    assert "environment-" in text
    assert _leaks(text) == []
