"""Count allocator calls with a hook installed through ``PyMem_SetAllocator``.

tracemalloc snapshots miss short-lived allocations (an object made and freed inside the
measured call leaves nothing behind), so the disabled-path tests and benchmarks count
every ``malloc``/``calloc``/``realloc`` of the ``MEM`` and ``OBJ`` domains instead. The
hook is a tiny C extension compiled on first use with the machine's C compiler and
Python headers; ``build()`` raises ``AllocCounterUnavailable`` when it cannot be built.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Final

_SOURCE: Final = r"""
#include <Python.h>

static PyMemAllocatorEx original_mem, original_obj;
static Py_ssize_t calls = 0;
static int installed = 0;

static void *hook_malloc(void *ctx, size_t size) {
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    calls++;
    return a->malloc(a->ctx, size);
}
static void *hook_calloc(void *ctx, size_t n, size_t size) {
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    calls++;
    return a->calloc(a->ctx, n, size);
}
static void *hook_realloc(void *ctx, void *ptr, size_t size) {
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    calls++;
    return a->realloc(a->ctx, ptr, size);
}
static void hook_free(void *ctx, void *ptr) {
    PyMemAllocatorEx *a = (PyMemAllocatorEx *)ctx;
    a->free(a->ctx, ptr);
}

static PyObject *start(PyObject *self, PyObject *unused) {
    if (!installed) {
        PyMemAllocatorEx hook_mem = {&original_mem, hook_malloc, hook_calloc, hook_realloc, hook_free};
        PyMemAllocatorEx hook_obj = {&original_obj, hook_malloc, hook_calloc, hook_realloc, hook_free};
        PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &original_mem);
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &original_obj);
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &hook_mem);
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &hook_obj);
        installed = 1;
    }
    calls = 0;
    Py_RETURN_NONE;
}

static PyObject *stop(PyObject *self, PyObject *unused) {
    Py_ssize_t counted = calls;
    if (installed) {
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &original_mem);
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &original_obj);
        installed = 0;
    }
    return PyLong_FromSsize_t(counted);
}

static PyMethodDef methods[] = {
    {"start", start, METH_NOARGS, "Install the hook and zero the count."},
    {"stop", stop, METH_NOARGS, "Remove the hook; return allocator calls since start()."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ckpt_allocount", NULL, -1, methods};
PyMODINIT_FUNC PyInit__ckpt_allocount(void) { return PyModule_Create(&module); }
"""


class _Nothing:
    """A context manager that does nothing: the baseline a disabled site is measured against."""

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


#: One shared instance, as a disabled site shares its no-op (on CPython 3.11 each ``with``
#: statement still allocates two short-lived bound methods, even around this).
NOTHING: Final = _Nothing()


class AllocCounterUnavailable(RuntimeError):
    """The allocator hook could not be compiled here (no C compiler or Python headers)."""


_module: ModuleType | None = None


def build(cache_dir: Path | None = None) -> ModuleType:
    """Compile (once per source and interpreter) and import the hook module."""
    global _module
    if _module is not None:
        return _module
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not Path(include, "Python.h").exists():
        raise AllocCounterUnavailable(
            f"need a C compiler and Python.h to count allocations (compiler={compiler}, include={include})"
        )
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256((_SOURCE + sys.version).encode()).hexdigest()[:12]
    directory = cache_dir or Path(tempfile.gettempdir()) / f"ckpt-allocount-{tag}"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"_ckpt_allocount{suffix}"
    if not target.exists():
        source = directory / "allocount.c"
        source.write_text(_SOURCE)
        partial = directory / f".building-{os.getpid()}{suffix}"
        result = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", f"-I{include}", str(source), "-o", str(partial)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise AllocCounterUnavailable(f"compiling the allocator hook failed:\n{result.stderr}")
        partial.replace(target)
    loader = importlib.machinery.ExtensionFileLoader("_ckpt_allocount", str(target))
    spec = importlib.util.spec_from_loader("_ckpt_allocount", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _module = module
    return module


def count_calls(fn: Callable[[], object], runs: int) -> int:
    """Allocator calls made while calling ``fn`` ``runs`` times (loop overhead included)."""
    hook = build()
    calls = [None] * runs  # pre-built so the loop itself allocates nothing
    hook.start()
    for _ in calls:
        fn()
    return int(hook.stop())


def calls_per_run(fn: Callable[[], object], baseline: Callable[[], object], runs: int = 10_000) -> float:
    """Allocator calls per run of ``fn`` beyond ``baseline``, the minimum of three tries."""
    fn()
    baseline()  # warm caches (method caches, interned names) before counting
    best = min(count_calls(fn, runs) - count_calls(baseline, runs) for _ in range(3))
    return best / runs
