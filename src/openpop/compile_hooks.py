"""Callables the executor runs just before and just after it compiles a model.

``registerPreCompileHook`` / ``registerPostCompileHook`` return a
``torch.utils.hooks.RemovableHandle``; hooks are called without arguments, in
registration order, by ``run_pre_compile_hooks()`` / ``run_post_compile_hooks()``.
"""
import collections
from typing import Callable

import torch.utils.hooks

from . import errors

__all__ = [
    "registerPostCompileHook",
    "registerPreCompileHook",
    "run_post_compile_hooks",
    "run_pre_compile_hooks",
]

_pre_compile_hooks = collections.OrderedDict()
_post_compile_hooks = collections.OrderedDict()


def _register(hooks, hook) -> torch.utils.hooks.RemovableHandle:
    handle = torch.utils.hooks.RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def registerPreCompileHook(hook: Callable) -> torch.utils.hooks.RemovableHandle:
    """Call ``hook()`` before every model compilation."""
    if not callable(hook):
        raise RuntimeError(errors.PRE_COMPILE_HOOK_NOT_CALLABLE)
    return _register(_pre_compile_hooks, hook)


def registerPostCompileHook(hook: Callable) -> torch.utils.hooks.RemovableHandle:
    """Call ``hook()`` after every model compilation."""
    if not callable(hook):
        raise RuntimeError(errors.POST_COMPILE_HOOK_NOT_CALLABLE)
    return _register(_post_compile_hooks, hook)


def run_pre_compile_hooks() -> None:
    for hook in list(_pre_compile_hooks.values()):
        hook()


def run_post_compile_hooks() -> None:
    for hook in list(_post_compile_hooks.values()):
        hook()
