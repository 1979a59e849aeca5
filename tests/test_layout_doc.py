"""docs/layout.md names every module of the core, the sinks' top level and _export, and participants."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
#: The folders whose modules the map names one by one (``sinks/jsonl``, ``otel``, ``otlp`` and
#: ``benchmarks/`` are described in prose as packages). ``True``: every folder below it too.
LISTED: tuple[tuple[str, bool], ...] = (
    ("ckpt_events", False),
    ("sinks", False),
    ("sinks/_export", False),
    ("participants", True),
)
#: An entry's name column starts at most this far in; its description continues further in.
_ENTRY_INDENT = 6
#: A folder described inside another's text: ``report/: command, logs, ...``.
_PROSE_FOLDER = re.compile(r"(?<![\w/])([\w/]+)/:")


@dataclass
class _Entry:
    indent: int
    head: str
    text: str
    children: list[_Entry] = field(default_factory=list)

    @property
    def folder(self) -> str | None:
        first = self.head.split()[0] if self.head.split() else ""
        return first.rstrip("/") if first.endswith("/") else None


def _tree(doc: str) -> _Entry:
    """The ```text block of the map as entries nested by their indentation."""
    block = doc.split("```text\n", 1)[1].split("```", 1)[0]
    root = _Entry(-1, "", "")
    stack = [root]
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            continue
        if indent > _ENTRY_INDENT:
            stack[-1].text += " " + line.strip()
            continue
        while stack[-1].indent >= indent:
            stack.pop()
        head = re.split(r" {2,}", line.strip(), maxsplit=1)[0]
        entry = _Entry(indent, head, line.strip())
        stack[-1].children.append(entry)
        stack.append(entry)
    return root


def _prose_folders(text: str) -> dict[str, str]:
    """Each folder described inside ``text`` (by its last name), with the words that describe it."""
    marks = list(_PROSE_FOLDER.finditer(text))
    bounds = [m.start() for m in marks] + [len(text)]
    return {m.group(1).rsplit("/", 1)[-1]: text[m.end() : bounds[i + 1]] for i, m in enumerate(marks)}


def _words_for(tree: _Entry, folder: str) -> str | None:
    """The words of the map where ``folder``'s own modules are described, or None if it has none."""
    entry = tree
    for i, part in enumerate(folder.split("/")):
        child = next((c for c in entry.children if c.folder == part), None)
        if child is None:
            prose = _prose_folders(entry.text)
            return prose.get(part) if i == len(folder.split("/")) - 1 else None
        entry = child
    files = [c.head for c in entry.children if c.folder is None]
    if files:
        # Drawn one entry per module: a name counts in the name column only (``protocol.py``'s
        # "requests, replies" does not name ``replies.py``).
        return " ".join(name.removesuffix(".py") for head in files for name in head.split())
    return _PROSE_FOLDER.split(entry.text, maxsplit=1)[0]


def _modules() -> list[Path]:
    found: list[Path] = []
    for folder, below in LISTED:
        pattern = "**/*.py" if below else "*.py"
        found += (p for p in (ROOT / folder).glob(pattern) if p.stem not in ("__init__", "__main__"))
    return sorted(found)


def unnamed(doc: str, modules: list[Path]) -> list[str]:
    """One line for each module the map does not name where its folder's modules are described."""
    tree = _tree(doc)
    problems = []
    for path in modules:
        folder = path.parent.relative_to(ROOT).as_posix()
        words = _words_for(tree, folder)
        if words is None:
            problems.append(f"{folder}/ is not described in docs/layout.md: add it, naming {path.name}")
        elif path.stem not in set(re.findall(r"\w+", words)):
            problems.append(
                f"{folder}/{path.name} is not named in docs/layout.md: describe it there, under "
                f"{folder}/ (`{path.stem} (what it holds)`)"
            )
    return problems


def test_the_layout_names_every_module() -> None:
    """Every module of the listed folders is named in docs/layout.md where its neighbours are."""
    problems = unnamed(LAYOUT.read_text(encoding="utf-8"), _modules())
    assert not problems, "\n".join(problems)


def test_a_name_counts_only_under_its_own_folder() -> None:
    """A stem named in a description, or another folder's, or a folder not drawn, is reported."""
    doc = (
        "```text\n"
        "sinks/                  the sinks\n"
        "  a.py                  A, with b\n"
        "  otlp/                 the export worker (replies)\n"
        "participants/\n"
        "  cli/                  main; report/: logs, fold; watch/: view\n"
        "```\n"
    )
    paths = [
        ROOT / "sinks" / "a.py",
        ROOT / "sinks" / "b.py",
        ROOT / "sinks" / "replies.py",
        ROOT / "participants" / "cli" / "main.py",
        ROOT / "participants" / "cli" / "fold.py",
        ROOT / "participants" / "cli" / "report" / "fold.py",
        ROOT / "participants" / "cli" / "report" / "view.py",
        ROOT / "participants" / "server" / "app.py",
    ]
    problems = unnamed(doc, paths)
    assert [p.split(" ", 1)[0] for p in problems] == [
        "sinks/b.py",
        "sinks/replies.py",
        "participants/cli/fold.py",
        "participants/cli/report/view.py",
        "participants/server/",
    ]
