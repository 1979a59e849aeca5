"""The JSON-lines reader: ``read_events`` yields each line's event, or a ``CorruptLine`` saying
why it did not decode, and goes on.

Ids are read as W3C hex strings, as ``JsonLinesSink`` writes them (``ckpt_events.sinks._hexids``), and older
logs with decimal ids still read.

The file is read 64 KiB at a time and each run of whole lines decoded at once
(``Decoder.decode_lines``: 1.3 us a line against 2.1 one by one, measured here); a run that
holds a corrupt or a blank line is decoded again line by line, to name the line. Memory is one
run's lines and events (about 160 of them), whatever the file's size.

A line longer than ``max_line`` (``MAX_LINE``, 1 MiB, by default) is skipped unread as a
``CorruptLine``: an event is a few hundred bytes (error messages are cut at 1,024 characters),
so such a line is damage or an attack, and holding it would cost one line's size per file
``report`` merges. Each block is searched once and a partial line kept as a list of blocks,
so reading is linear in the file's size: a 64 MB line is skipped in about 0.01 s here
(``report`` took 24.5 s when the whole partial line was joined and searched again per block).

A file compressed with gzip (logrotate's ``compress``: ``events.jsonl.1.gz``) is read through
it, found by its first two bytes, not its name; a gzip stream cut short or damaged ends in one
``CorruptLine`` saying so, after every line before the damage.

A time (``start_ns``, ``end_ns``, ``received_ns``, ``time_ns``) outside ``[0, 2**63)`` makes its
line a ``CorruptLine``: a Unix nanosecond stamp fits a signed 64-bit int until 2262, and what
reads a log (arrays of int64, a collector's fixed64) cannot hold another. Checked on the decoded
events, one generated comparison per class (about 0.1 us a line).

A UTF-8 byte order mark at the start of the file is skipped, and lines may end in CRLF.

Fields an event's class does not have (a newer version's) are ignored, as msgspec ignores
them; given ``on_unknown_fields``, each such event is told to it (its line, type and those
fields) and still read. The fields met are learned per event type as the file is read (at
most ``_EXTRAS_KEPT`` a type), and the run decoded once more by a strict decoder that also takes
them: a newer version's log, every line holding a field this version lacks, reads in one pass
(460k lines/s of CPU here, was 217k when each run was decoded twice more to find them, once into
a dict of its keys; a log without such fields 628k either way).
"""

from __future__ import annotations

import enum
import io
import itertools
import os
import re
import types
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, Final, TypeAlias, Union, final, get_args, get_origin

import msgspec

from ckpt_events import CheckpointEvent, InvalidTypeError
from ckpt_events._errors import check_file_name, check_int, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._hexids import STRICT_WIRE_DECODER, WIRE_DECODER, from_wire, strict_twin_with

__all__ = ["MAX_LINE", "CorruptLine", "read_events"]

#: The longest line ``read_events`` decodes by default, in bytes (without its newline).
MAX_LINE: Final = 1 << 20
_EXCERPT: Final = 120
_CHUNK: Final = 1 << 16
#: Times are Unix nanoseconds in ``[0, _TIME_BOUND)``: a signed 64-bit int.
_TIME_BOUND: Final = 1 << 63
_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS  # a gzip header and trailer around deflate data


def _time_check(cls: type[Any]) -> Callable[[Any], bool]:
    """Whether every time field of a ``cls`` event lies in ``[0, 2**63)`` (an unset optional one
    does): one generated expression, no loop per event."""
    terms = [
        f"(e.{f.name} is None or 0 <= e.{f.name} < B)" if f.default is None else f"0 <= e.{f.name} < B"
        for f in msgspec.structs.fields(cls)
        if f.name.endswith("_ns")
    ]
    namespace: dict[str, Any] = {"B": _TIME_BOUND}
    exec(f"def check(e):\n    return {' and '.join(terms) or 'True'}", namespace)
    check: Callable[[Any], bool] = namespace["check"]
    return check


_TIMES_OK: Final = {cls: _time_check(cls) for cls in get_args(CheckpointEvent)}


# Final: a reader of lines tells a line from an event by its exact class (one test a line).
@final
class CorruptLine(msgspec.Struct, frozen=True):
    """A line that did not decode as a ``CheckpointEvent``: its 1-based number and why.

    ``unknown_type`` is the line's ``type`` when it is a well-formed event of a type this
    version does not know (another version of the library wrote it: not damage), else ``None``.
    ``unknown_value`` is ``(field, value)`` when the line is a well-formed event of a type this
    version knows whose only fault is a value outside one of its closed vocabularies (an
    ``operation``, ``outcome``, ``phase``, ``code``, ``disposition`` or ``action`` a newer version
    added: not damage either), the first such field in the event's field order; else ``None``.
    ``ended`` is ``(trace_id, span_id, end_ns)`` when such a line (of either kind) is the end of
    a span (a ``*_finished`` event whose ids and end read): the span ended, with what this version
    cannot read; else ``None``.
    """

    line: int
    error: str
    excerpt: str
    unknown_type: str | None = None
    unknown_value: tuple[str, str] | None = None
    ended: tuple[int, int, int] | None = None


#: Told of an event read whole but for fields its class does not have: ``(line_number, type,
#: fields)``, each field once, in the order first met on a line of that type (a version writes
#: its fields in one order).
UnknownFields: TypeAlias = Callable[[int, str, tuple[str, ...]], None]


def read_events(
    source: str | os.PathLike[str] | IO[bytes],
    *,
    max_line: int = MAX_LINE,
    on_unknown_fields: UnknownFields | None = None,
) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    """Yield ``(line_number, event)`` for each line of a JSON-lines log, in order.

    A line that does not decode yields a ``CorruptLine`` instead and reading goes on; blank
    lines are skipped. Line numbers are 1-based. A line longer than ``max_line`` bytes is a
    ``CorruptLine`` too, found without decoding or holding it: time is linear in the file's
    size and memory bounded by ``max_line``, whatever the file holds. An event holding fields
    its class does not have (written by a newer version) is yielded without them, and told
    to ``on_unknown_fields`` first, if given.
    """
    check_int(max_line, f"max_line must be a positive int, not {shown(max_line)}", minimum=1)
    if on_unknown_fields is not None and not callable(on_unknown_fields):
        raise InvalidTypeError(f"on_unknown_fields must be callable or None, not {shown(on_unknown_fields)}")
    if isinstance(source, str | os.PathLike):
        check_file_name(source, "source")
        with open(source, "rb") as file:
            if file.peek(2)[:2] != _GZIP_MAGIC:  # peek, not read and seek: a path may be a pipe
                yield from _read(file, max_line, on_unknown_fields)
                return
            # Was: the compressed bytes read as one corrupt line ("invalid character"), no event.
            unzipped = _Unzipped(file)
            last = 0
            for last, item in _read(unzipped, max_line, on_unknown_fields):
                yield last, item
            if unzipped.damage is not None:
                error = (
                    f"the gzip stream is cut short or damaged here ({unzipped.damage}): the rest is unread"
                )
                yield last + 1, CorruptLine(line=last + 1, error=error, excerpt="")
    elif isinstance(source, io.TextIOBase):  # read as bytes, it raised "must be str, not bytes"
        raise InvalidTypeError(
            f"source must be a path or a binary stream, not the text stream {shown(source)}: "
            "pass its .buffer (sys.stdin.buffer), or open the file in 'rb' mode"
        )
    elif isinstance(source, io.IOBase) or hasattr(source, "readline"):
        yield from _read(source, max_line, on_unknown_fields)
    else:
        raise InvalidTypeError(f"source must be a path or a binary stream, not {shown(source)}")


class _Unzipped:
    """The content of a gzip file (one member or several), decompressed as it is read; ``read``
    ends (``b""``) at damage, keeping why in ``damage``. Not ``gzip.GzipFile``: cut short, its
    ``read(64 KiB)`` raised ``EOFError`` and gave none of the lines it had decompressed."""

    __slots__ = ("_done", "_file", "_inflate", "damage")

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._inflate = zlib.decompressobj(_GZIP_WBITS)
        self._done = False
        self.damage: str | None = None

    def read(self, size: int) -> bytes:
        while not self._done:
            if self._inflate.eof:  # a member ended: another follows, or the file does
                data = self._inflate.unused_data or self._file.read(_CHUNK)
                if not data:
                    break
                self._inflate = zlib.decompressobj(_GZIP_WBITS)
            else:
                data = self._inflate.unconsumed_tail or self._file.read(_CHUNK)
                if not data:
                    self.damage = "the file ends before its gzip stream does"
                    break
            try:
                out = self._inflate.decompress(data, size)
            except zlib.error as exc:
                self.damage = str(exc)
                break
            if out:
                return out
        self._done = True
        return b""


def _read(
    file: IO[bytes] | _Unzipped, max_line: int, told: UnknownFields | None
) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    # A block no longer than max_line holds no line longer than max_line: only a line
    # spanning blocks needs its length checked.
    chunk = min(_CHUNK, max_line)
    before = 0  # lines before the next line to decode
    head: list[bytes] = []  # the start of a line not ended yet, block by block (no newline in it)
    held = 0  # its length
    too_long: bytes | None = None  # the excerpt of a line past max_line, skipped to its newline
    extras = _Extras() if told is not None else None
    # A UTF-8 byte order mark (a log saved by a Windows editor, or PowerShell's Out-File) is
    # not JSON: it made the first event a corrupt line ("invalid character").
    first = file.read(chunk).removeprefix(_BOM)
    while True:
        block, first = first or file.read(chunk), b""
        if not block:
            if too_long is not None:
                yield before + 1, _too_long(before + 1, held, max_line, too_long)
            elif head:
                yield from _decode_run(b"".join(head), before, told, extras)
            return
        end = block.find(b"\n")
        if end < 0:  # the line goes on past this block
            held += len(block)
            if too_long is None:
                head.append(block)
                if held > max_line:
                    too_long = _start(head)
                    head = []
            continue
        start = 0
        if too_long is not None or held + end > max_line:
            excerpt = too_long if too_long is not None else _start([*head, block[:end]])
            before += 1
            yield before, _too_long(before, held + end, max_line, excerpt)
            head, held, too_long, start = [], 0, None, end + 1
        cut = block.rfind(b"\n") + 1
        with memoryview(block) as view:
            run = b"".join((*head, view[start:cut])) if head or start else block[:cut]
        head = [block[cut:]] if cut < len(block) else []
        held = len(block) - cut
        if run:
            yield from _decode_run(run, before, told, extras)
            before += run.count(b"\n")


def _start(pieces: list[bytes]) -> bytes:
    """The first ``_EXCERPT`` bytes of a line held in pieces, without joining the whole line."""
    start = b""
    for piece in pieces:
        start += piece[: _EXCERPT - len(start)]
        if len(start) == _EXCERPT:
            break
    return start


def _too_long(number: int, length: int, max_line: int, excerpt: bytes) -> CorruptLine:
    error = f"line of {length:,} bytes, longer than the {max_line:,}-byte bound"
    return CorruptLine(line=number, error=error, excerpt=excerpt.decode("utf-8", "replace"))


def _decode_run(
    run: bytes, before: int, told: UnknownFields | None, extras: _Extras | None
) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    """The events of a run of whole lines, numbered from ``before + 1``; with ``told`` (and its
    ``extras``), each line holding fields its class does not have is told. A run that does not
    decode whole is decoded again line by line, to name the line."""
    # An iterator returned, not yielded from: a generator here cost every line one more
    # resumption (the caller iterates it at once, so nothing is read or told earlier).
    events = _whole(run, before, told, extras)
    if events is not None:
        return zip(itertools.count(before + 1), events)
    lines = run.split(b"\n")
    if run.endswith(b"\n"):
        lines.pop()
    return _line_by_line(lines, before, told)


def _whole(
    run: bytes, before: int, told: UnknownFields | None, extras: _Extras | None
) -> list[CheckpointEvent] | None:
    """The events of a run that decodes whole, no line blank and every time in range, its lines
    holding fields their class does not have told to ``told``; else ``None``, nothing told."""
    tells: _Tells
    if told is None or extras is None:
        try:
            events = [from_wire(wire) for wire in WIRE_DECODER.decode_lines(run)]
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        tells = []
    else:
        found = extras.decode(run, before)
        if found is None:
            return None
        events, tells = found
    if len(events) != run.count(b"\n") + (not run.endswith(b"\n")) or not all(
        [_TIMES_OK[e.__class__](e) for e in events]
    ):
        return None
    if told is not None:
        for number, tag, names in tells:
            told(number, tag, names)
    return events


def _line_by_line(
    lines: list[bytes], before: int, told: UnknownFields | None
) -> Iterator[tuple[int, CheckpointEvent | CorruptLine]]:
    """Each line decoded alone, numbered from ``before + 1``, blank ones skipped."""
    decode = WIRE_DECODER.decode if told is None else STRICT_WIRE_DECODER.decode
    for number, raw in enumerate(lines, before + 1):
        line = raw.strip()
        if not line:
            continue
        failure: Exception | None = None
        event: CheckpointEvent | None
        try:
            event = from_wire(decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            failure = exc
            event = _without_unknown_fields(line, number, told) if told is not None else None
        if event is None:
            excerpt = line[:_EXCERPT].decode("utf-8", "replace")
            kind, value, why, ended = _another_version(line)
            yield (
                number,
                CorruptLine(
                    line=number,
                    error=why or str(failure),
                    excerpt=excerpt,
                    unknown_type=kind,
                    unknown_value=value,
                    ended=ended,
                ),
            )
            continue
        if not _TIMES_OK[event.__class__](event):
            yield number, _bad_time(number, event, line)
            continue
        yield number, event


#: Per event class, its ``type`` tag and the keys its line may hold: its fields and ``type``.
_KEYS: Final[dict[type[Any], tuple[str, frozenset[str]]]] = {
    cls: (str(cls.__struct_config__.tag), frozenset(cls.__struct_fields__) | {"type"})
    for cls in get_args(CheckpointEvent)
}
#: A line's keys, its values left undecoded.
_KEYS_DECODER: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
#: Per ``type`` tag, its event class.
_CLASS_OF: Final = {tag: cls for cls, (tag, _) in _KEYS.items()}
#: Per ``type`` tag, the strict wire twin of its class.
_STRICT_TWIN_OF: Final = {twin.__struct_config__.tag: twin for twin in get_args(STRICT_WIRE_DECODER.type)}
#: The most fields a newer version added that one read learns per event type, the longest
#: name learned, and the most decoders one read builds (~12 us each): past them, a line with
#: such fields is found and told the slower way (about 5.7 us a line against 2.5).
_EXTRAS_KEPT: Final = 16
_EXTRA_LONGEST: Final = 100
_DECODERS_BUILT: Final = 64
#: What a field name taken by a Struct may not hold (msgspec refuses it as a renamed field).
_UNLEARNABLE: Final = re.compile('["\\\x00-\x1f]')


_Tells: TypeAlias = list[tuple[int, str, tuple[str, ...]]]
#: Per twin taking fields its class lacks: its conversion, its tag, and (attribute, field) pairs.
_Twins: TypeAlias = dict[type[Any], tuple[Callable[[Any], CheckpointEvent], str, tuple[tuple[str, str], ...]]]


class _Extras:
    """One read's fields that lines held and their class lacks, learned per event type as they
    are met, and a strict decoder that takes them too: a line holding only fields it knows
    decodes in one pass, and those it holds are told from what it decoded."""

    __slots__ = ("_built", "_changed", "_decoder", "_learned", "_twins")

    def __init__(self) -> None:
        self._learned: dict[str, tuple[str, ...]] = {}
        self._changed = False
        self._built = 0
        self._twins: _Twins = {}
        self._decoder: msgspec.json.Decoder[Any] = STRICT_WIRE_DECODER

    def decode(self, run: bytes, before: int) -> tuple[list[CheckpointEvent], _Tells] | None:
        """The events of ``run`` and what to tell of them (line number, type, fields), or
        ``None`` when it does not decode whole; what it held is learned."""
        try:
            wires = self._decoder.decode_lines(run)
            if not self._twins:
                return [from_wire(wire) for wire in wires], []
            return self._converted(wires, before)
        except (msgspec.DecodeError, msgspec.ValidationError):
            found = _told_run(run, before)
        if found is not None:
            for _, tag, names in found[1]:
                self._learn(tag, names)
            self._rebuild()
        return found

    def _converted(self, wires: list[Any], before: int) -> tuple[list[CheckpointEvent], _Tells]:
        twins = self._twins
        events: list[CheckpointEvent] = []
        tells: _Tells = []
        for number, wire in enumerate(wires, before + 1):
            twin = twins.get(wire.__class__)
            if twin is None:
                events.append(from_wire(wire))
                continue
            convert, tag, extras = twin
            names = tuple(name for attribute, name in extras if getattr(wire, attribute) is not msgspec.UNSET)
            if names:
                tells.append((number, tag, names))
            events.append(convert(wire))
        return events, tells

    def _learn(self, tag: str, names: tuple[str, ...]) -> None:
        known = self._learned.get(tag, ())
        new = tuple(
            name
            for name in dict.fromkeys(names)
            if name not in known and len(name) <= _EXTRA_LONGEST and _UNLEARNABLE.search(name) is None
        )
        if new and len(known) + len(new) <= _EXTRAS_KEPT:
            self._learned[tag] = known + new
            self._changed = True

    def _rebuild(self) -> None:
        if not self._changed or self._built >= _DECODERS_BUILT:
            return
        self._changed = False
        self._built += 1
        twins: _Twins = {}
        members: list[type[Any]] = []
        for tag, strict in _STRICT_TWIN_OF.items():
            extras = self._learned.get(tag)
            if not extras:
                members.append(strict)
                continue
            twin, convert = strict_twin_with(_CLASS_OF[tag], extras)
            twins[twin] = (convert, tag, tuple((f"extra_{i}", name) for i, name in enumerate(extras)))
            members.append(twin)
        self._decoder = msgspec.json.Decoder(Union[tuple(members)])  # noqa: UP007 (a runtime tuple of types)
        self._twins = twins


def _told_run(run: bytes, before: int) -> tuple[list[CheckpointEvent], _Tells] | None:
    """The events of a run that failed the strict decoding, when it decodes whole without it,
    and each line's fields its class does not have, to tell; ``None`` when it does not (the
    caller goes line by line). ~5.7 us a line: what ``_Extras`` learns from it spares the rest."""
    try:
        events = [from_wire(wire) for wire in WIRE_DECODER.decode_lines(run)]
        keys = _KEYS_DECODER.decode_lines(run)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(events) != len(keys):
        return None
    tells: _Tells = []
    for number, event, line_keys in zip(itertools.count(before + 1), events, keys):
        tag, known = _KEYS[event.__class__]
        if not known.issuperset(line_keys):
            tells.append((number, tag, tuple(k for k in line_keys if k not in known)))
    return events, tells


def _without_unknown_fields(line: bytes, number: int, told: UnknownFields) -> CheckpointEvent | None:
    """The event of a line that failed the strict decoding for fields its class does not have
    alone, those fields told to ``told`` (not when a time is out of range: the caller says that
    line damaged); ``None`` when it failed for anything else."""
    try:
        event = from_wire(WIRE_DECODER.decode(line))
        keys = _KEYS_DECODER.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    tag, known = _KEYS[event.__class__]
    unknown = tuple(key for key in keys if key not in known)
    if unknown and _TIMES_OK[event.__class__](event):
        told(number, tag, unknown)
    return event


#: The event types this version reads (each ``CheckpointEvent``'s ``type`` tag).
_KNOWN_TYPES: Final = frozenset(cls.__struct_config__.tag for cls in get_args(CheckpointEvent))


def _vocabularies(cls: type[Any]) -> tuple[tuple[str, frozenset[str], str], ...]:
    """``cls``'s fields typed by a closed vocabulary (a ``StrEnum``, optional or not): each
    field's name, its values, and one of them (to stand in for a value another version wrote)."""
    found = []
    for f in msgspec.structs.fields(cls):
        kinds = get_args(f.type) if get_origin(f.type) in (Union, types.UnionType) else (f.type,)
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, enum.StrEnum):
                values = [member.value for member in kind]
                found.append((f.name, frozenset(values), values[0]))
    return tuple(found)


#: Per event type this version knows, its fields of a closed vocabulary.
_VOCABULARIES: Final = {cls.__struct_config__.tag: _vocabularies(cls) for cls in get_args(CheckpointEvent)}


def _another_version(
    line: bytes,
) -> tuple[str | None, tuple[str, str] | None, str | None, tuple[int, int, int] | None]:
    """Whether ``line``, which did not decode, is a well-formed event another version of the
    library wrote, which msgspec's own "Invalid value 'x' - at `$.type`" (or "Invalid enum value
    'x' - at `$.operation`") made read as damage: ``(type, None, why, ended)`` for an event of a
    type this version does not know, ``(None, (field, value), why, ended)`` for one of a known type
    whose only fault is a value outside a closed vocabulary, ``(None, None, None, None)`` for any
    other line (or ``(None, None, why, None)`` naming its damage, when a value this version does
    not know hid it). ``ended``: the span it ends, when it is a ``*_finished`` event
    (``CorruptLine.ended``). Only a line that failed is decoded again: the happy path pays nothing."""
    nothing: tuple[None, None, None, None] = (None, None, None, None)
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return nothing
    if not isinstance(value, dict):
        return nothing
    tag = value.get("type")
    if not isinstance(tag, str):
        return nothing
    if tag not in _KNOWN_TYPES:
        return tag, None, _unknown_because(tag), _span_end(tag, value)
    unknown: tuple[str, str] | None = None
    for name, values, stand_in in _VOCABULARIES[tag]:
        given = value.get(name)
        if isinstance(given, str) and given not in values:
            unknown = unknown or (name, given)
            value[name] = stand_in
    if unknown is None:
        return nothing
    # With known values in their place the event must decode whole, its times in range: else
    # the line has damage besides, said as damage by that fault (msgspec named the value alone).
    try:
        event = from_wire(WIRE_DECODER.decode(msgspec.json.encode(value)))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, None, str(exc), None
    if not _TIMES_OK[event.__class__](event):
        return None, None, _time_error(event), None
    why = (
        f"a value this version of ckpt-events does not know: {shown(unknown[1])} at `$.{unknown[0]}` "
        f"of a {shown(tag)} event (written by another version of the library?)"
    )
    # Was: skipped with its span, so the span it closed read as open ("never finished").
    ended = (event.trace_id, event.span_id, event.end_ns) if isinstance(event, _FINISHED) else None
    return None, unknown, why, ended


#: The event types that end a span: their lines, skipped, still say the span ended.
_FINISHED: Final = tuple(c for c in get_args(CheckpointEvent) if "end_ns" in c.__struct_fields__)


def _span_end(tag: str, value: dict[str, Any]) -> tuple[int, int, int] | None:
    """``(trace_id, span_id, end_ns)`` of an event of a type this version does not know, when
    its type names the end of a span (``*_finished``) and those fields read as ours do."""
    if not tag.endswith("_finished"):
        return None
    trace_id = _id_of(value.get("trace_id"), 32)
    span_id = _id_of(value.get("span_id"), 16)
    end_ns = value.get("end_ns")
    if trace_id is None or span_id is None or type(end_ns) is not int or not 0 <= end_ns < _TIME_BOUND:
        return None
    return trace_id, span_id, end_ns


def _id_of(given: object, digits: int) -> int | None:
    """A span or trace id as the writer wrote it (W3C hex of ``digits``, or an older log's
    int), as an int; ``None`` when it is neither."""
    if type(given) is int:
        return given if 0 < given < 1 << (4 * digits) else None
    if isinstance(given, str) and len(given) == digits and _HEX_ID.fullmatch(given) is not None:
        return int(given, 16) or None
    return None


#: Lowercase hex digits, the whole string: ``fullmatch``, not ``match`` with ``$`` (which takes a
#: trailing newline). A generator over the characters cost 10 us an id (44 M steps in a 300,000-line log).
_HEX_ID: Final = re.compile("[0-9a-f]+")
#: The reason given for each unknown type seen, of short types only, at most ``_WHY_KEPT``: a
#: newer version's log repeats a few types on most of its lines, and ``shown`` cost ~10 us a line.
_WHY_OF: Final[dict[str, str]] = {}
_WHY_KEPT: Final = 256
_WHY_LONGEST: Final = 100


def _unknown_because(kind: str) -> str:
    why = _WHY_OF.get(kind)
    if why is None:
        why = (
            f"an event type this version of ckpt-events does not know: {shown(kind)} "
            "(written by another version of the library?)"
        )
        if len(kind) <= _WHY_LONGEST and len(_WHY_OF) < _WHY_KEPT:
            _WHY_OF[kind] = why
    return why


def _bad_time(number: int, event: CheckpointEvent, line: bytes) -> CorruptLine:
    """The ``CorruptLine`` of an event with a time outside ``[0, 2**63)``, naming the field."""
    error = _time_error(event)
    return CorruptLine(line=number, error=error, excerpt=line[:_EXCERPT].decode("utf-8", "replace"))


def _time_error(event: CheckpointEvent) -> str:
    """Why an event with a time outside ``[0, 2**63)`` is damage, naming the field."""
    name, value = next(
        (f, v)
        for f in event.__struct_fields__
        if f.endswith("_ns") and (v := getattr(event, f)) is not None and not 0 <= v < _TIME_BOUND
    )
    return f"Expected `int` >= 0 and < 2**63 (Unix ns), got {value} - at `$.{name}`"


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", CorruptLine, read_events)
