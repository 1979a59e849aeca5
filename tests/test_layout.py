"""The layout: imports flow one way between the rooms, no cycles, small files, every package shipped."""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ckpt_events", "sinks", "participants", "benchmarks")
#: Past WARN_LINES a module is worth a look (printed); past MAX_LINES it fails. A cohesion rule, not
#: a cap to squeeze under: split a module when it holds two concepts, never by size alone.
WARN_LINES = 400
MAX_LINES = 800

#: What each room may import of ours (by module prefix). A module may always import its own room.
ALLOWED: dict[str, tuple[str, ...]] = {
    "ckpt_events": (),
    "sinks": ("ckpt_events",),
    # The errors of every room, in one module (the whole tree in its docstring): importable by all.
    "participants.errors": ("ckpt_events",),
    "participants.protocol": ("ckpt_events", "participants.errors"),
    # The harness's order of kinds (prepare, resume, retire): for the servers and the controller alike.
    "participants.kinds": ("ckpt_events",),
    # CKPT_EVENTS_FAULT, read in one place for the servers and the controller alike.
    "participants.faults": ("ckpt_events",),
    # The write probe of the command line and the benchmarks: a leaf (the benchmarks' report,
    # which the command line imports, used it from the command line: a circular import).
    "participants.writable": (),
    # Reading a peer's reply within a bound: the controller's calls, watch's polls, the model's worker.
    "participants.replies": ("ckpt_events", "participants.errors"),
    "participants.workloads": (
        "ckpt_events",
        "participants.errors",
        "participants.protocol",
        "participants.kinds",
        "participants.replies",
    ),
    # The event loop's lag monitor: a leaf of participants, run by the FastAPI integration and by
    # each worker (the core for its logger only: a wanted() that raised is said once).
    "participants.loop_lag": ("ckpt_events",),
    # The FastAPI integration users build their own servers with (``instrument``, ``operation``).
    "participants.fastapi": ("ckpt_events", "sinks", "participants.loop_lag"),
    "participants.server": (
        "ckpt_events",
        "participants.fastapi",
        "participants.loop_lag",
        "participants.errors",
        "participants.protocol",
        "participants.workloads",
        "participants.faults",
        "participants.kinds",
    ),
    "participants.controller": (
        "ckpt_events",
        "participants.errors",
        "participants.protocol",
        "participants.faults",
        "participants.kinds",
        "participants.replies",
    ),
    "participants.cli": ("ckpt_events", "sinks", "participants", "benchmarks"),
    "participants": ("ckpt_events", "participants.server", "participants.controller"),
    "benchmarks": ("ckpt_events", "sinks", "participants"),
}
OURS = ("ckpt_events", "sinks", "participants", "benchmarks")
#: Installed, the three other rooms live under ``ckpt_events`` (``ckpt_events.sinks`` is ``sinks/``);
#: here a module is named by its folder, so the rules read as rooms.
_INSTALLED = re.compile(r"^ckpt_events\.(?=(?:sinks|participants|benchmarks)(?:\.|$))")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


# Three tests read the same graph: each file is parsed once a session (a second each time).
@functools.cache
def _imports(name: str, path: Path) -> frozenset[str]:
    """Every module of ours that ``path`` imports at run time, anywhere in the file (function-level too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    # Imports only a type checker runs are not import-time edges.
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(_INSTALLED.sub("", m) for m in found if m.startswith(OURS))


def _our_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    return {m for m in _imports(name, path) if m in known and m != name}


def _room(name: str) -> str:
    return max((room for room in ALLOWED if name == room or name.startswith(room + ".")), key=len)


def test_imports_flow_one_way() -> None:
    """Each module imports only its own room and the rooms below it."""
    wrong = []
    modules = _modules()
    for name, path in modules.items():
        room = _room(name)
        for target in _our_imports(name, path, modules):
            if _room(target) == room or target.startswith(ALLOWED[room]):
                continue
            wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_every_import_of_ours_resolves() -> None:
    """Each ``from X import y`` of ours names a module X that exists (function-level imports too)."""
    modules = _modules()
    missing = []
    for name, path in modules.items():
        for target in _imports(name, path):
            module, _, _ = target.rpartition(".")
            if target not in modules and module not in modules:
                missing.append(f"{name} imports {target}")
    assert missing == []


def test_no_import_cycles() -> None:
    """The graph of our imports (a package counts as its __init__) has no cycle."""
    modules = _modules()
    graph = {name: _our_imports(name, path, modules) for name, path in modules.items()}
    # A submodule's import runs its package's __init__ first: that edge is Python's, not a cycle.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_no_file_is_huge() -> None:
    """Modules past WARN_LINES are printed (worth a look); none may pass MAX_LINES."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    for name, n in sorted(lengths.items()):
        if n > WARN_LINES:
            print(f"layout: {name} has {n} lines (over {WARN_LINES}): does it hold one concept?")
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def _folded_lines(path: Path) -> list[int]:
    """Lines that fold statements to save space: ``# fmt: skip``; a tuple-assign to attributes
    (``self.a, self.b = a, b``); constants packed into one tuple-assign (``_W, _H = 1200, 34``);
    several targets set to one constant (``self.a = self.b = 0``). A swap of names (``a, b = b, a``)
    and keep-and-use (``x = cache[k] = make()``) are no folds."""
    text = path.read_text()
    found = [n for n, line in enumerate(text.splitlines(), 1) if "# fmt: skip" in line]
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Assign):
            continue
        tuples = [target for target in node.targets if isinstance(target, ast.Tuple)]
        to_attributes = any(isinstance(e, ast.Attribute) for target in tuples for e in target.elts)
        packed = (
            bool(tuples)
            and isinstance(node.value, ast.Tuple)
            and all(isinstance(e, ast.Constant) for e in node.value.elts)
        )
        chained_constant = len(node.targets) > 1 and isinstance(node.value, ast.Constant)
        if to_attributes or packed or chained_constant:
            found.append(node.lineno)
    return sorted(found)


def test_folded_lines_are_found(tmp_path: Path) -> None:
    """The fold detector flags each folding form and passes a one-statement-a-line module."""
    folded = tmp_path / "folded.py"
    folded.write_text(
        "x = {1: 2}  # fmt: skip\n"
        "self.a, self.b = 1, 2\n"
        "batch, self.batch = self.batch, []\n"
        "_W, _H = 1200, 34\n"
        "self.a = self.b = 0\n"
    )
    assert _folded_lines(folded) == [1, 2, 3, 4, 5]
    clean = tmp_path / "clean.py"
    clean.write_text("a = 1\nb = 2\na, b = b, a\nx = cache[1] = make()\nw, h = size()\n")
    assert _folded_lines(clean) == []


def test_no_folded_statements() -> None:
    """One statement a line: no ``self.a, self.b = a, b`` and no ``# fmt: skip`` to dodge the formatter."""
    folded = {name: lines for name, path in _modules().items() if (lines := _folded_lines(path))}
    assert folded == {}


def _installed(name: str) -> str:
    return f"ckpt_events.{name}" if name.split(".", maxsplit=1)[0] in PACKAGES[1:] else name


#: Run as ``python -c`` with the modules to check as arguments: a fresh interpreter, using only
#: ``os`` and ``sys`` (loaded at every start: it loads nothing a fresh interpreter lacks), imports
#: the first one, then forks a child per direct submodule, which imports it and forks in turn. A
#: fresh ``import pkg.mod`` runs ``import pkg`` first, so a child forked just after ``import pkg``
#: runs the very imports, in the same order, that a fresh ``import pkg.mod`` does; each module pays
#: only for what its own import adds (the server package's fastapi is imported once, not once a
#: module: 21 s of CPU with an interpreter a module, 15 s so). A submodule its package's import
#: already loaded is not imported again, as a fresh ``import pkg.mod`` would not import it again.
#: One line a module, written as it ends: ``name<TAB>modules of ours loaded<TAB>error``.
_IMPORT_TREE = """
import os, sys
prefix, *names = sys.argv[1:]
del sys.argv[1:]  # as a fresh ``python -c`` has it
def run(name):
    try:
        __import__(name)
    except BaseException as error:
        say(name, "", f"{type(error).__name__}: {error}")
        return
    ours = " ".join(m for m in sys.modules if m.startswith(prefix))
    say(name, ours, "")
    for child in (n for n in names if n.rpartition(".")[0] == name):
        if child in sys.modules:
            run(child)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if not pid:
            try:
                run(child)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
def say(name, ours, error):
    os.write(1, "\\t".join((name, ours, error.replace("\\n", " "))).encode() + b"\\n")
run(names[0])
"""


def _import_tree(
    root: Path, names: list[str], prefix: str, timeout: float = 120
) -> dict[str, tuple[frozenset[str], str]]:
    """Each of ``names`` (the first a package, the others under it) imported as a fresh interpreter
    would import it alone: its name -> (the modules named ``prefix...`` loaded, the last line of its
    import error or ""). A name the run never reached is missing."""
    with subprocess.Popen(
        [sys.executable, "-c", _IMPORT_TREE, prefix, *names],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    ) as run:
        try:
            out, _ = run.communicate(timeout=timeout)
        finally:
            # The children of a run that timed out (or any left behind) go with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    found = {}
    for line in out.splitlines():
        name, ours, error = line.split("\t")
        found[name] = (frozenset(ours.split()), error)
    return found


@pytest.mark.slow
def test_each_module_imports_alone() -> None:
    """Each module imports as in a fresh interpreter on its own (no order-dependent imports)."""
    names = sorted((_installed(n) for n in _modules() if not n.startswith("benchmarks")), key=len)
    # Two trees side by side, of about equal work: the command line's, and the rest.
    cli = "ckpt_events.participants.cli"
    trees = [
        [n for n in names if not (n == cli or n.startswith(f"{cli}."))],
        [n for n in names if n == cli or n.startswith(f"{cli}.")],
    ]
    found: dict[str, tuple[frozenset[str], str]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for part in pool.map(lambda tree: _import_tree(ROOT, tree, "ckpt_events"), trees):
            found.update(part)
    assert {name: error for name, (_, error) in found.items() if error} == {}
    assert set(found) == set(names)


def test_the_import_tree_finds_a_module_that_imports_only_after_another(tmp_path: Path) -> None:
    """A module whose import needs another imported first fails alone, though its package and the
    module it needs import fine (``a`` imports ``b``, which takes a name of ``a`` not yet set); a
    module under a package its parent's import loaded is still imported (``d``, which fails)."""
    for folder, text in (
        ("probe", ""),
        ("probe/sub", "import probe.sub.c, probe.sub.inner\n"),
        ("probe/sub/inner", ""),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(text)
    (tmp_path / "probe/a.py").write_text("from probe import b\nX = 1\n")
    (tmp_path / "probe/b.py").write_text("from probe.a import X\n")
    (tmp_path / "probe/sub/c.py").write_text("import probe.b\n")
    (tmp_path / "probe/sub/inner/d.py").write_text("import probe.nowhere\n")
    names = [
        "probe",
        "probe.a",
        "probe.b",
        "probe.sub",
        "probe.sub.c",
        "probe.sub.inner",
        "probe.sub.inner.d",
    ]
    found = _import_tree(tmp_path, names, "probe")
    assert set(found) == set(names)
    cause = "ImportError: cannot import name 'X' from partially initialized module 'probe.a'"
    assert {name: error.partition(" (")[0] for name, (_, error) in found.items() if error} == {
        "probe.a": cause,
        "probe.sub.inner.d": "ModuleNotFoundError: No module named 'probe.nowhere'",
    }
    assert found["probe.b"][0] == {"probe", "probe.a", "probe.b"}
    # ``c`` and ``inner`` came in with their package: a fresh ``import probe.sub.c`` runs that import.
    assert found["probe.sub"][0] == found["probe.sub.c"][0] == found["probe.sub.inner"][0]
    assert found["probe.sub"][0] == {
        "probe",
        "probe.a",
        "probe.b",
        "probe.sub",
        "probe.sub.c",
        "probe.sub.inner",
    }


def test_every_room_is_linked_into_the_one_installed_package() -> None:
    """``ckpt_events/sinks`` (and participants, benchmarks) link to the top-level folders, and
    pyproject ships everything under ``ckpt_events`` and nothing else."""
    for room in PACKAGES[1:]:
        link = ROOT / "ckpt_events" / room
        assert link.is_symlink() and link.resolve() == (ROOT / room).resolve(), room
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["include"] == ["ckpt_events", "ckpt_events.*"]


def test_every_package_is_typed() -> None:
    """Each package ships a py.typed marker."""
    missing = [p for p in PACKAGES if not (ROOT / p / "py.typed").is_file()]
    assert missing == []
