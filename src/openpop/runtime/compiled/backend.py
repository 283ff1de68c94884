"""The compiled backend as the executor sees it: ``run`` either runs a whole host call as one
compiled program and returns its outputs, or returns ``DECLINED`` and the eager backend runs it.

Declining in ``auto`` logs one line naming the reason and the executor stays eager; with
``Options.openpopBackend("compiled")`` the same reason is a ``poptorch.Error``.

When torch.compile compiles (the ``Graph compilation`` bar, ``compile_seconds``):

* ``executor.compile(*args)`` with the backend forced (or ``auto`` with ``compile_after=0``):
  ``compile_ahead`` builds the program and compiles it by running it once on ``compile()``'s
  arguments and discarding the results (the program is a pure function: weights, optimizer
  state and the RNG stream are as before). The executor's bar covers it; the first host call
  just runs.
* the first host call without ``compile()``: that call compiles and runs the program; the
  executor hands its bar over (``progress``) and the bar finishes after the call.
* ``auto`` once the eager budget is spent: the host call that compiles prints a bar of its own.
"""
import contextlib
import time

import torch

from ... import errors
from ...log import logger
from .. import context, messages
from ..compile_cache import compile_cache_for
from ..progress import CompilationProgress
from ..weights import bump_weights_version
from .cuda_graphs import compile_options, mark_step_begin
from .eligibility import Ineligible, check_static, probe
from .functional_optim import FunctionalOptimizer, signature
from .selection import Selection

DECLINED = object()
_ONE = torch.tensor(1.0)


class CompiledBackend:
    """One executor's compiled backend (see the module docstring)."""

    def __init__(self, options):
        self.selection = Selection.from_options(options)
        self._program = None
        self._key = None
        self.last = None  # "compiled" or "eager": which backend ran the last host call
        self.progress = None  # the executor's unfinished bar, when the next run compiles
        self.compile_seconds = 0.0  # time spent compiling programs (torch.compile, first runs)

    def record_eager(self, seconds: float) -> None:
        self.selection.record_eager(seconds)
        self.last = "eager"

    def reset(self) -> None:
        """The executor was destroyed: its programs go too."""
        self._program = None
        self._key = None

    def run(self, executor, inputs, compiled):
        if not self.selection.wants_compiled():
            self._finish_progress()
            return DECLINED
        return self._run(executor, inputs, compiled, dry_run=False)

    def compile_ahead(self, executor, inputs, compiled) -> None:
        """``compile()``: build and compile the program now, changing nothing (module docstring)."""
        if self.selection.wants_compiled():
            rng = _RngState()
            try:
                self._run(executor, inputs, compiled, dry_run=True)
            finally:
                rng.restore()

    def _run(self, executor, inputs, compiled, dry_run):
        with _compiled_modes(compiled):
            try:
                program = self._program_for(executor, inputs, compiled)
            except Ineligible as exc:
                self._finish_progress()
                return self._decline(str(exc))
            if program.ran:
                return self._execute(executor, inputs, compiled, program, dry_run)
            progress, handed = self.progress, self.progress is not None
            if progress is None and not dry_run and executor._settings.show_compilation_progress_bar:
                progress = CompilationProgress()
            self.progress = None
            started = time.perf_counter()
            try:  # torch.compile compiles now: with the executable cache, if enabled
                with compile_cache_for(executor._compile_cache):
                    result = self._execute(executor, inputs, compiled, program, dry_run)
            except Exception as exc:  # torch.compile's errors have many types
                self.reset()
                if handed and not self.selection.forced:  # the executor's compile itself succeeded
                    progress.finish()
                return self._decline(messages.INELIGIBLE_FULLGRAPH.format(error=_first_line(exc)), exc)
            finally:
                self.compile_seconds += time.perf_counter() - started
        program.ran = True
        if progress is not None:
            progress.finish()
        return result

    def _finish_progress(self):
        """The call that was to compile runs eagerly: the executor's compile has finished."""
        if self.progress is not None:
            self.progress.finish()
            self.progress = None

    def _decline(self, reason, cause=None):
        if self.selection.forced:
            raise errors.createPoptorchError(messages.COMPILED_FORCED.format(reason=reason)) from cause
        self.selection.declined = reason
        logger.warning(messages.COMPILED_DECLINED, reason)
        return DECLINED

    # ------------------------------------------------------------------ building
    def _program_for(self, executor, inputs, compiled):
        from .program import Layout, Program  # torch's while_loop and Inductor: only when compiling
        optimizer = executor._optimizer
        key = (id(compiled), signature(optimizer) if executor._training else None)
        if self._key == key:
            if executor._training and self._program.optim.optimizer is not optimizer:
                self._program.optim.bind(optimizer)
            return self._program
        check_static(executor, compiled)
        if not all(isinstance(leaf, torch.Tensor) for leaf in inputs.leaves):
            raise Ineligible(messages.INELIGIBLE_INPUTS)
        with compiled.weights.active():
            spec, leaves = probe(executor, *_first_micro_batch(executor, inputs), compiled)
        model = executor._model
        names = [n for n, _ in model.named_parameters()]
        if executor._training:
            functional = FunctionalOptimizer(optimizer)
            by_id = {id(p): n for n, p in model.named_parameters()}
            trained = [by_id[id(p)] for p in functional.params]
        else:
            functional, trained = None, names
        frozen = [n for n in names if n not in set(trained)]
        layout = Layout(executor, inputs, spec, leaves)
        device = next(iter(model.parameters()), torch.empty(0)).device
        program = Program(model, layout, functional, compiled.loss_index, trained, frozen,
                          lambda fn: torch.compile(fn, fullgraph=True, dynamic=False, **compile_options(device)),
                          *executor._precision.traced_forward(model))
        self._program, self._key = program, key
        return program

    # ------------------------------------------------------------------ running
    def _execute(self, executor, inputs, compiled, program, dry_run=False):
        geometry = executor._geometry
        started = time.time()
        split = [inputs.leaves[pos] for pos in inputs.tensor_positions]
        split = [t if t.dim() == 0 else geometry.split(t) for t in split]
        functional = program.optim
        with compiled.weights.active(), context.running(executor._training), torch.no_grad(), \
                executor._precision.running(executor._model):  # CUDA matmul partials, as eager
            named = dict(executor._model.named_parameters())
            trained = [named[n] for n in program.trained_names]
            frozen = [named[n].detach() for n in program.frozen_names]
            if functional is not None:
                state, hyper = functional.state_in(), functional.hyper()
                loss_scale = functional.loss_scale()
            else:
                state, hyper, loss_scale = [], [], _ONE
            graphed = mark_step_begin(trained)
            new_params, new_state, outs = program.run(split, [p.detach() for p in trained], frozen,
                                                      state, hyper, loss_scale)
            if dry_run:
                return None
            if graphed:  # the graph's outputs are overwritten by its next replay
                new_state = [{k: v.clone() for k, v in st.items()} for st in new_state]
            if functional is not None:
                torch._foreach_copy_(trained, list(new_params))
                functional.commit(list(new_state))
                for p in trained:
                    p.grad = None
        if executor._training:
            bump_weights_version(executor._user_model)
        result = program.finish(outs)
        done = time.time()
        steps = geometry.device_iterations
        executor._perf = {"input": [[started] * steps], "input_complete": [[started] * steps],
                          "output": [[done] * steps], "output_complete": [[done] * steps]}
        executor._last_run_seconds = done - started
        self.last = "compiled"
        return result


@contextlib.contextmanager
def _compiled_modes(compiled):
    """The model runs in the train/eval mode it was compiled in (as the eager backend does)."""
    changed = [module for module, mode in compiled.training_flags if module.training != mode]
    for module in changed:
        module.training = not module.training
    try:
        yield
    finally:
        for module in changed:
            module.training = not module.training


class _RngState:
    """The default generators' states, put back after a dry run (dropout draws from them)."""

    def __init__(self):
        self._cpu = torch.random.get_rng_state()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._cuda = torch.cuda.get_rng_state_all() if cuda else None

    def restore(self):
        torch.random.set_rng_state(self._cpu)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)


def _first_micro_batch(executor, inputs):
    leaves = list(inputs.leaves)
    for pos in inputs.tensor_positions:
        tensor = leaves[pos]
        leaves[pos] = tensor if tensor.dim() == 0 else executor._geometry.split(tensor)[0, 0, 0]
    return inputs.rebuild(leaves)


def _first_line(exc) -> str:
    """The exception's type and its first meaningful lines (torch.compile's messages are long)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2])
    return f"{type(exc).__name__}: {text[:300]}"
