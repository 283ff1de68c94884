"""``module_repr`` and ``print``: torch's module repr, plus the ``BeginBlock`` annotations."""
import builtins

import torch

from .annotations import block_annotation

__all__ = ["module_repr", "print"]


def _indent(text: str, spaces: int) -> str:
    return ("\n" + " " * spaces).join(text.split("\n"))


def module_repr(m: torch.nn.Module) -> str:
    """``repr(m)`` with ``BeginBlock(user_id=..., ipu_id=...)`` before each annotated module."""
    extra = m.extra_repr()
    extra_lines = extra.split("\n") if extra else []
    child_lines = [f"({name}): {_indent(module_repr(child), 2)}"
                   for name, child in m._modules.items() if child is not None]
    lines = extra_lines + child_lines

    annotation = block_annotation(m)
    text = (f"{annotation!r} " if annotation is not None else "") + m._get_name() + "("
    if lines:
        if len(extra_lines) == 1 and not child_lines:
            text += extra_lines[0]
        else:
            text += "\n  " + "\n  ".join(lines) + "\n"
    return text + ")"


def print(*objects, **kwargs):
    """Builtin ``print``, except that modules are shown with ``module_repr``."""
    builtins.print(*(module_repr(o) if isinstance(o, torch.nn.Module) else o for o in objects),
                   **kwargs)
