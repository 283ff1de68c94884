"""Whole programs saved in the executable cache, so that a later process skips Dynamo's trace.

torch's own caches (``compile_cache.py``) hold what AOTAutograd and Inductor produce, but a
process that finds them still traces the program with Dynamo - for BERT-base most of a cached
compile. With the executable cache on (``enableExecutableCaching`` / ``POPTORCH_CACHE_DIR``), a
program is instead compiled with ``torch.compile(...).aot_compile()`` and saved whole (Dynamo's
transformed bytecode, its guards, the bundled AOTAutograd/Inductor artefacts) as
``<cache>/openpop-programs/<key>.program``; a process whose program has the same key loads it and
runs it without tracing. Without the executable cache nothing changes (``SavedProgram`` is not used).

*Guards.* Dynamo's full guard set cannot be saved (the first failure, "DICT_VERSION guard cannot
be serialized", is the guard on ``torch.utils._pytree.SUPPORTED_NODES`` that pytree flattening
installs; ID/closure/module matches on functions follow), so the saved program keeps torch's
portable guards only (``torch.compiler.keep_portable_guards_unsafe``: every argument tensor's
shape, stride, dtype and device, and torch's global state - grad mode, autocast, ...), checked
before every call. What the other guards covered is covered here:

* the *key* (``program_key``): a hash of what the trace depends on - the probe micro-batch's aten
  op sequence (each op's name, its tensor arguments' shapes and dtypes, its other arguments: one
  op that differs, e.g. ``tanh`` for ``relu``, or a different dropout probability, gives another
  key; the model's forward and backward only, run on fake tensors: *The probe* below), the
  modules' classes, parameters (names, shapes, dtypes, devices, ``requires_grad``), buffers and
  forward hooks (by qualified name and code), the program's layout (geometry, output mode,
  outputs, anchors, loss index, updated buffers), the optimizer's class and hyperparameter
  structure (``optimizer_support.signature``), precision contexts, loss scaling, Inductor's
  options, torch / openpop / Python versions, a hash of the compiled backend's source
  (``compile_cost.program_source``: a cache written by other code holds programs of other inputs,
  which would fail their guards every process) and the intra-op thread count;
* *the Python values the trace read* (every constant-valued guard Dynamo made, e.g.
  ``self.layout.geometry.device_iterations`` or a module's ``training``, and the identity, by
  qualified name, of functions, classes and modules it guarded on) are saved with the program and
  compared with the loading process's values before the program is used; the constants are
  compared again before every call, so a value the model reads that changes between host calls
  (Lightning's ``current_epoch``) sends the program to the ordinary ``torch.compile`` path, which
  re-traces with full guards (and its recompile limit) as without the cache.

*The probe.* With the executable cache on, the backend first runs the probe micro-batch on fake
tensors (``shapes_only.py``: no values computed, ~10x cheaper than a real run for BERT-base) and
keys the program with its op sequence and what it found (outputs, updated buffers, random
draws). When that key's program is on disk it is loaded and the real probe never runs: the
saving process built the program from a real probe, and the key holds every field of it the
program depends on, so an equal key is a fake run that found what the real one found. Otherwise
the real probe runs, the program is built from what it found and keyed with the fake run's op
sequence (the same ops as a real run: ``tests/test_shapes_only.py``), so that the next process
finds it. A model fake tensors cannot run (a value read with ``.item()``) is keyed with its real
run's ops, both ways. A fake run that finds something else than the real one (a draw from a
private generator, which the real probe does not count) only costs the real probe: its key is
another, which no program is saved under.

A program whose ``aot_compile`` or save fails, a saved program that fails to load or whose values
differ, and any call whose checks fail, use the ordinary path (one info line; nothing is lost but
the time of a trace - and, when saving failed after Inductor compiled, that compile: the bundled
artefacts do not fill Inductor's FX-graph cache). A program torch could not save leaves
``<key>.program.unsaved`` (the reason), so later processes do not try again. Seen: Lightning's
step programs (the guards' pickle of the program reaches the trainer's thread locks; one
``UncapturedHigherOrderOpError`` from ``aot_compile`` where ``torch.compile`` succeeds).
*Limits:* a function or class swapped between host calls in the same
process for another of the same qualified name, and Python state the trace read through an
object's identity only, are not noticed (Dynamo's ID guards would have re-traced); a saved program
is only valid for this machine's torch build (the key holds torch's version and torch checks its
system info on load). The probe's op sequence is that of one eager micro-batch: code that traces
differently from how it runs eagerly (``torch.compiler.is_compiling()`` branches) is keyed on its
eager ops only.
"""
import ast
import builtins
import contextlib
import functools
import hashlib
import importlib
import os
import pickle
import re
import sys

import torch

from ...log import logger
from ...torch_compat import TorchDispatchMode
from .. import messages
from ..shapes_only import is_metadata
from .kernel_batch import batched_kernels

DIRECTORY = "openpop-programs"
SUFFIX = ".program"
UNSAVED = ".unsaved"  # next to where a program torch could not save would be: the reason
_VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")
_IDENTITY_GUARDS = ("ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "CLOSURE_MATCH", "BUILTIN_MATCH")
_CONSTANTS = (bool, int, float, str, type(None))
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_TORCH_GLOBALS = ("G['__import_torch", "G['torch']")


class OpRecorder(TorchDispatchMode):
    """Hashes every aten op run inside it: name, tensor arguments' shapes and dtypes, other arguments."""

    def __init__(self):
        super().__init__()
        self._hash = hashlib.sha256()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not is_metadata(func):
            self._hash.update(f"{func}{_describe(args)}{_describe(kwargs)};".encode())
        return func(*args, **kwargs)

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"T{tuple(value.shape)}{value.dtype}{value.device.type}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_describe(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_describe(v)}" for k, v in value.items()) + "}"
    return _ADDRESS.sub("", repr(value))


def program_key(call, program, ops_digest, options) -> str:
    """The saved program's file name: a hash of everything the program is a function of (module docstring)."""
    from ..._version import poptorch_version as __version__  # (the package root is a front-end)
    from .compile_cost import program_source
    from .eligibility import forward_hooks  # (eligibility imports this module)
    from .optimizer_support import signature
    model = call.model
    layout = program.layout
    g = layout.geometry
    parts = [
        torch.__version__, __version__, program_source(), sys.version, torch.get_num_threads(), ops_digest,
        [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()],
        [(n, tuple(p.shape), p.dtype, p.device.type, p.requires_grad) for n, p in model.named_parameters()],
        [(n, tuple(b.shape), b.dtype, b.device.type) for n, b in model.named_buffers()],
        [(module, kind, _name_of(hook)) for module, kind, hook in forward_hooks(model)],
        (g.device_iterations, g.gradient_accumulation, g.replication_factor, layout.chunks, layout.training),
        (layout.mode, layout.period, layout.output_spec, layout.output_leaves, layout.micro_batch_leaves,
         layout.mean, layout.running),
        (layout.inputs.simple, layout.inputs.spec, layout.inputs.tensor_positions, _describe(layout.inputs.leaves)),
        signature(call.optimizer) if call.training else None,
        (program.loss_index, program.trained_names, program.frozen_names, program.buffer_names,
         program.assigned, program.buffer_sets, program.draws_random, program.stepwise, program.loops_micro_batches,
         program.anchored, program.per_step_hyper, program.scaling.automatic, program.rounded),
        [_name_of(factory) for factory in program.forward_contexts],
        sorted((k, _describe(v)) for k, v in options.items()),
        _compiler_configuration(),
    ]
    return hashlib.sha256(_ADDRESS.sub("", repr(parts)).encode()).hexdigest()[:40]


def _compiler_configuration() -> str:
    """Inductor's and AOTAutograd's process-wide settings (``TORCHINDUCTOR_*`` variables, a
    ``torch._inductor.config`` the user set): a program built under other settings is another
    program, as torch's own cache keys have it. ``options`` above are only what openpop patches."""
    from ...torch_compat import functorch_config, inductor_config
    settings = {**inductor_config.save_config_portable(),
                **{"functorch." + k: v for k, v in functorch_config.save_config_portable().items()}}
    return repr(sorted((k, repr(v)) for k, v in settings.items()))


def _name_of(value) -> str:
    """Identity of a function, class or module across processes: its qualified name (and code)."""
    if isinstance(value, type(sys)):
        return f"module {value.__name__}"
    code = getattr(value, "__code__", None)
    if isinstance(value, functools.partial):
        return f"partial {_name_of(value.func)} {_describe(value.args)} {_describe(value.keywords)}"
    name = f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    if code is not None:
        name += f" {hashlib.sha256(code.co_code).hexdigest()[:16]}"
    return name


class _Globals(dict):
    """The traced function's globals for evaluating guard names: the names Dynamo adds to the
    frame's globals when it traces - ``__import_a_dot_b`` (module ``a.b``), ``__builtins_dict___N``
    (the builtins) - resolve in a process that did not trace."""

    def __missing__(self, name):
        if name.startswith("__builtins_dict__"):
            value = builtins.__dict__
        elif name.startswith("__import_"):
            value = importlib.import_module(name[len("__import_"):].replace("_dot_", "."))
        else:
            raise KeyError(name)
        self[name] = value  # (a module object stays the module: the checks read through it each call)
        return value


class _Watched:
    """The Python values a trace read (module docstring), as one compiled expression per kind."""

    def __init__(self, argnames, constants, identities):
        self.argnames = argnames
        self.constants = constants  # [(guard name, value)]
        self.identities = identities  # [(guard name, qualified name)]
        self._constants = _compile(argnames, [name for name, _ in constants])
        self._identities = _compile(argnames, [name for name, _ in identities])
        self._expected = tuple(value for _, value in constants)
        self._types = tuple(type(value) for value in self._expected)

    def state(self):
        return self.argnames, self.constants, self.identities

    def constants_hold(self, globals_, args) -> bool:
        try:
            values = self._constants(globals_, *args)
        except Exception:  # an attribute that went away: not the program's state any more
            return False
        return values == self._expected and tuple(map(type, values)) == self._types

    def differences(self, globals_, args) -> list:
        """The guard names whose values differ (for the log line)."""
        scope = dict(zip(self.argnames, args), G=globals_)
        found = []
        for name, expected in [*self.constants, *self.identities]:
            try:
                value = eval(name, {}, scope)  # guard names Dynamo wrote for this program
            except Exception as exc:
                found.append(f"{name}: {type(exc).__name__}")
                continue
            if (expected, type(expected)) != (value, type(value)) and expected != _name_of(value):
                found.append(f"{name}: {value!r} (was {expected!r})")
        return found

    def identities_hold(self, globals_, args) -> bool:
        try:
            values = self._identities(globals_, *args)
        except Exception:
            return False
        return [_name_of(v) for v in values] == [name for _, name in self.identities]


def _compile(argnames, names):
    """One function of the traced function's arguments returning every guard name's value."""
    direct = _Direct()
    values = ast.Tuple([direct.visit(ast.parse(name, mode="eval").body) for name in names], ast.Load())
    function = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in ("G", *argnames)], kwonlyargs=[],
                                        kw_defaults=[], defaults=[]), values)
    code = compile(ast.fix_missing_locations(ast.Expression(function)), "<saved program checks>", "eval")
    return eval(code)  # guard names Dynamo wrote for this program


class _Direct(ast.NodeTransformer):
    """``dict(x.__dict__)[k]`` (Dynamo's spelling of a class attribute read past descriptors) as
    ``x.__dict__[k]``: the same object, without copying the class's namespace at every check."""

    def visit_Subscript(self, node):
        node = self.generic_visit(node)
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "dict" \
                and len(call.args) == 1 and not call.keywords \
                and isinstance(call.args[0], ast.Attribute) and call.args[0].attr == "__dict__":
            node.value = call.args[0]
        return node


class SavedProgram:
    """``Program._compiled`` with the executable cache on: the program loaded from
    ``<cache>/openpop-programs/<key>.program``, or ``aot_compile``d and saved there, at its first
    call; the ordinary ``torch.compile``d function (``fallback()``) when that is not possible or
    its checks fail (module docstring). ``source``: "loaded", "saved" or "traced"."""

    def __init__(self, fn, options, compiler, fallback):
        self._fn = fn  # the program's bound method (Program._own_code)
        self._options = dict(options)
        self._compiler = compiler  # inductor.ProgramCompiler: its compiling_only() applies here too
        self.path = None  # set by the backend once the program is built (program_key)
        self._make_fallback = fallback
        self._fallback = None
        self._aot = None
        self._watched = None
        self._guards = None
        self._call = None
        self._globals = _Globals(fn.__func__.__globals__)
        self.source = None

    def on_disk(self) -> bool:
        """Whether a call would load the program from ``path`` (rather than compile and save it)."""
        return self.path is not None and os.path.exists(self.path) and not os.path.exists(self.path + UNSAVED)

    def __reduce__(self):  # Dynamo pickles the program object (``self``) with the guards: not this
        return _absent, ()

    def __call__(self, *args):
        if self._fallback is None and self._aot is None:
            self._prepare(args)
        if self._aot is not None:
            full = (self._fn.__self__, *args)
            if self._watched.constants_hold(self._globals, full) and self._guards.check(
                    dict(zip(self._watched.argnames, full))):
                if self._compiler.skipping:  # compile(): compiled or loaded, not run (backend.py)
                    return (None,) * 6
                return self._call(*full)
            if self._fn.__self__.assigned_slots:  # traced once only (assigned_slots.py), here too
                from ...torch_compat import FailOnRecompileLimitHit
                raise FailOnRecompileLimitHit(messages.SAVED_PROGRAM_SLOTS_CHANGED.format(path=self.path))
            self._use_fallback(messages.SAVED_PROGRAM_CHANGED, self.path)
        return self._fallback(*args)

    def _prepare(self, args):
        if self.path is None:
            self._use_fallback(messages.SAVED_PROGRAM_NOT_SAVED, self.path, "no key")
            return
        if os.path.exists(self.path + UNSAVED):  # torch could not save it before: not tried again
            self._use_fallback(messages.SAVED_PROGRAM_NOT_SAVED, self.path, "failed before")
            return
        if os.path.exists(self.path):
            try:
                self._load(args)
                self.source = "loaded"
                _count("saved_program_loaded")
                logger.info(messages.SAVED_PROGRAM_LOADED, self.path)
                return
            except Exception as exc:  # a stale, truncated or foreign file: compile as usual
                self._aot = None
                self._use_fallback(messages.SAVED_PROGRAM_UNUSABLE, self.path, _first_line(exc))
                return
        try:
            self._save(args)
            self.source = "saved"
            _count("saved_program_saved")
        except Exception as exc:  # torch cannot save this program (its guards, its backend)
            self._aot = None
            self._use_fallback(messages.SAVED_PROGRAM_NOT_SAVED, self.path, _first_line(exc))
            with contextlib.suppress(OSError):
                _atomic_write(self.path + UNSAVED, _first_line(exc).encode())

    def _use_fallback(self, message, *values):
        logger.info(message, *values)
        self._aot = None
        self.source = "traced"
        if self._fallback is None:
            self._fallback = self._make_fallback(self._fn)

    def _save(self, args):
        seen = []

        def keep(entries):
            seen.extend(entries)
            return torch.compiler.keep_portable_guards_unsafe(entries)

        compiled = torch.compile(self._fn.__func__, backend="inductor", fullgraph=True, dynamic=False,
                                 options={**self._options, "guard_filter_fn": keep})
        with batched_kernels():  # as inductor.ProgramCompiler builds the ordinary path's kernels
            aot = compiled.aot_compile(((self._fn.__self__, *args), {}))
        argnames = list(aot._artifacts.signature.parameters)
        watched = _watched_from(argnames, seen)
        full = (self._fn.__self__, *args)
        if not watched.constants_hold(self._globals, full):
            raise ValueError(messages.SAVED_PROGRAM_VALUES.format(
                differences="; ".join(watched.differences(self._globals, full)[:3])))
        self._use(aot, watched)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        payload = aot.serialize(aot).serialized_data
        _atomic_write(self.path, pickle.dumps((watched.state(), payload)))

    def _load(self, args):
        from ...torch_compat import (
            AOTCompiledFunction,
            CompileContext,
            FakeTensorMode,
            TracingContext,
            compile_context,
            get_metrics_context,
            tracing,
        )
        with open(self.path, "rb") as file:
            (argnames, constants, identities), payload = pickle.load(file)
        with contextlib.suppress(OSError):
            os.utime(self.path)  # recently used: the default cache's size cap deletes the least recent
        watched = _Watched(argnames, constants, identities)
        full = (self._fn.__self__, *args)
        if not (watched.constants_hold(self._globals, full) and watched.identities_hold(self._globals, full)):
            raise ValueError(messages.SAVED_PROGRAM_VALUES.format(
                differences="; ".join(watched.differences(self._globals, full)[:3])))
        from ...torch_compat import get_compile_id
        # Unpickling the guards re-creates sources that register guards: they need a tracing context.
        with compile_context(CompileContext(get_compile_id({}))), get_metrics_context(), \
                tracing(TracingContext(FakeTensorMode())):
            with batched_kernels():  # its kernels: one library, from Inductor's cache when warm
                aot = AOTCompiledFunction.deserialize(payload, f_globals=self._fn.__func__.__globals__)
        self._use(aot, watched)

    def _use(self, aot, watched):
        self._aot, self._watched = aot, watched
        self._guards = aot._artifacts.guard_manager
        self._call = aot.fn


def _count(name):
    """torch's counters, which ``compile_cache.watch_compiles`` reads."""
    from ...torch_compat import dynamo_counters as counters
    counters["openpop"][name] += 1


def _absent():
    return None


def _watched_from(argnames, entries) -> _Watched:
    constants, identities, names = [], [], set()
    for entry in entries:
        name = entry.name
        if name in names or not entry.has_value or name.startswith(_TORCH_GLOBALS):
            continue
        if entry.guard_type == "NOT_PRESENT_IN_GENERIC_DICT":  # a class attribute no instance shadows
            attribute = getattr(getattr(entry.orig_guard, "create_fn", None), "keywords", {}).get("attr")
            if attribute is None:
                raise ValueError(messages.SAVED_PROGRAM_UNNAMED_GUARD.format(name=name))
            name = f"{attribute!r} in {name}.__dict__"
            if name in names:
                continue
            constants.append((name, False))
        elif entry.guard_type in _VALUE_GUARDS and type(entry.value) in _CONSTANTS:
            constants.append((name, entry.value))
        elif entry.guard_type in _IDENTITY_GUARDS and (callable(entry.value) or isinstance(entry.value, type(sys))):
            identities.append((name, _name_of(entry.value)))
        else:
            continue
        names.add(name)
    return _Watched(argnames, constants, identities)


def _atomic_write(path, data: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def _first_line(exc) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:300]}"
