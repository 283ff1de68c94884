"""openpop's layers, enforced: no module imports from a layer above its own (``DESIGN.md``: data
flows down; nothing imports upward). Imports are read with ``ast``, at module level and inside
functions alike (a deferred import is still a dependency).

Not checked yet, inside one layer: the popart package is one import circle (builder <-> opsets,
graph <-> ops <-> ops/graphcore, shapes -> ops) because its ONNX interpreter is spread over
``ops/__init__``, ``ops/control`` and ``graph.py``. Once the interpreter is one module below the
ops, a rule "the interpreter does not import the builder" belongs here."""
import ast
import pathlib

import openpop

SRC = pathlib.Path(openpop.__file__).resolve().parent

# Lowest first. A module belongs to the layer of the longest prefix that names it; anything not
# named is a front-end (the top). A module may import from its own layer and the ones below.
LAYERS = (
    ("base", (
        "openpop.errors", "openpop.log", "openpop.enums", "openpop._version", "openpop.torch_version",
        "openpop.torch_compat", "openpop.env_vars", "openpop.openpop_settings", "openpop.atomic_file",
        "openpop.cli_help",
        "openpop.leftover_processes",
        # Writing a profile report from a trace (standard library only): the trace session writes one
        # when its window closes; the openpop-report command (openpop.report, a front-end) reads them.
        "openpop.report_writer", "openpop.report_analysis", "openpop.report_html",
        # The current run's thread-local state: standard library only, it imports nothing of openpop
        # (test_the_run_context_imports_nothing_of_openpop). The model of the run (annotations record
        # blocks, ops and custom ops read the running call) writes and reads it; the runtime owns its
        # lifetime.
        "openpop.runtime.context",
        # Error texts of the distributed package: data, read by the runtime's reducer.
        "openpop.distributed.messages",
    )),
    ("model of the run", (
        # What a user's script states - options, annotations, optimizers, custom ops - as validated
        # data. The runtime reads it (runtime/settings.py turns Options into RunSettings, the
        # pipeline reads block annotations); it never reads the runtime.
        "openpop.options", "openpop.annotations", "openpop.strategies", "openpop.ipu_only_settings",
        "openpop.arg_parsers", "openpop.compile_hooks", "openpop.special_ops", "openpop.printing",
        "openpop.ops", "openpop.custom_ops", "openpop.optim",
        # Processes and their group: what a run is part of (set up by poprun/popdist before a model).
        "openpop.distributed.instance", "openpop.distributed.process_group", "openpop.distributed.topology",
        "openpop.distributed.reachability",
    )),
    ("runtime", ("openpop.runtime",)),
    ("front-ends", ("openpop",)),  # models, data, report, profiling, lightning, popart, bert, k8s, CLIs
)

# Imports that cross upward by design, each with the rule that allows it.
ALLOWED = {
    ("openpop.options", "openpop"):
        "Options.loadFromFile evaluates a config file's lines with ``poptorch`` bound to openpop's whole public "
        "API, as PopTorch does (deferred to load time, when the package is complete)",
}

# Imports that cross upward today, each with why it is still there. The test fails when one of them
# goes away (remove it here) or a new one appears.
PENDING = {}


def _module_names():
    names = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        names[".".join(parts)] = (path, is_package)
    return names


MODULES = _module_names()


def layer_of(module: str) -> int:
    best, index = "", len(LAYERS) - 1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def imports_of(module: str) -> list:
    """``(line, imported module)`` for each openpop module ``module`` imports."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            # ``from origin import name``: the submodule where ``name`` is one, else ``origin`` itself
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
        else:
            continue
        found.extend((node.lineno, target) for target in targets
                     if target == "openpop" or target.startswith("openpop."))
    return found


def upward_imports() -> dict:
    upward = {}
    for module in sorted(MODULES):
        for line, target in imports_of(module):
            if layer_of(target) > layer_of(module):
                upward.setdefault((module, target), line)
    return upward


def test_no_module_imports_from_a_layer_above_its_own():
    upward = upward_imports()
    new = [f"{MODULES[m][0].relative_to(SRC.parent)}:{line}: {m} ({LAYERS[layer_of(m)][0]}) imports {t} "
           f"({LAYERS[layer_of(t)][0]})" for (m, t), line in upward.items()
           if (m, t) not in PENDING and (m, t) not in ALLOWED]
    assert not new, "imports from a higher layer:\n" + "\n".join(new)
    gone = [pair for pair in (*PENDING, *ALLOWED) if pair not in upward]
    assert not gone, f"no longer imported: remove from PENDING/ALLOWED: {gone}"


def test_the_run_context_imports_nothing_of_openpop():
    assert imports_of("openpop.runtime.context") == []


def test_every_layer_prefix_names_a_module():
    missing = [prefix for _, prefixes in LAYERS for prefix in prefixes if prefix not in MODULES]
    assert not missing, missing


def test_the_checker_sees_relative_deferred_and_from_package_imports():
    settings_imports = {t for _, t in imports_of("openpop.runtime.settings")}
    assert "openpop.options" in settings_imports  # (deferred: inside executor_options)
    assert "openpop.errors" in settings_imports  # (``from .. import errors``: the submodule)
    assert "openpop.runtime.geometry" in settings_imports  # (``from .geometry import BatchGeometry``)
    assert layer_of("openpop.runtime.compiled.regions") == 2 and layer_of("openpop.lightning.strategy") == 3
    assert layer_of("openpop.runtime.context") == 0 and layer_of("openpop.options") == 1
