"""A compiled host call leaves no empty functorch state on its thread (issue 32: no eager
slowdown after a compile).

Each call of a ``torch.compile``d function (its compile and every run after) asks functorch for
its interpreter stack, and the first such question allocates the calling thread's functorch state
(``at::functorch::FuncTorchTLS``), which then lives as long as the thread. From then on the
autograd engine copies that state (``at::ThreadLocalState``: ``FuncTorchTLS::deepcopy``, a heap
allocation and a free) about three times per node it runs, in every backward of that thread, eager
ones too: ~0.2 us a node on a 2-core EPYC, ~1 % of the instructions of a tiny MLP's eager step.
A state with no transform on its stack and functorch's two flags at their defaults behaves as no
state at all, so after a host call that may have run compiled code, ``drop_if_empty`` drops such a
state with ``at::functorch::setFuncTorchTLS(nullptr)`` - what torch itself does when it hands a
thread a state without one (the next functorch question allocates it again). It costs ~3 us a
host call (tiny MLP at DI=1, 2-core EPYC: 75 vs 72 us), most of it that allocation; whether a state
is present is read in place through a per-thread view (no foreign call), and only a present one
costs the calls that read functorch's flags and drop it.

Both C++ functions are libtorch's exported symbols, called through ctypes. Where they cannot be
found (another platform or C++ ABI, a torch that renamed them) nothing is dropped, and eager steps
after a compile keep that cost, as they do after a ``torch.compile`` of the user's own. The
accessor's return type is not part of its mangled name, so only a torch minor version this was
checked on (``torch_version.CHECKED``) is touched: on another one nothing is dropped either.
"""
import ctypes
import os
import threading

import torch

from ... import torch_compat
from ...torch_version import CHECKED, minor_version

# libtorch's exported (Itanium C++ ABI) names of
#   std::unique_ptr<FuncTorchTLSBase>& at::functorch::functorchTLSAccessor()
#   void at::functorch::setFuncTorchTLS(const std::shared_ptr<const FuncTorchTLSBase>&)
_ACCESSOR = "_ZN2at9functorch20functorchTLSAccessorEv"
_SETTER = "_ZN2at9functorch15setFuncTorchTLSERKSt10shared_ptrIKNS0_16FuncTorchTLSBaseEE"
_LIBRARIES = ("libtorch_cpu.so", "libtorch_cpu.dylib")

_functions = None  # (accessor, setter) once looked up; () where they are not found
_EMPTY_SHARED_PTR = (ctypes.c_void_p * 2)()  # std::shared_ptr's (object, control block), both null
_EMPTY_ADDRESS = ctypes.addressof(_EMPTY_SHARED_PTR)
_threads = threading.local()  # .slot: a view of the thread's unique_ptr, read without a foreign call


def _lookup() -> tuple:
    global _functions
    if _functions is None:
        _functions = ()
        if minor_version(torch.__version__) not in CHECKED:
            return _functions
        directory = os.path.join(os.path.dirname(torch.__file__), "lib")
        for name in _LIBRARIES:
            try:
                # PyDLL: called holding the GIL (these two only touch the calling thread's state: releasing
                # and re-taking the GIL around them would cost more than they do)
                library = ctypes.PyDLL(os.path.join(directory, name))  # the one torch loaded (same file)
                accessor, setter = getattr(library, _ACCESSOR), getattr(library, _SETTER)
            except (OSError, AttributeError):
                continue
            accessor.restype, accessor.argtypes = ctypes.c_void_p, []
            setter.restype, setter.argtypes = None, [ctypes.c_void_p]
            _functions = (accessor, setter)
            break
    return _functions


def available() -> bool:
    """Whether this torch's functorch state can be read and dropped here."""
    return bool(_lookup())


def present():
    """Whether the calling thread has a functorch state (reading it allocates nothing); None where
    that cannot be read."""
    slot = _slot()
    return None if slot is None else slot.value is not None


def _slot():
    """The calling thread's ``unique_ptr`` (its address is fixed for the thread's life), as a ctypes
    view that reads it in place; None where it cannot be read."""
    functions = _functions or _lookup()
    if not functions:
        return None
    slot = getattr(_threads, "slot", None)
    if slot is None:
        slot = _threads.slot = ctypes.c_void_p.from_address(functions[0]())
    return slot


def drop_if_empty(absent_before: bool = False) -> bool:
    """Drop the calling thread's functorch state if it is empty (see the module docstring); True
    when it dropped one.

    Args:
        absent_before: The thread had no state (``present()`` was False) before the host call that
            just returned: the state is then one that call allocated, and a host call is trusted to
            leave no transform on the stack nor a flag set (torch scopes both; code that sets a flag
            unscoped inside the call would lose it), so it is dropped without reading them - the
            repeat path's saving (~2 us a call).
    """
    slot = _slot()
    if slot is None or slot.value is None:
        return False
    if not absent_before and (torch_compat.functorch_layer_depth() or
                              torch_compat.functorch_inplace_requires_grad_allowed() or
                              torch_compat.functorch_single_level_function_allowed()):
        return False  # a transform is on the stack, or a flag set: not the same as no state
    _functions[1](_EMPTY_ADDRESS)
    return True
