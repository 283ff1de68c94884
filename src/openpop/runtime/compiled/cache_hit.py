"""Calling a compiled program the way Dynamo calls it on a cache hit, without Dynamo's per-call
frame machinery, and the guards the program keeps.

A call of a ``torch.compile``d function that hits Dynamo's cache does three things: the Python
wrapper (``eval_frame.py``'s ``compile_wrapper``) saves and sets Dynamo's callback and several
thread-local states; the C frame evaluator runs each cache entry's guards (``guard_manager``)
on the frame's arguments; the first entry whose guards pass runs its transformed code (which
unpacks the arguments, calls the compiled graph and builds the result). For a one-step program
of a tiny model the first part costs more than the other two together (tiny MLP, one thread:
the whole call ~115 us; the guards ~12, the transformed code ~40).

``CacheHitCall`` does the second and third parts itself: it reads the code object's cache
entries (``_debug_get_cache_entry_list``, as torch's own recompile reporting does), checks each
entry's guard manager on the call's arguments (``guard_manager.check``, as Dynamo's own
post-compile sanity check does) and runs the first matching entry's code on them. Its checks are
Dynamo's own - every guard Dynamo would evaluate, under the same grad mode and global state -
so it runs exactly what Dynamo would run, or nothing. Whenever it cannot say (no entry passes,
no entry yet, a ``torch.compiler.set_stance`` other than the default, an API missing in this
torch), it calls the ``torch.compile``d function, which traces, recompiles, or fails on torch's
recompile limit as usual; an entry Dynamo drops (``torch._dynamo.reset()``, a guarded object
freed) is gone from the list the next call reads. What is skipped: the wrapper's bookkeeping
(its callback is only consulted when tracing, and the transformed code calls nothing Dynamo
would trace), the profiler's "Torch-Compiled Region" marker, the cache entries' reordering, and
the ``torch._dynamo.disable`` wrapper around the compiled graph the entry's code calls (it clears
Dynamo's frame callback for the graph's Python wrappers: ``CacheHitCall`` runs entries only when
no callback is set, and calls through Dynamo otherwise).

``program_guards``: the guards a program keeps (the ``guard_filter_fn`` every program is compiled
with; one filter for all uses). A program is rebuilt whenever what openpop reads while tracing
changes (``backend._program_for`` keys it: geometry, output mode, optimizer signature, loss
scaling, anchors, ...), so guards on the ``Program`` object's own attributes (its layout,
geometry, functional optimizer's static choices) can never fail; nor, unless someone replaces
library functions while a program lives, can guards on globals of ``program.py``, of torch's and
openpop's modules and on Python's builtins. Both are dropped (438 -> 122 guards for the tiny MLP
of ``benchmarks/host_overhead.py``, 11-13 -> 5 us per check). Kept: the tensors' guards (shape,
stride, dtype, device, requires_grad), torch's global state (grad mode, autocast, deterministic
algorithms, default device, torch function modes, saved-tensor hooks), everything under the
user's model (``self.model``: its structure, the attributes its forward reads, its class), the
forward's precision contexts, the user's own module globals and any global Dynamo installed.
"""
import re
import types

from ...torch_compat import dynamo_c_eval_frame
from ...torch_compat import dynamo_eval_frame as eval_frame

_cache_entries = getattr(dynamo_c_eval_frame, "_debug_get_cache_entry_list", None)
_eval_frame_callback = getattr(dynamo_c_eval_frame, "get_eval_frame_callback", lambda: True)
_KEPT_UNDER_SELF = ("self.model", "self.forward_contexts")
_OWN_PACKAGES = ("torch", "openpop", "poptorch", "popart", "popdist")
_CALLS = re.compile(r"^([\w.]+\()+")  # a guard name's leading calls: dict(type(self.model)...
_DYNAMO_INSTALLED = re.compile(r"__|_\d+_c")  # globals Dynamo adds to the traced frame's module


def program_guards(entries):
    """``torch.compile``'s ``guard_filter_fn`` for programs (module docstring): keep or drop each."""
    return [not (_openpop_state(entry.name) or _library_global(entry.name)) for entry in entries]


def _openpop_state(name: str) -> bool:
    """A guard on the ``Program`` (the traced method's ``self``), but not on the user's model."""
    name = _CALLS.sub("", name)
    return name == "self" or (name.startswith("self.") and not name.startswith(_KEPT_UNDER_SELF))


def _library_global(name: str) -> bool:
    """A guard on a global of ``program.py`` (the traced frame's globals: ``torch``, openpop's
    helpers), of a module of torch or openpop, on Python's builtins, or on torch's pytree registry."""
    if "__import__('torch')" in name:
        return True
    name = _CALLS.sub("", name)
    if not name.startswith("G['"):
        return False
    key = name[3:name.index("']")]
    if key.startswith("__import_"):  # Dynamo's alias of a module the inlined code reads a global of
        return key[len("__import_"):].split("_dot_")[0] in _OWN_PACKAGES
    if key.startswith("__builtins_dict"):
        return True
    return _DYNAMO_INSTALLED.match(key) is None  # else program.py's own name


class CacheHitCall:
    """``CacheHitCall(method, compiled, around_dynamo)(*args)`` is ``compiled(*args)``, ``compiled``
    being ``torch.compile(method)`` (see the module docstring), called inside ``around_dynamo()``
    when it goes through Dynamo: tracing runs the model's Python, which may ask for the run context."""

    def __init__(self, method, compiled, around_dynamo):
        function = method.__func__
        self._around_dynamo = around_dynamo  # a context for calls through Dynamo (which may trace)
        self._code = function.__code__
        self._globals = function.__globals__
        self._self = method.__self__
        self._names = self._code.co_varnames[:self._code.co_argcount]
        self._compiled = compiled
        self._functions = []  # (a cache entry's transformed code, a function running it), newest first

    def __call__(self, *args):
        stance = eval_frame._stance
        if (_cache_entries is not None and stance.stance == "default" and stance.backend is None
                and _eval_frame_callback() is None):
            entries = _cache_entries(self._code)
            if entries:
                frame_locals = dict(zip(self._names, (self._self, *args)))
                for entry in entries:
                    if entry.guard_manager.check(frame_locals):
                        return self._function(entry.code)(self._self, *args)
        with self._around_dynamo():
            return self._compiled(*args)

    def _function(self, code):
        for known, function in self._functions:  # (by identity: hashing a code object costs a µs)
            if known is code:
                return function
        function = types.FunctionType(code, _graphs_unwrapped(self._globals, code))
        self._functions = [(code, function), *self._functions[:7]]
        return function


def _graphs_unwrapped(module_globals, code):
    """The globals ``code`` (an entry's transformed code) runs with: the module's, except that the
    compiled graphs it calls (``__compiled_fn_*``, which Dynamo wraps in ``torch._dynamo.disable``
    so that no frame inside runs under Dynamo's callback) are the graphs themselves. The callback
    is ``None`` whenever ``CacheHitCall`` runs an entry, so the wrapper's switching of it (a few
    microseconds per call) changes nothing there."""
    wrapped = {name: module_globals[name] for name in code.co_names
               if name.startswith("__compiled_fn") and getattr(module_globals.get(name), "_torchdynamo_disable", False)}
    if not wrapped:
        return module_globals
    own = dict(module_globals)
    for name, function in wrapped.items():
        while getattr(function, "_torchdynamo_disable", False):  # (nested: each layer wraps the one inside)
            function = function._torchdynamo_orig_callable
        own[name] = function
    return own
