"""Cheap guards on ``benchmarks/*.py``, which no other test runs: a refactor that removes what a
benchmark reaches would otherwise break it silently (three of them once read the executor's
``_backend`` after the backend contract removed it, and crashed only when someone ran them).

- every benchmark script (not the ``_``-prefixed helpers) runs as ``__main__`` with ``--help``
  here, in this process (torch and openpop are imported once): its imports resolve and its
  argument parser builds (a ``%`` in a help text, a clashing option, fails here); global state
  the script sets at import (``sys.path``, environment, warning filters, torch threads, its own
  modules) is put back afterwards;
- no benchmark reaches a private attribute (``x._name``, ``getattr(x, "_name")``) of an openpop
  object except those in ``ALLOWED``, each with its reason, and each allowed name still exists in
  openpop's sources (or, for a benchmark's own marker, in that benchmark).

A benchmark's run itself is not tested here (benchmarks time the machine; none is a test).
"""
import ast
import contextlib
import glob
import io
import os
import runpy
import sys
import warnings

import pytest
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
BENCHMARKS = os.path.normpath(os.path.join(ROOT, "benchmarks"))
SOURCES = os.path.normpath(os.path.join(ROOT, "src"))
ALL_FILES = sorted(glob.glob(os.path.join(BENCHMARKS, "*.py")))
SCRIPTS = [path for path in ALL_FILES if not os.path.basename(path).startswith("_")]

#: Top-level packages whose objects are openpop's (their private names are what a refactor moves).
OPENPOP_PACKAGES = {"openpop", "poptorch", "popart", "popdist", "poprun"}

#: Private attribute -> (where it must still be defined: "openpop" or the benchmark's file name, why
#: the benchmark needs it).
ALLOWED = {
    "_dispatch": ("openpop", "the executor's backend dispatch: which backend ran the last call "
                             "(.compiled.last), the compiled unit chosen and its compile seconds; nothing "
                             "public tells a benchmark which backend it timed"),
    "_Popart": ("openpop", "PopTorch's own spelling, Options._Popart.set(...), part of the API scripts write"),
    "_session": ("openpop", "replicas.py checks whether local replicas got weight copies of their own "
                            "(the device session's replicas), which no public accessor reports"),
    "_accessor": ("openpop", "soak.py reads the pid of a DataLoader's loading process to sample its RSS, "
                             "file descriptors and shared memory"),
    "_process": ("openpop", "soak.py: the AsynchronousDataAccessor's loading process (its pid), as above"),
    "_steps": ("openpop", "trace_overhead.py swaps the eager backend's host call for the undecorated one "
                          "to time what the trace decorator costs"),
    "_levers_stacked": ("compile_levers.py", "compile_levers.py's own marker on an optimizer, read by its own "
                                             "patch; openpop never sees it"),
}


def _name(path):
    return os.path.basename(path)


@contextlib.contextmanager
def _restored_globals():
    """Puts back what running a script as ``__main__`` may change in this process."""
    argv, path, environ = list(sys.argv), list(sys.path), dict(os.environ)
    modules = set(sys.modules)
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        sys.argv[:], sys.path[:] = argv, path
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        for name in set(sys.modules) - modules:  # the benchmarks' own modules (helpers, each other)
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.normpath(origin).startswith(BENCHMARKS + os.sep):
                del sys.modules[name]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("path", SCRIPTS, ids=_name)
def test_benchmark_answers_help(path):
    source = open(path).read()
    # --help must stop the script in its argument parser: one without argparse would run for real
    assert "argparse" in source, f"{_name(path)} parses no arguments with argparse; --help would run it"
    out = io.StringIO()
    with _restored_globals(), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stopped:
        sys.argv = [path, "--help"]
        sys.path.insert(0, BENCHMARKS)
        runpy.run_path(path, run_name="__main__")
    assert stopped.value.code in (0, None), f"{_name(path)} --help exited with {stopped.value.code}"
    assert "usage:" in out.getvalue(), out.getvalue()[-2000:]


def _foreign_names(tree):
    """Names bound by imports of packages that are not openpop's (torch, argparse, lightning...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in OPENPOP_PACKAGES:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] not in OPENPOP_PACKAGES and not node.module.startswith("_"):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node):
    """The name an attribute chain starts from (``a`` of ``a.b().c[0]._d``), else None."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def private_reaches(source):
    """``(line, root, attribute)`` per private attribute this source reaches on an object that may be
    openpop's: anything but ``self``/``cls``/``super()`` and what a non-openpop import bound."""
    tree = ast.parse(source)
    own = _foreign_names(tree) | {"self", "cls", "super"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            target, attribute = node.value, node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _is_private(node.args[1].value):
            target, attribute = node.args[0], node.args[1].value
        else:
            continue
        root = _root(target)
        if root not in own:
            found.append((node.lineno, root, attribute))
    return found


def test_the_private_attribute_check_sees_what_broke_benchmarks_before():
    reached = private_reaches(
        "import torch\nfrom openpop.runtime import eager\n"
        "x = executor._backend\ny = getattr(training, '_backend', None)\nz = eager._steps\n"
        "w = torch._dynamo.config\nclass A:\n    def f(self):\n        return self._own, super()._more\n")
    assert sorted(reached) == [(3, "executor", "_backend"), (4, "training", "_backend"), (5, "eager", "_steps")]


def _names_defined_in(paths, wanted):
    """Which of ``wanted`` these sources define: functions, classes, assigned names or attributes
    (only the files whose text mentions one are parsed)."""
    names = set()
    for path in paths:
        source = open(path).read()
        if not any(name in source for name in wanted):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names & set(wanted)


def test_benchmarks_reach_only_allowed_private_attributes():
    offending = []
    for path in ALL_FILES:
        for line, root, attribute in private_reaches(open(path).read()):
            if attribute not in ALLOWED:
                offending.append(f"{_name(path)}:{line}: {root}.{attribute}")
    assert not offending, (
        "benchmarks reach private attributes of openpop objects; use a public accessor, or add the name "
        "to ALLOWED in tests/test_benchmarks_smoke.py with the reason:\n" + "\n".join(offending))


def test_every_allowed_private_attribute_still_exists():
    """An allowed name that openpop no longer defines is the silent break this file exists for."""
    in_openpop = [name for name, (where, _) in ALLOWED.items() if where == "openpop"]
    openpop_names = _names_defined_in(glob.glob(os.path.join(SOURCES, "**", "*.py"), recursive=True), in_openpop)
    missing = []
    for attribute, (where, _reason) in ALLOWED.items():
        defined = openpop_names if where == "openpop" else \
            _names_defined_in([os.path.join(BENCHMARKS, where)], [attribute])
        if attribute not in defined:
            missing.append(f"{attribute} (expected in {where})")
    assert not missing, "allowed private attributes no longer defined: " + ", ".join(missing)


def test_run_all_keeps_the_hand_recorded_results(tmp_path, monkeypatch):
    """``run_all.py`` rewrites RESULTS.md's table and keeps what was recorded by hand below its
    marker (it once opened the file for writing before reading that part, and lost it)."""
    monkeypatch.syspath_prepend(BENCHMARKS)
    import run_all
    path = tmp_path / "RESULTS.md"
    hand = f"{run_all.HAND_RECORDED}\n\n- a measurement made by hand\n"
    path.write_text("# old table\n\n" + hand)
    run_all.write_results(str(path), "# new table\n")
    assert path.read_text() == "# new table\n\n" + hand
    run_all.write_results(str(path), "# newer table\n")  # and again: the marker stays
    assert path.read_text() == "# newer table\n\n" + hand
