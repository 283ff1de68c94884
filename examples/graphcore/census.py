"""Census of the IPU-stack API that real code uses, checked against this openpop.

Walks checkouts of Graphcore's code (``graphcore/examples``, ``graphcore/tutorials``, ...) given
on the command line, reads every Python file and notebook with ``ast`` (nothing is imported or
run), and collects

* every ``poptorch.*``, ``popart.*`` and ``popdist.*`` name the code reaches (attribute chains
  and ``from ... import`` names, through any ``import ... as`` alias), and every PopTorch
  operator called through the dispatcher (``torch.ops.poptorch.*``),
* every ``poptorch.Options`` method called (``opts.deviceIterations(...)``,
  ``opts.Training.gradientAccumulation(...)``), on variables assigned from ``poptorch.Options``
  or ``popdist.poptorch.Options`` or named as options usually are (``opts``, ``*_options``),
* every ``opts._Popart.set("key", ...)`` key (PopART session options).

Folders of Graphcore's other frameworks (``tensorflow2``, ``popxl``, ``poplar``) are skipped.

Each is then resolved against the installed ``poptorch``/``popart``/``popdist`` (openpop's): a
name resolves when the attribute chain exists; an Options method when the options object or its
group has it; a ``_Popart`` key when ``popart.SessionOptions`` has the field (and the nested
field of a dotted key). ::

    python examples/graphcore/census.py PATH/TO/examples [PATH/TO/tutorials ...] \
        [--markdown docs/compatibility/ipu-api-census.md]

The exit status is 1 when any name does not resolve, so the census can gate a change.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOTS = ("poptorch", "popart", "popdist")
OPTIONS_FACTORIES = {"poptorch.Options", "popdist.poptorch.Options"}
OPTIONS_GROUPS = {"Training", "Precision", "TensorLocations", "Distributed", "_Popart", "Jit"}
# Folders of Graphcore's other frameworks (TensorFlow, PopXL, Poplar C++): not PopTorch/PopART code.
OTHER_FRAMEWORKS = {"tensorflow", "tensorflow1", "tensorflow2", "popxl", "poplar", "keras"}
# Methods of dicts, lists and argparse namespaces that code calls on variables named "options".
NOT_OPTIONS_METHODS = {"get", "copy", "items", "keys", "values", "update", "setdefault", "append", "extend",
                       "pop", "add_argument", "parse_args"}


def _looks_like_options(name: str) -> bool:
    """Variable names Graphcore's code gives to ``poptorch.Options`` objects."""
    leaf = name.rsplit(".", 1)[-1].lower()
    return leaf in {"opts", "options", "ipu_opts", "ipu_options", "poptorch_options", "popopts"} or \
        leaf.endswith(("_opts", "_options"))


@dataclass
class Uses:
    """Where each name was seen: name -> {application folder: number of uses}."""
    names: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    options: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    popart_keys: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        inner = _dotted(node.func)
        if inner is not None:
            parts.append(inner + "()")
            return ".".join(reversed(parts))
    return None


class _FileVisitor(ast.NodeVisitor):
    def __init__(self, uses: Uses, app: str):
        self.uses, self.app = uses, app
        self.aliases: dict[str, str] = {}   # local name -> full dotted name in an IPU package
        self.options_vars: set[str] = set()

    # -- imports
    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.aliases[top] = top
                self._use(alias.name)

    def visit_ImportFrom(self, node):
        if node.module and node.level == 0 and node.module.split(".")[0] in ROOTS:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if alias.name == "*":
                    self._use(node.module)
                    continue
                self.aliases[alias.asname or alias.name] = full
                self._use(full)

    # -- names
    def _resolve_alias(self, dotted: str) -> str | None:
        head, _, rest = dotted.partition(".")
        if head not in self.aliases:
            return None
        full = self.aliases[head]
        return f"{full}.{rest}" if rest else full

    def _use(self, full: str):
        self.uses.names[full][self.app] += 1

    def visit_Attribute(self, node):
        dotted = _dotted(node)
        if dotted and dotted.startswith("torch.ops.poptorch.") and dotted.count(".") == 3:
            self._use(dotted)  # PopTorch's operators, called through the dispatcher
            return
        if dotted and "()" not in dotted:
            full = self._resolve_alias(dotted)
            if full is not None:
                self._use(full)
                return  # the longest chain only
        self.generic_visit(node)

    def visit_Name(self, node):
        full = self._resolve_alias(node.id)
        if full is not None and full.count(".") >= 1:
            self._use(full)

    # -- Options objects
    def visit_Assign(self, node):
        if isinstance(node.value, ast.Call):
            callee = _dotted(node.value.func)
            full = self._resolve_alias(callee) if callee else None
            if full in OPTIONS_FACTORIES:
                for target in node.targets:
                    name = _dotted(target)
                    if name:
                        self.options_vars.add(name)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute):
            chain = []
            receiver = func
            while isinstance(receiver, ast.Attribute):
                chain.append(receiver.attr)
                receiver = receiver.value
            chain.reverse()
            # opts.method(...) / opts.Group.method(...) / poptorch.Options().method(...)
            base = _dotted(receiver) if not isinstance(receiver, ast.Call) else None
            created = isinstance(receiver, ast.Call) and \
                self._resolve_alias(_dotted(receiver.func) or "") in OPTIONS_FACTORIES
            definite = created or (base is not None and base in self.options_vars)
            heuristic = base is not None and _looks_like_options(base) and self._resolve_alias(base) is None \
                and chain[-1] not in NOT_OPTIONS_METHODS and "_" not in chain[-1].strip("_")
            if definite or heuristic:
                method = ".".join(chain)
                if len(chain) == 1 or (len(chain) == 2 and chain[0] in OPTIONS_GROUPS):
                    self.uses.options[method][self.app] += 1
                if chain[-2:] == ["_Popart", "set"] and node.args and isinstance(node.args[0], ast.Constant):
                    self.uses.popart_keys[str(node.args[0].value)][self.app] += 1
        self.generic_visit(node)


def _sources(path: Path):
    if path.suffix == ".py":
        yield path.read_text(errors="replace")
    elif path.suffix == ".ipynb":
        try:
            cells = json.loads(path.read_text(errors="replace")).get("cells", [])
        except json.JSONDecodeError:
            return
        code = []
        for cell in cells:
            if cell.get("cell_type") == "code":
                source = cell.get("source", "")
                lines = source if isinstance(source, list) else source.splitlines(True)
                code.extend(line for line in lines if not line.lstrip().startswith(("%", "!")))
                code.append("\n")
        yield "".join(code)


def _application(root: Path, path: Path) -> str:
    """The application a file belongs to: ``area/name/pytorch`` folders, else two levels."""
    parts = path.relative_to(root).parts
    for i, part in enumerate(parts[:-1]):
        if part in ("pytorch", "popart", "pytorch_lightning") and i >= 1:
            return "/".join(parts[:i + 1])
    return "/".join(parts[:min(2, len(parts) - 1)]) or parts[0]


def collect(roots: list[Path]) -> Uses:
    uses = Uses()
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".ipynb") or not path.is_file():
                continue
            if OTHER_FRAMEWORKS.intersection(path.relative_to(root).parts):
                continue
            app = f"{root.name}:{_application(root, path)}"
            for source in _sources(path):
                try:
                    tree = ast.parse(source)
                except (SyntaxError, ValueError):
                    continue
                _FileVisitor(uses, app).visit(tree)
    return uses


# -- resolution against the installed packages
def resolve_name(full: str) -> bool:
    import importlib
    parts = full.split(".")
    if parts[0] == "torch":  # torch.ops.poptorch.*: registered when poptorch is imported
        importlib.import_module("poptorch")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return False
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
            continue
        except (AttributeError, RuntimeError):
            pass
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return False
    return True


def resolve_option(method: str) -> bool:
    import poptorch
    obj = poptorch.Options()
    for part in method.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return callable(obj)


def resolve_popart_key(key: str) -> bool:
    import popart
    obj = popart.SessionOptions()
    for part in key.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return False
    return True


def _instances(table: dict) -> tuple[int, int]:
    return sum(sum(apps.values()) for apps in table.values()), len(table)


def report(uses: Uses) -> tuple[list[tuple], int]:
    rows = []
    for kind, table, resolve in (("name", uses.names, resolve_name),
                                 ("Options method", uses.options, resolve_option),
                                 ("_Popart key", uses.popart_keys, resolve_popart_key)):
        for name in sorted(table):
            apps = table[name]
            rows.append((kind, name, len(apps), sum(apps.values()), resolve(name), sorted(apps)))
    unresolved = sum(1 for row in rows if not row[4])
    return rows, unresolved


def markdown(rows, roots) -> str:
    lines = ["# The IPU-stack API that Graphcore's code uses, on openpop", "",
             "Generated by `python examples/graphcore/census.py "
             + " ".join(r.name for r in roots) + " --markdown ...`: every `poptorch`, `popart` and "
             "`popdist` name, `poptorch.Options` method and `_Popart.set` key found in those checkouts "
             "(read with `ast`, nothing run), and whether openpop's packages have it. What each one does "
             "off-IPU (exact, accepted with no effect, or a clear error) is in the API reference.", ""]
    unresolved = [r for r in rows if not r[4]]
    lines += [f"{len(rows)} distinct names and keys; **{len(unresolved)} unresolved**.", ""]
    lines += ["| kind | name | applications | uses | on openpop |", "|---|---|---|---|---|"]
    for kind, name, napps, uses_count, ok, _apps in rows:
        lines.append(f"| {kind} | `{name}` | {napps} | {uses_count} | {'yes' if ok else '**missing**'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="checkouts of Graphcore repositories")
    parser.add_argument("--markdown", type=Path, help="write the table to this file")
    parser.add_argument("--verbose", action="store_true", help="print every name, not only unresolved ones")
    args = parser.parse_args(argv)
    uses = collect(args.checkouts)
    rows, unresolved = report(uses)
    for kind, name, napps, _uses, ok, apps in rows:
        if args.verbose or not ok:
            print(f"{'ok ' if ok else 'MISSING'}  {kind:15s} {name}  ({napps} applications: "
                  f"{', '.join(a.split(':', 1)[1] for a in apps[:4])}{' ...' if napps > 4 else ''})")
    print(f"{len(rows)} names and keys, {unresolved} unresolved")
    if args.markdown:
        args.markdown.write_text(markdown(rows, args.checkouts))
    return 1 if unresolved else 0


if __name__ == "__main__":
    sys.exit(main())
