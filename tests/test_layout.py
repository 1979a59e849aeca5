"""The layout: imports flow one way between the rooms, no cycles, small files, every package shipped."""

from __future__ import annotations

import ast
import functools
import re
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
    # The event loop's lag monitor: a leaf, run by the FastAPI integration and by each worker.
    "participants.loop_lag": (),
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


#: Imports a module, then names every module of ours it loaded, one a line.
_IMPORT_AND_LIST = (
    "import sys, {}\nprint(*(m for m in sys.modules if m.startswith('ckpt_events')), sep='\\n')"
)


def _import_alone(name: str) -> tuple[str, str, frozenset[str]]:
    """(name, the last line of its import error or "", the modules of ours its import loaded)."""
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_AND_LIST.format(_installed(name))],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if run.returncode:
        return name, run.stderr.strip().splitlines()[-1], frozenset()
    return name, "", frozenset(run.stdout.split())


@pytest.mark.slow
def test_each_module_imports_alone() -> None:
    """Each module imports in a fresh interpreter on its own (no order-dependent imports)."""
    names = [n for n in _modules() if not n.startswith("benchmarks")]
    by_depth: dict[int, list[str]] = {}
    for name in names:
        by_depth.setdefault(_installed(name).count("."), []).append(name)
    # A fresh ``import pkg.mod`` imports ``pkg`` first; when that already loaded ``pkg.mod``, it
    # ran the very imports, in the same order, as ``import pkg`` alone: that run stands for both.
    # That skips 69 of the 163 interpreters (this test took 28 s on 2 cores, now 12 s).
    loaded: dict[str, frozenset[str]] = {}
    failures: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for depth in sorted(by_depth):
            alone = []
            for name in by_depth[depth]:
                module = _installed(name)
                parent = module.rpartition(".")[0]
                if module in loaded.get(parent, ()):
                    loaded[module] = loaded[parent]
                else:
                    alone.append(name)
            for name, error, ours in pool.map(_import_alone, alone):
                if error:
                    failures[name] = error
                else:
                    loaded[_installed(name)] = ours
    assert failures == {}
    assert set(map(_installed, names)) <= set(loaded)


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
