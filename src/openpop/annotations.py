"""Block annotations: ``BeginBlock``, ``Block``, ``BlockFunction``, ``removeBlocks``.

A block names a contiguous part of the forward pass; execution strategies later group
blocks into stages and stages onto virtual IPUs. Annotations do not change what a model
computes: outside an executor (plain CPU/GPU execution) every one of them is a no-op.

While an executor runs a model, it may place a *block recorder* on the run context
(``openpop.runtime.context.current().block_recorder``): any object with

* ``begin_block(user_id: str, ipu_id: Optional[int])`` — ops from now on belong to this block;
* ``end_block()`` — a ``with Block(...)`` scope closed: no block is active until the next one.

Annotations report to it in the order the forward pass meets them. Ops that run after a
``with Block`` closed and before the next block starts are an error in PopTorch ("No active
Block"); the engine's block recorder (``runtime/plan.py``) watches the ops of the compile
trace and raises that error for any op run while no block is active (a module entered then
joins the block that starts next). ``assert_active_block()`` is the same check for code that
observes single ops itself.

Blocks without a ``user_id`` get automatic ids "0", "1", ... in the order they start in each
run; ``Block.useAutoId()`` restarts the count.
"""
import contextlib
import functools
import weakref
from typing import Callable, Optional

import torch

from . import errors
from .errors import NO_ACTIVE_BLOCK, NO_ACTIVE_BLOCK_FIX, POPTORCH_OP, Error, createPoptorchError, with_fix
from .runtime import context
from .strategies import check_ipu_index

__all__ = [
    "BeginBlock",
    "Block",
    "BlockFunction",
    "LegacyBeginBlockFn",
    "assert_active_block",
    "block_annotation",
    "current_block",
    "openpop_ops",
    "removeBlocks",
]


class _RunBlockState:
    """What one run has seen of blocks: the auto-id counter and the active block."""

    def __init__(self):
        self.next_auto_id = 0
        self.active = None  # (user_id, ipu_id) of the block ops currently belong to
        self.closed = False  # a `with Block` ended and no block has started since

    def take_auto_id(self) -> str:
        auto_id = str(self.next_auto_id)
        self.next_auto_id += 1
        return auto_id


# One state per run context, dropped with the context.
_states = weakref.WeakKeyDictionary()


def _recording_run():
    """The current run context if it records blocks, else None."""
    ctx = context.current()
    if ctx is None or getattr(ctx, "block_recorder", None) is None:
        return None
    return ctx


def _state_of(ctx) -> _RunBlockState:
    state = _states.get(ctx)
    if state is None:
        state = _states[ctx] = _RunBlockState()
    return state


def _begin_block(user_id: Optional[str], ipu_id: Optional[int]) -> None:
    ctx = _recording_run()
    if ctx is None:
        return
    state = _state_of(ctx)
    if user_id is None:
        user_id = state.take_auto_id()
    elif not isinstance(user_id, str):
        user_id = str(user_id)  # (PopTorch's tests name blocks 1, 2, ...: the plan's ids are strings)
    state.active = (user_id, ipu_id)
    state.closed = False
    ctx.block_recorder.begin_block(user_id, ipu_id)


def _end_block() -> None:
    ctx = _recording_run()
    if ctx is None:
        return
    state = _state_of(ctx)
    state.active = None
    state.closed = True
    ctx.block_recorder.end_block()


def current_block():
    """``(user_id, ipu_id)`` of the active block of the recording run, else None.

    None also before the first block starts: those ops default to stage 0 / IPU 0.
    """
    ctx = _recording_run()
    return None if ctx is None else _state_of(ctx).active


def assert_active_block() -> None:
    """Raise ``Error(NO_ACTIVE_BLOCK)`` if an op now would belong to no block.

    That is the case after a ``with Block(...)`` ended and before the next block started.
    A no-op outside a recording run.
    """
    ctx = _recording_run()
    if ctx is not None and _state_of(ctx).closed:
        raise Error(with_fix(NO_ACTIVE_BLOCK, NO_ACTIVE_BLOCK_FIX.format(op=POPTORCH_OP)))


@contextlib.contextmanager
def openpop_ops():
    """Context for ops openpop itself runs inside a model's forward (a front-end wrapping the
    user's loss, say): they belong to no user block, and the "No active Block" check of the
    recording run (if it has one) lets them pass."""
    ctx = _recording_run()
    allowing = getattr(ctx.block_recorder, "allowing_ops", None) if ctx is not None else None
    if allowing is None:
        yield
        return
    with allowing():
        yield


class _BlockHook:
    """Forward-pre-hook that starts a block each time its module runs.

    Lives in the module's own ``_forward_pre_hooks``, so it is copied, deep-copied and
    pickled (``torch.save``) together with the module.
    """

    def __init__(self, user_id: Optional[str], ipu_id: Optional[int]):
        self.user_id = user_id
        self.ipu_id = ipu_id

    def __call__(self, module, inputs):
        _begin_block(self.user_id, self.ipu_id)

    def __repr__(self):
        return f"BeginBlock(user_id={self.user_id}, ipu_id={self.ipu_id})"


def block_annotation(module: torch.nn.Module) -> Optional[_BlockHook]:
    """The ``BeginBlock`` annotation of ``module`` itself (not its children), or None."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, _BlockHook):
            return hook
    return None


class LegacyBeginBlockFn(torch.nn.Module):
    """``BeginBlock`` applied to a plain callable (PopTorch's legacy form): a module that starts
    the block, then calls it. Pickles with its callable (a module-level function does; a lambda
    does not); ``removeBlocks`` leaves it calling the function outside any block."""

    def __init__(self, layer_to_call: Callable, user_id: Optional[str] = None,
                 ipu_id: Optional[int] = None):
        super().__init__()
        self._layer_to_call = layer_to_call
        self.register_forward_pre_hook(_BlockHook(user_id, ipu_id))

    @property
    def _user_id(self):
        hook = block_annotation(self)
        return None if hook is None else hook.user_id

    @property
    def _ipu_id(self):
        hook = block_annotation(self)
        return None if hook is None else hook.ipu_id

    def forward(self, *args, **kwargs):
        return self._layer_to_call(*args, **kwargs)

    def extra_repr(self):
        call = self._layer_to_call
        return getattr(call, "__qualname__", None) or type(call).__name__


def BeginBlock(layer_to_call, user_id: Optional[str] = None,
               ipu_id: Optional[int] = None) -> torch.nn.Module:
    """Start block ``user_id`` (on ``ipu_id``) whenever ``layer_to_call`` runs.

    Ops stay in that block until another block starts. Returns the same module.
    """
    if ipu_id is not None:
        check_ipu_index(ipu_id, "BeginBlock")
    if not isinstance(layer_to_call, torch.nn.Module):
        if callable(layer_to_call):
            return LegacyBeginBlockFn(layer_to_call, user_id, ipu_id)
        raise createPoptorchError(errors.BLOCK_TARGET_TYPE)
    if block_annotation(layer_to_call) is not None:
        raise createPoptorchError(errors.ALREADY_IN_BLOCK)
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:
    """Remove every ``BeginBlock`` annotation from ``module`` and its sub-modules."""
    if not isinstance(module, torch.nn.Module):
        raise AssertionError(errors.REMOVE_BLOCKS_NOT_MODULE)
    for m in module.modules():
        for handle_id in [k for k, hook in m._forward_pre_hooks.items()
                          if isinstance(hook, _BlockHook)]:
            del m._forward_pre_hooks[handle_id]


class Block(torch.nn.Module):
    """Context manager: the ops run inside ``with Block(user_id, ipu_id):`` form one block.

    When the scope ends no block is active until the next one starts.
    """

    def __init__(self, user_id: Optional[str] = None, ipu_id: Optional[int] = None):
        super().__init__()
        if ipu_id is not None:
            check_ipu_index(ipu_id, "Block")
        self._user_id = user_id
        self._ipu_id = ipu_id

    @staticmethod
    def useAutoId() -> None:
        """Restart automatic block ids at "0" (call at the start of ``forward``)."""
        ctx = _recording_run()
        if ctx is not None:
            _state_of(ctx).next_auto_id = 0

    @staticmethod
    def start(user_id: Optional[str] = None, ipu_id: Optional[int] = None) -> None:
        """Start a block without a scope, like ``BeginBlock`` does."""
        if ipu_id is not None:
            check_ipu_index(ipu_id, "Block.start")
        _begin_block(user_id, ipu_id)

    def __enter__(self):
        Block.start(self._user_id, self._ipu_id)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        _end_block()

    def extra_repr(self):
        return f"user_id={self._user_id}, ipu_id={self._ipu_id}"


def BlockFunction(user_id: Optional[str] = None, ipu_id: Optional[int] = None):
    """Decorator: every call of the function runs inside ``with Block(user_id, ipu_id)``."""
    if ipu_id is not None:
        check_ipu_index(ipu_id, "BlockFunction")

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)

        return wrapper

    return decorator
