"""The library's own loggers (``ckpt_events._logs``): an exception said within bounds and without
credentials, the caller's file and line kept, and a user's handler that raises contained."""

from __future__ import annotations

import ast
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_events import Bus, Event, Telemetry
from ckpt_events._logs import LOGGED_MESSAGE_CHARS, fit_for_log, library_logger, said_in_log
from ckpt_events.sinks._logging_sink import DEFAULT_LOGGER
from ckpt_events.testing import MemorySink

SECRET_URL = "https://alice:hunter2@collector.example/v1/traces"
#: A sink's error quoting a request: a credential in a URL, a header and a pair, then a payload.
LOUD = (
    f"POST {SECRET_URL} failed; Authorization: Bearer sk-live-0123456789 token=abc123 body: "
    + "x" * 1_000_000
)


class Loud:
    """A sink whose every batch fails with ``LOUD``, raised from a cause of its own."""

    def handle(self, batch: list[Event]) -> None:
        try:
            raise ConnectionError(f"connect to {SECRET_URL} refused")
        except ConnectionError as exc:
            raise ValueError(LOUD) from exc


@pytest.fixture
def formatted() -> Iterator[io.StringIO]:
    """What a plain ``StreamHandler`` on ``ckpt_events`` writes, traceback and all."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(filename)s:%(funcName)s %(message)s"))
    root = logging.getLogger("ckpt_events")
    root.addHandler(handler)
    try:
        yield out
    finally:
        root.removeHandler(handler)


async def test_a_failing_sinks_record_is_bounded_and_holds_no_credential(formatted: io.StringIO) -> None:
    """A sink raising a megabyte message with credentials in it: its one record is a few KB, with
    its class, its traceback (the sink's frame) and its cause, and none of the credentials (it was
    1,000,5xx characters, the password, the token and the pair's value in it verbatim)."""
    async with Bus(batch_interval=0) as bus:
        bus.subscribe(Loud(), name="loud")
        tel = Telemetry(bus, kind="resources", instance="r0")
        for _ in range(50):
            tel.refused("stale_attempt")
        await bus.flush()
    text = formatted.getvalue()
    assert len(text) < 4 * LOGGED_MESSAGE_CHARS + 3000
    for secret in ("hunter2", "sk-live-0123456789", "abc123"):
        assert secret not in text
    assert text.count("failed to handle a batch") == 1
    assert "ckpt_events ERROR _sink_watch.py:count_failure sink 'loud'" in text
    assert "ValueError: POST https://[REDACTED]@collector.example/v1/traces failed" in text
    assert "(1,000,1" in text  # its size said where it was cut
    assert "ConnectionError: connect to https://[REDACTED]@collector.example" in text
    assert "The above exception was the direct cause" in text
    assert "in handle\n" in text  # the sink's own frame


def test_a_short_clean_exception_is_passed_as_it_is() -> None:
    """An exception with nothing to cut or redact is the record's own (a filter reading its class,
    an error tracker reporting it, see the very object)."""
    exc = OSError(28, "No space left on device")
    assert fit_for_log(exc) is exc


def test_a_stand_in_keeps_the_class_name_traceback_and_notes() -> None:
    """A stand-in says the original's class and module, keeps its traceback, and its notes cut."""
    try:
        raise KeyError("password=swordfish")
    except KeyError as exc:
        exc.add_note("n" * (LOGGED_MESSAGE_CHARS * 3))
        caught = exc
    stand_in = fit_for_log(caught)
    assert stand_in is not caught
    assert type(stand_in).__qualname__ == "KeyError" and type(stand_in).__module__ == "builtins"
    assert stand_in.__traceback__ is caught.__traceback__
    assert "swordfish" not in str(stand_in)
    (note,) = stand_in.__notes__
    assert len(note) < LOGGED_MESSAGE_CHARS + 40


def test_a_group_and_a_cycle_stay_bounded() -> None:
    """An exception group keeps its members (stood in for); a context cycle ends."""
    first, second = ValueError("a" * 10_000), RuntimeError("token=t0p")
    first.__context__, second.__context__ = second, first
    stand_in = fit_for_log(ExceptionGroup("two", [first, second]))
    assert isinstance(stand_in, ExceptionGroup) and len(stand_in.exceptions) == 2
    assert "t0p" not in str(stand_in.exceptions[1]) and len(str(stand_in.exceptions[0])) < 2100


def test_said_in_log_is_one_line_cut_and_redacted() -> None:
    """The text of an error for a log line: one line, at most ~300 characters, no credential."""
    said = said_in_log(RuntimeError(f"failed\nat {SECRET_URL}\n" + "y" * 10_000))
    assert "\n" not in said and "hunter2" not in said and len(said) < 400
    assert said.startswith("RuntimeError: failed at https://[REDACTED]@collector")


def test_a_record_names_its_caller() -> None:
    """``filename``, ``lineno`` and ``funcName`` are the caller's, not this module's."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("ckpt_events.test_logs")
    logger.addHandler(handler)
    try:
        library_logger("ckpt_events.test_logs").warning("said %d", 1)
    finally:
        logger.removeHandler(handler)
    (record,) = records
    said = (record.getMessage(), record.funcName, record.filename)
    assert said == ("said 1", "test_a_record_names_its_caller", "test_logs.py")


class Broken(logging.Handler):
    """A user's handler whose ``emit`` raises instead of calling ``handleError``."""

    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("handler broke")


async def test_a_raising_handler_does_not_take_the_bus_down(capsys: pytest.CaptureFixture[str]) -> None:
    """A user's handler raising as the bus logs a failed sink and a full buffer: the record is lost,
    said once on stderr; the bus, its healthy sink and the code inside ``async with`` go on (the
    handler's error raised out of the bus's task group, an ExceptionGroup out of ``async with``)."""
    logger = logging.getLogger("ckpt_events")
    broken = Broken()
    logger.addHandler(broken)
    healthy = MemorySink()
    try:
        async with Bus(batch_interval=0, buffer_size=10) as bus:
            bus.subscribe(Loud(), name="loud")
            bus.subscribe(healthy, name="healthy", buffer_size=1000)
            tel = Telemetry(bus, kind="resources", instance="r0")
            for _ in range(40):
                tel.refused("stale_attempt")  # past the loud sink's 10: drops said too
            await bus.flush()
            stats = bus.stats()
    finally:
        logger.removeHandler(broken)
    assert len(healthy.events) == 40
    assert stats.sink("loud").failed_batches >= 1
    err = capsys.readouterr().err
    assert err.count("--- Logging error") == 1
    assert "RuntimeError: handler broke" in err and "\n" == err[-1] and err.count("\n") == 1


def _logger_names() -> set[str]:
    """Every logger name the library and its harness log on, read from their source."""
    root = Path(__file__).resolve().parents[2]
    call = re.compile(r"""(?:library_logger|getLogger)\(\s*"([^"]+)"\s*\)""")
    names = set()
    for folder in ("ckpt_events", "sinks", "participants"):
        for path in (root / folder).rglob("*.py"):
            if path.is_symlink() or folder == "ckpt_events" and path.parent != root / "ckpt_events":
                continue  # sinks/ and participants/ are read from their own folders
            names |= set(call.findall(path.read_text(encoding="utf-8")))
    names.add(DEFAULT_LOGGER)
    return names


def test_every_logger_of_ours_is_under_ckpt_events_and_documented() -> None:
    """A user silencing ``ckpt_events`` silences us all, and docs/configuration.md lists each
    name (only five of the ten were named in the docs, scattered)."""
    names = _logger_names()
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "ckpt_events.sinks.otel" in names and len(names) >= 8  # the scan found them
    assert sorted(n for n in names if n.split(".")[0] != "ckpt_events") == []
    assert sorted(n for n in names if f"`{n}`" not in page) == []


def test_one_line_keeps_its_limit_whole_and_cuts_past_it_after_redacting() -> None:
    """``one_line`` (now ``fit_line`` over ``fit_text``) keeps a message of ``ONE_LINE_CHARS``
    whole, cuts a longer one to that many characters ending in ``...``, and redacts a credential
    across the cut whole; the bounds it had with its own redact-then-cut."""
    from ckpt_events._logs import ONE_LINE_CHARS, one_line

    assert one_line(ValueError("x" * ONE_LINE_CHARS)) == "ValueError: " + "x" * ONE_LINE_CHARS
    cut = one_line(ValueError("x" * (ONE_LINE_CHARS + 1)))
    assert cut == "ValueError: " + "x" * (ONE_LINE_CHARS - 3) + "..."
    across = one_line(ValueError("x" * (ONE_LINE_CHARS - 10) + " https://alice:hunter2@collector/v1"))
    assert len(across) == len("ValueError: ") + ONE_LINE_CHARS and across.endswith("...")
    assert "hunter2" not in across and "alice" not in across
    said = one_line(ValueError("POST https://alice:hunter2@collector failed\n  Bearer sk-live-1"))
    assert said == "ValueError: POST https://[REDACTED]@collector failed Bearer [REDACTED]"


def test_one_line_sayings_show_terminal_controls_as_escapes() -> None:
    """A message holding a clear screen, an OSC 8 link, BEL, a C1 CSI, a bidi override and a
    zero-width space: ``said_in_log``, ``one_line`` and ``fit_line`` kept all 7 raw (a log line
    on a terminal obeyed them); each is its escape now, after the redaction."""
    from ckpt_events._logs import fit_line, one_line

    message = "a\x1b[2J\x1b]8;;http://evil\x07b\x9b31m\u202ec\u200b https://alice:hunter2@collector"
    shown = r"a\x1b[2J\x1b]8;;http://evil\x07b\x9b31m\u202ec\u200b https://[REDACTED]@collector"
    assert said_in_log(RuntimeError(message)) == "RuntimeError: " + shown
    assert one_line(RuntimeError(message)) == "RuntimeError: " + shown
    assert fit_line(message, 300) == shown


def test_a_logged_traceback_shows_a_hostile_message_escaped(formatted: io.StringIO) -> None:
    """A short, credential-free message holding an OSC 8 link, a bidi override, a clear screen
    and a carriage return (a remote participant's error), logged with its traceback by a logger
    of ours, in itself, its cause and a note: the 3 messages' 15 ESC, 3 U+202E and 3 CR reached
    the handler raw (the terminal obeyed them). Now each is its escape; the traceback's own
    lines stay, a message's line breaks stay, and the caught exception is left as it was."""
    hostile = "no \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ \u202eexe.gnp \x1b[2J\rok"
    shown = r"no \x1b]8;;https://evil.example\x1b\click\x1b]8;;\x1b\ \u202eexe.gnp \x1b[2J\rok"
    try:
        try:
            raise OSError(f"cause: {hostile}")
        except OSError as cause:
            raise RuntimeError(f"refused\n{hostile}") from cause
    except RuntimeError as exc:
        exc.add_note(f"note: {hostile}")
        caught = exc
        library_logger("ckpt_events.probe").error("the participant refused", exc_info=True)
    text = formatted.getvalue()
    assert not any(char in text for char in "\x1b\u202e\r"), repr(text)
    assert f"RuntimeError: refused\n{shown}\nnote: {shown}\n" in text
    assert f"OSError: cause: {shown}\n" in text
    assert "The above exception was the direct cause" in text
    assert "in test_a_logged_traceback_shows_a_hostile_message_escaped\n" in text  # our frames
    assert str(caught) == f"refused\n{hostile}" and caught.__notes__ == [f"note: {hostile}"]
    assert str(caught.__cause__) == f"cause: {hostile}"


#: The methods through which a logger is handed an exception's traceback.
_LOGGING_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "log"})


def _source_files() -> list[Path]:
    """The library's and its harness's own source, each file once (sinks/ and participants/
    from their own folders, not through their links under ckpt_events/)."""
    root = Path(__file__).resolve().parents[2]
    files = [
        path
        for path in (root / "ckpt_events").rglob("*.py")
        if not any(
            (root / "ckpt_events" / part).is_symlink()
            for part in path.relative_to(root / "ckpt_events").parts[:1]
        )
    ]
    for folder in ("sinks", "participants"):
        files.extend((root / folder).rglob("*.py"))
    return sorted(files)


def _library_loggers(tree: ast.Module) -> set[str]:
    """The names ``tree`` makes at module level by ``library_logger``."""
    made: set[str] = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "library_logger"
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[union-attr]
            made |= {t.id for t in targets if isinstance(t, ast.Name)}
    return made


def _imported_library_loggers(tree: ast.Module) -> set[str]:
    """The names ``tree`` imports at module level from a module of ``ckpt_events`` that makes
    them by ``library_logger`` (the bus's one logger, ``_bus_log.py``)."""
    root = Path(__file__).resolve().parents[2]
    imported: set[str] = set()
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ckpt_events.")):
            continue
        path = root.joinpath(*str(node.module).split(".")).with_suffix(".py")
        made = _library_loggers(ast.parse(path.read_text(encoding="utf-8"))) if path.is_file() else set()
        imported |= {a.asname or a.name for a in node.names if a.name in made}
    return imported


def _unfitted_tracebacks(tree: ast.Module) -> list[int]:
    """Lines of ``tree`` handing a logger an exception (``exc_info=`` other than ``None`` or
    ``False``, or ``.exception()``) on a logger not made by ``library_logger`` at module level
    (here, or in a module of ours it is imported from), without passing it through ``fit_for_log``."""
    ours = _library_loggers(tree) | _imported_library_loggers(tree)
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in _LOGGING_METHODS or not node.args:
            continue  # not a logging call (a future's ``exception()`` takes no message)
        given = next((k.value for k in node.keywords if k.arg == "exc_info"), None)
        if given is None and node.func.attr != "exception":
            continue
        if isinstance(given, ast.Constant) and given.value in (None, False):
            continue
        fitted = (
            isinstance(given, ast.Call)
            and isinstance(given.func, ast.Name)
            and given.func.id == "fit_for_log"
        )
        on_ours = isinstance(node.func.value, ast.Name) and node.func.value.id in ours
        if not (fitted or on_ours):
            lines.append(node.lineno)
    return lines


def test_every_logged_traceback_goes_through_the_redact_and_escape_path() -> None:
    """Each ``exc_info=`` or ``.exception()`` in the library, its sinks and its participants is
    on a ``library_logger`` (whose records carry ``fit_for_log``'s stand-in) or hands it
    ``fit_for_log(exc)``: one on a plain ``logging.getLogger`` would log a credential or a
    terminal control in an exception's message raw."""
    files = _source_files()
    found = {str(p): _unfitted_tracebacks(ast.parse(p.read_text(encoding="utf-8"))) for p in files}
    assert len(files) > 100 and sum(p.name == "_subscription.py" for p in files) == 1  # the scan found them
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_the_sweep_catches_a_plain_logger() -> None:
    """The sweep above flags a traceback on a plain logger, and passes the two allowed forms."""
    source = (
        "import logging\n"
        "plain = logging.getLogger('ckpt_events.x')\n"
        "ours = library_logger('ckpt_events.y')\n"
        "plain.error('a', exc_info=True)\n"
        "plain.exception('b')\n"
        "ours.exception('c')\n"
        "plain.error('d', exc_info=fit_for_log(exc))\n"
        "logging.getLogger('z').warning('e', exc_info=exc)\n"
        "plain.debug('f', exc_info=None)\n"
        "future.exception()\n"
    )
    assert _unfitted_tracebacks(ast.parse(source)) == [4, 5, 8]
    imported = (
        "from ckpt_events._bus_log import logger\n"
        "from ckpt_events._errors import shown as plain\n"
        "logger.error('a', exc_info=exc)\n"
        "plain.error('b', exc_info=exc)\n"
    )
    assert _unfitted_tracebacks(ast.parse(imported)) == [4]
