"""torch's private names reach openpop through one module (``openpop/torch_compat.py``)."""
import ast
import pathlib
import re

import pytest

from openpop import torch_compat, torch_version

SRC = pathlib.Path(torch_compat.__file__).resolve().parent
COMPAT = pathlib.Path(torch_compat.__file__).resolve()
_PRIVATE_PATH = re.compile(r"^torch(\.\w+)*\._[A-Za-z]\w*(\.\w+)*$")


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _dotted(node):
    """``"torch.a.b"`` for an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield first.value


def private_torch_names(path: pathlib.Path) -> list:
    """``(line, name)`` of each private torch name ``path`` reads: imports of ``torch.*._*``, names
    imported from torch whose name is private, attribute chains ``torch....._x`` and strings that
    are such a path (``"torch._dynamo.utils"``). Docstrings and comments are text, not names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    torch_aliases = {"torch"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    if any(_is_private(part) for part in alias.name.split(".")):
                        found.append((node.lineno, alias.name))
                    if alias.asname and alias.name == "torch":
                        torch_aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == "torch" or node.module.startswith("torch.")):
            if any(_is_private(part) for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            else:
                found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names if _is_private(a.name))
    skip = {id(c) for c in _docstrings(tree)}
    skip |= {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}  # the outermost only
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in skip:
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in torch_aliases and any(map(_is_private, dotted.split("."))):
                found.append((node.lineno, dotted))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _PRIVATE_PATH.match(node.value):
                found.append((node.lineno, node.value))
    return sorted(set(found))


def test_no_private_torch_name_outside_the_compat_module():
    offenders = [f"{path.relative_to(SRC.parent)}:{line}: {name}"
                 for path in sorted(SRC.rglob("*.py")) if path != COMPAT
                 for line, name in private_torch_names(path)]
    assert not offenders, ("private torch names outside openpop/torch_compat.py (add them to its PRIVATE "
                           "and import them from there):\n" + "\n".join(offenders))


def test_the_scanner_finds_each_form(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""torch._dynamo in a docstring is text."""\n'
                      "import torch\nimport torch._dynamo\nfrom torch._inductor import config\n"
                      "from torch.utils import _pytree\nfrom torch.overrides import _get_current_function_mode_stack\n"
                      "x = torch._C._set_grad_enabled\ny = torch.ops.mkldnn._linear_pointwise\n"
                      "z = 'torch._dynamo.utils'\nw = torch.nn.functional.linear\n")
    names = [name for _, name in private_torch_names(source)]
    assert names == ["torch._dynamo", "torch._inductor", "torch.utils._pytree",
                     "torch.overrides._get_current_function_mode_stack", "torch._C._set_grad_enabled",
                     "torch.ops.mkldnn._linear_pointwise", "torch._dynamo.utils"]


@pytest.mark.parametrize("private", torch_compat.PRIVATE, ids=lambda p: p.name)
def test_every_name_resolves_on_this_torch(private):
    assert private.resolve() is not None
    assert private.checked, f"{private.name}: no torch version it was checked on"
    checked = {tuple(int(x) for x in version.split(".")) for version in private.checked}
    assert checked <= set(torch_version.CHECKED), f"{private.name}: checked on versions outside torch_version.CHECKED"


def test_names_are_unique_and_read_through_the_module():
    names = [p.name for p in torch_compat.PRIVATE]
    assert len(names) == len(set(names))
    assert torch_compat.pytree.tree_flatten([1, [2]])[0] == [1, 2]
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        torch_compat.not_a_name  # noqa: B018
