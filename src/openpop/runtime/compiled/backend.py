"""The compiled backend as the executor sees it: ``run`` either runs a whole host call as one
compiled program and returns its outputs, or returns ``DECLINED`` and the eager backend runs it.

Declining in ``auto`` logs one line naming the reason and the executor stays eager; with
``Options.openpopBackend("compiled")`` the same reason is a ``poptorch.Error``.

A model may take part (Lightning's ``StepModule`` does): ``compiled_micro_batch_leaves()``,
asked after the probe, is how many trailing output leaves the program returns for every
micro-batch whatever the output mode; ``compiled_host_call_result(result)`` turns the program's
result into the host call's; ``compiled_forward_contexts()``, ``(factories, stepwise)`` as
``RunPrecision.traced_forward``, adds contexts the program enters around each traced forward.

When torch.compile compiles (the ``Graph compilation`` bar, ``compile_seconds``):

* ``executor.compile(*args)`` with the backend forced (or ``auto`` with ``compile_after=0``):
  ``compile_ahead`` builds the program and compiles it by calling it once on ``compile()``'s
  arguments without running it (``inductor.py``: the compiled graph returns placeholders, which
  are discarded; weights, optimizer state and the RNG stream are as before). The executor's bar
  covers it; the first host call runs the program for the first time - a failure there is still
  a compile failure (``auto``: eager from then on) - without a bar of its own.
* the first host call without ``compile()``: that call compiles and runs the program; the
  executor hands its bar over (``progress``) and the bar finishes after the call.
* ``auto`` once the eager budget is spent: the host call that compiles prints a bar of its own.
"""
import contextlib
import time

import torch
from torch.utils.hooks import RemovableHandle

from ... import errors
from ...log import logger
from ...torch_compat import dynamo_config, set_grad_enabled
from .. import context, messages
from ..backend_contract import DECLINED, REGIONS, RETRACED, Backend
from ..compile_cache import compile_cache_for
from ..perf import UniformCounters
from ..progress import CompilationProgress
from ..shapes_only import ShapesOnly
from ..weights import bump_weights_version
from . import compile_cost
from .arguments import ProgramArguments
from .eligibility import (
    HookState,
    Ineligible,
    changing_reasons,
    counted_probe,
    saved_tensor_hooks_active,
)
from .fused_updates import FusedUpdate
from .generator_states import RngState
from .host_call import run_program
from .inductor import ProgramRetraced
from .optimizer_support import signature, updated_parameters
from .processes import num_processes, program_reason
from .program_build import build_program, probed_facts
from .program_options import forward_contexts
from .regions import CompiledRegions, distinct_share, find_regions, regions_pay
from .repeat_call import RepeatCall
from .run_contexts import compiled_modes, torch_warnings_ignored
from .selection import Selection, compiling_pays


class CompiledBackend(Backend):
    """One executor's compiled backend (see the module docstring)."""

    name = "compiled"

    def __init__(self, options):
        super().__init__()
        self.selection = Selection.from_options(options)
        self._program = None
        self._arguments = None  # ProgramArguments of _program
        self._key = None
        self._hooks_seen = None  # RemovableHandle.next_id when hooks were last looked for
        self._hook_state = None  # the forward hooks the program or regions traced (eligibility.HookState)
        self._told_saved_tensor_hooks = False
        self.last = None  # "compiled" or "eager": which backend ran the last host call
        self.progress = None  # the executor's unfinished bar, when the next run compiles
        self._new_program_reason = None  # a program that ran gave way to a new one (_program_for)
        self._rebuilt = 0  # programs built again because a new trace changed what they hold (_after_retrace)
        self._retrace_probe = None  # the probe of a re-traced call whose program is built again
        self._retraced = None  # the program whose last attempt torch.compile was about to trace again
        self.compile_seconds = 0.0  # time spent compiling programs (torch.compile, first runs)
        self.repeat = None  # RepeatCall of _program: the executor's fast path for the next call
        self._ops = None  # aten ops the last probe counted (compile_cost.py)
        self._ops_digest = None  # their hash, with the executable cache on (saved_programs.py)
        self.probed_on = None  # "values" or "shapes" (fake tensors): how the last probe ran
        self._flops = None  # their floating-point operations (the unit's rule)
        self._convolution_flops = None  # the convolutions' share of them (selection.compiling_pays)
        self._eager_call_seconds = None  # a host call's cost estimated from the probe (the ski rental)
        self.regions = None  # CompiledRegions, once the unit "regions" has compiled

    def record_eager(self, regions: bool = False) -> None:
        """A host call the eager backend ran: on its own, or with the compiled ``regions``."""
        if regions:
            self.last = "compiled"
            return
        # counted, not timed: the same call counts the same on a busy machine (compile_cost.py)
        estimate = self._eager_call_seconds
        self.selection.record_eager(compile_cost.UNPROBED_CALL_SECONDS if estimate is None else estimate)
        self.last = "eager"

    def take_progress(self, bar) -> None:
        """The executor's compile bar, finished by the host call that compiles the program (or by
        ``finish_progress`` when that call runs eagerly)."""
        self.progress = bar

    def eager_context(self, call):
        """The compiled regions installed (``regions.py``) for a host call the eager backend runs."""
        return self.regions.installed(call.optimizer)

    def reset(self) -> None:
        """The executor was destroyed: its programs go too."""
        self._program = self._arguments = self.repeat = self._retraced = None
        self._key = None
        self.regions = None

    def run(self, call, inputs, compiled):
        if self.selection.needs_estimate:
            self._estimate(call, inputs, compiled)
        if not self.selection.wants_compiled():
            self.finish_progress()
            return DECLINED
        if saved_tensor_hooks_active():  # this call only, as a trace window's calls
            if not self._told_saved_tensor_hooks:
                logger.warning(messages.EAGER_SAVED_TENSOR_HOOKS)
                self._told_saved_tensor_hooks = True
            self.finish_progress()
            return DECLINED
        if self._unit(call, inputs, compiled) == "regions":
            return self._compile_regions(call, inputs, compiled)
        return self._run(call, inputs, compiled, dry_run=False)

    def compile_ahead(self, call, inputs, compiled) -> None:
        """``compile()``: build and compile the program now, changing nothing (module docstring)."""
        if self.selection.wants_compiled():
            if self._unit(call, inputs, compiled) == "regions":
                self._compile_regions(call, inputs, compiled)
                return
            rng = RngState()
            try:
                self._run(call, inputs, compiled, dry_run=True)
            finally:
                rng.restore()

    def _run(self, call, inputs, compiled, dry_run):
        changed = [module for module, mode in compiled.training_flags if module.training != mode]
        with compiled_modes(changed) if changed else contextlib.nullcontext():
            try:
                program = self._program_for(call, inputs, compiled)
            except Ineligible as exc:
                self.finish_progress()
                return self._decline(str(exc))
            except Exception as exc:  # the probe failed: eager runs the call (and raises the model's own error)
                self.reset()
                self.finish_progress()
                return self._decline(messages.INELIGIBLE_PROBE.format(error=_first_line(exc)), exc)
            only = program.compiler.compiling_only() if dry_run else contextlib.nullcontext()
            if program.ran:  # (compiled and has run once)
                if self._retraced is program:  # (the repeat path's attempt was traced again: not twice)
                    result = RETRACED
                else:
                    with only:
                        result = self.run_tensors(call, self._arguments.tensors(inputs), compiled, program, dry_run)
                if result is RETRACED:  # (nothing ran)
                    self._retraced = None
                    return self._after_retrace(call, inputs, compiled, program, dry_run)
                if not dry_run and result is not DECLINED:
                    self._expect_repeats(call, inputs, compiled, program)
                return result
            compiling = not program.compiled  # (else compile() compiled it without running it)
            progress, handed = self.progress, self.progress is not None
            if progress is None and compiling and not dry_run and call.settings.show_compilation_progress_bar:
                progress = CompilationProgress(reason=self._compile_reason())
            self.progress = None
            started = time.perf_counter()
            try:  # torch.compile compiles now: with the executable cache, if enabled
                with compile_cache_for(call.compile_cache), torch_warnings_ignored(), only:
                    result = self._execute(call, self._arguments.tensors(inputs), compiled, program, dry_run)
            except Exception as exc:  # torch.compile's errors have many types
                self.reset()
                if handed and not self.selection.forced:  # the executor's compile itself succeeded
                    progress.finish()
                return self._decline(messages.INELIGIBLE_FULLGRAPH.format(error=_first_line(exc)), exc)
            finally:
                if compiling:
                    self.compile_seconds += time.perf_counter() - started
        program.compiled = True
        program.ran = program.ran or not dry_run
        program.compiler.locked = program.ran  # a later trace is another program (ProgramCompiler)
        if compiling:
            self._compiled(call)
        if progress is not None:
            progress.finish()
        if not dry_run:
            self._expect_repeats(call, inputs, compiled, program)
        return result

    # ------------------------------------------------------------------ the unit
    def _unit(self, call, inputs, compiled) -> str:
        """``"program"`` or ``"regions"`` (``selection.py``), chosen once: ``auto`` from the
        probe's FLOPs per aten op, counted, not timed (a model the probe rejects, or one without
        regions to compile, gets the program, which declines the first)."""
        unit = self.selection.unit
        if unit != "auto":
            return unit
        # (the executable cache remembers the choice: no probe then; not with several processes,
        # which must choose alike whatever each one's cache holds: processes.py)
        cache = call.compile_cache if num_processes(call) <= 1 else None
        unit = compile_cost.remembered_unit(call, inputs, cache) if cache is not None else None
        if unit == "regions" and call.schedule.concurrent:  # (not in the marker's key)
            unit = None
        if unit is not None:
            logger.info(messages.UNIT_REMEMBERED, unit, cache.path)
        else:
            if self._flops is None:
                try:
                    self._probe(call, inputs, compiled)
                except Exception:  # Ineligible, or the model's own error: the program path says which
                    self.selection.unit = "program"
                    return "program"
            per_op = self._flops / max(self._ops, 1)
            has_regions = not call.schedule.concurrent and not call.precision.saturates(call.model) \
                and find_regions(call.model)
            unit = "regions" if regions_pay(per_op, _device_type(call)) and has_regions else "program"
            reason = program_reason(call) if unit == "program" and has_regions else None
            if reason is not None:  # the regions run it compiled, not eager
                unit = "regions"
                logger.info(messages.UNIT_NOT_PROGRAM, reason)
            else:
                logger.info(messages.UNIT_CHOSEN, unit, per_op)
            if cache is not None:
                compile_cost.remember_unit(call, inputs, cache, unit)
        self.selection.unit = unit
        return unit

    def _compile_regions(self, call, inputs, compiled):
        """The unit ``regions``: compiled at the first call (``regions.py``); returns ``REGIONS``, the
        executor then runs the host call eagerly with the compiled regions installed."""
        if self.regions is not None:
            if self._hook_state.still(call.model):
                return REGIONS
            # Compiling the regions again would not help: torch.compile does not guard module hooks
            # (a region's graph is reused for its repeats, whatever hooks they have now).
            self.regions = None
            self.finish_progress()
            return self._decline(messages.INELIGIBLE_REGION_HOOKS)
        if call.schedule.concurrent:
            self.finish_progress()
            return self._decline(messages.REGIONS_CONCURRENT)
        if call.precision.saturates(call.model):
            self.finish_progress()
            return self._decline(messages.REGIONS_SATURATION)
        progress, self.progress = self.progress, None
        if progress is None and call.settings.show_compilation_progress_bar:
            progress = CompilationProgress(reason=self._compile_reason())
        started = time.perf_counter()
        regions = CompiledRegions(call.session.replicas.models, call.training)
        self._hook_state = HookState(call.model)
        try:
            with compile_cache_for(call.compile_cache), torch_warnings_ignored():
                regions.compile(call, inputs, compiled)
        except Exception as exc:  # torch.compile's errors have many types
            return self._decline(messages.INELIGIBLE_REGIONS.format(error=_first_line(exc)), exc)
        finally:
            self.compile_seconds += time.perf_counter() - started
            if progress is not None:
                progress.finish()
        if not regions.regions:
            return self._decline(messages.REGIONS_NONE)
        self.regions = regions
        self._compiled(call)
        return REGIONS

    def _expect_repeats(self, call, inputs, compiled, program):
        """After a compiled call on the general path: the next call like it takes the fast path
        (``repeat_call.py``), with what this call found (program, optimizer, hooks seen)."""
        possible = RepeatCall.possible(call, inputs, compiled)
        self.repeat = RepeatCall(self, call, inputs, compiled, program) if possible else None

    def _estimate(self, call, inputs, compiled):
        """``auto``: what compiling this model will cost, from a counted probe (``compile_cost.py``).
        A model that fails the checks, or whose probe raises (the eager call then shows the error
        as it always did), gets no estimate; compiling it declines it later, as before."""
        changed = [module for module, mode in compiled.training_flags if module.training != mode]
        with compiled_modes(changed) if changed else contextlib.nullcontext():
            try:
                self._probe(call, inputs, compiled)
            except Exception:  # Ineligible, or the model's own error
                self.selection.set_cost(None)
                return
        if self.selection.compile_after is None and self.selection.unit == "auto" \
                and not compiling_pays(self._flops, self._convolution_flops, self._ops, _device_type(call)):
            self.selection.keep_eager(messages.AUTO_CONVOLUTION_BOUND.format(
                share=self._convolution_flops / self._flops, per_op=self._flops / max(self._ops, 1)))
            return
        loops = not forward_contexts(call)[1]
        regions = None
        if self._unit(call, inputs, compiled) == "regions":
            share, graphs = distinct_share(call.model, find_regions(call.model))
            fused = call.training and FusedUpdate.supports(call.optimizer)  # (its kernel: one more)
            regions = (share, graphs + fused)
        self.selection.set_cost(compile_cost.estimate(call, self._ops, call.compile_cache, loops, regions))

    def _probe(self, call, inputs, compiled, shapes=None):
        """``eligibility.counted_probe``, its ops hashed with the executable cache on; ``shapes``:
        on fake tensors (``shapes_only.py``)."""
        probed, counter, self._ops_digest = counted_probe(call, inputs, compiled, shapes,
                                                          hashed=call.compile_cache is not None)
        self._ops, self._flops, self._convolution_flops = counter.ops, counter.flops, counter.convolution_flops
        self._eager_call_seconds = compile_cost.eager_call_seconds(
            counter.ops, counter.flops, call.geometry.batches_per_call, _device_type(call))
        self.probed_on = "values" if shapes is None else "shapes"
        return probed

    def _probe_shapes(self, call, inputs, compiled):
        """The probe on fake tensors, or None when the model cannot run on them (``shapes_only.py``)."""
        try:
            return self._probe(call, inputs, compiled, ShapesOnly())
        except Exception as exc:  # a value read, an op without a meta kernel, Ineligible: run it for real
            logger.debug(messages.SHAPES_ONLY_FAILED, _first_line(exc))
            return None

    def _compiled(self, call):
        """A program has compiled: compiling it again (another call, process) is cheap."""
        if self._ops is not None:
            regions = None if self.regions is None else (self.regions.share, self.regions.graphs)
            compile_cost.compiled(compile_cost.estimate(call, self._ops, regions=regions), call.compile_cache)

    def _compile_reason(self):
        """Why this compile happens mid-run, for the bar's first line; None for a first compile."""
        reason = self.selection.take_announcement() or self._new_program_reason
        self._new_program_reason = None
        return reason

    def finish_progress(self):
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
    def _program_for(self, call, inputs, compiled):
        optimizer = call.optimizer
        key = (id(compiled), signature(optimizer) if call.training else None)
        if self._key == key and (inputs.spec != self._program.layout.inputs.spec or (
                call.training and self._program.optim.optimizer is not optimizer
                and not _same_parameters(self._program.optim, optimizer))):
            # Dict inputs in another key order (the program places tensors and constants by the
            # first call's), or an optimizer of the same signature over its parameters in another
            # order (the program pairs weights, state and rounding by position): another program.
            self._key, self.repeat = None, None
        if self._key == key and not self._hook_state.still(call.model):  # traced other forward hooks
            self._key, self.repeat = None, None
            self._new_program_reason = messages.NEW_PROGRAM_HOOKS
        if self._key == key:
            self._check_changes(call)
            if call.training and self._program.optim.optimizer is not optimizer:
                self._program.optim.bind(optimizer)
            return self._program
        reason = program_reason(call)  # (several processes on CUDA: processes.py)
        if reason is not None:
            raise Ineligible(reason)
        if self._program is not None and self._program.ran and self._key is not None:  # compiles mid-run
            self._new_program_reason = messages.NEW_PROGRAM_OPTIMIZER if self._key[0] == key[0] \
                else messages.NEW_PROGRAM_MODEL
        self._hooks_seen = RemovableHandle.next_id
        self._hook_state = HookState(call.model)
        program = None
        contexts, stepwise = forward_contexts(call)
        # Saved whole with the executable cache (saved_programs.py); not stepwise programs, whose
        # dry run (compile()) needs their steps' placeholder outputs, nor programs whose all-reduce
        # joins this run's process group (processes.py).
        cache = call.compile_cache if not (stepwise and call.geometry.device_iterations > 1) \
            and num_processes(call) <= 1 else None
        shapes_digest = None  # the saved program's key hashes the ops of the probe on fake tensors
        if cache is not None:
            shaped = self._probe_shapes(call, inputs, compiled)
            if shaped is not None:
                shapes_digest = self._ops_digest
                program = build_program(call, inputs, compiled, shaped, contexts, stepwise, cache,
                                        self._ops, self._ops_digest)
                if not program.saved.on_disk():  # compiled here: what it holds comes from a real run
                    program = None
        if program is None:
            probed, self._retrace_probe = self._retrace_probe, None
            if probed is None:
                probed = self._probe(call, inputs, compiled)
            self._ops_digest = shapes_digest or self._ops_digest
            program = build_program(call, inputs, compiled, probed, contexts, stepwise, cache,
                                    self._ops, self._ops_digest)
        self._program, self._key = program, key
        self._arguments = ProgramArguments(call.model, program.trained_names, program.frozen_names)
        return program

    def _check_changes(self, call):
        """What the user may have changed since the program was built (cheap: hooks are looked
        for only when a hook handle was created since)."""
        if RemovableHandle.next_id != self._hooks_seen:
            for reason in changing_reasons(call):
                raise Ineligible(reason)
            self._hooks_seen = RemovableHandle.next_id

    # ------------------------------------------------------------------ running
    def run_tensors(self, call, tensors, compiled, program, dry_run=False):
        """Run a compiled program that has run before on ``tensors`` (``ProgramArguments.tensors``):
        the host call's result, ``RETRACED`` or ``DECLINED`` (``program_failed``)."""
        try:
            return self._execute(call, tensors, compiled, program, dry_run)
        except Exception as exc:
            return self.program_failed(exc)

    def program_failed(self, exc):
        """What a program that has run before raising ``exc`` means, before it ran anything: a
        program is traced again when a Python value the model reads changes (torch.compile's
        guards). ``RETRACED`` when torch.compile was about to trace it again
        (``ProgramCompiler.locked``: ``_after_retrace`` decides); ``DECLINED`` past torch's
        recompile limit: from now on eager. Any other ``exc`` is raised."""
        if _caused_by(exc, ProgramRetraced):
            self._retraced = self._program  # (the repeat path hands the call over: no second attempt)
            return RETRACED
        if type(exc).__name__ != "FailOnRecompileLimitHit":  # torch._dynamo.exc
            raise exc
        self.reset()
        return self._decline(messages.INELIGIBLE_RECOMPILES.format(error=_first_line(exc)), exc)

    def _after_retrace(self, call, inputs, compiled, program, dry_run):
        """torch.compile was about to trace ``program`` again (``ProgramCompiler.locked``). A probe of
        the call says whether the new trace is what the program was built for (``probed_facts``,
        the parameters it gives no gradient included): then the program takes the new trace, as
        torch.compile's own re-traces do; else it is built again from that probe, or declined past
        torch's recompile limit."""
        try:
            probed = self._probe(call, inputs, compiled)
        except Exception:  # Ineligible, or the model's own error: the general path says which
            probed = None
        if probed is not None and probed_facts(probed) == program.built_for:
            program.compiler.locked = False
            try:
                return self._run(call, inputs, compiled, dry_run)
            finally:
                program.compiler.locked = program.ran
        self.reset()
        self._rebuilt += 1
        if self._rebuilt >= dynamo_config.recompile_limit:  # (torch's limit on re-traces, for rebuilds)
            return self._decline(messages.INELIGIBLE_RECOMPILES.format(error="programs built again"))
        self._new_program_reason = messages.NEW_PROGRAM_RETRACED
        self._retrace_probe = probed  # what _program_for builds the new program from, this call only
        try:
            return self._run(call, inputs, compiled, dry_run)
        finally:
            self._retrace_probe = None

    def _execute(self, call, tensors, compiled, program, dry_run=False):
        started = time.time()
        grad_enabled = torch.is_grad_enabled()
        set_grad_enabled(False)  # torch.no_grad(), without its object per call
        try:
            with context.running(call.training):
                if compiled.weights.shares_host_tensors:
                    outs = self._run_on_parameters(call, compiled, program, tensors, dry_run)
                else:
                    with compiled.weights.active():
                        outs = self._run_on_parameters(call, compiled, program, tensors, dry_run)
        finally:
            set_grad_enabled(grad_enabled)
        if dry_run:
            return None
        if call.training:
            bump_weights_version(call.user_model)
        result = program.finish(outs)
        if program.host_call_result is not None:
            result = program.host_call_result(result)
        done = time.time()
        self.last_run = UniformCounters(started, done, call.geometry.device_iterations)
        self.last_run_seconds = done - started
        self.last = "compiled"
        return result

    def _run_on_parameters(self, call, compiled, program, tensors, dry_run):
        """``host_call.run_program`` on the parameters the model holds now."""
        trained, frozen = self._arguments.parameters()
        for p in (*trained, *frozen):
            if p.is_cuda:
                with call.precision.running(call.model):  # CUDA matmul partials, as eager
                    return run_program(call, compiled, program, tensors, trained, frozen, dry_run)
        return run_program(call, compiled, program, tensors, trained, frozen, dry_run)


def _caused_by(exc, kind) -> bool:
    """Whether ``exc`` or an exception it was raised from (torch.compile wraps a backend's) is a ``kind``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or getattr(exc, "inner_exception", None) or exc.__context__
    return False


def _same_parameters(functional, optimizer) -> bool:
    """Whether ``optimizer`` updates exactly the parameters ``functional`` (a ``FunctionalOptimizer``)
    updates, in that order."""
    held = [p for group in updated_parameters(optimizer, functional.unused) for p in group]
    return len(held) == len(functional.params) and all(p is q for p, q in zip(held, functional.params))


def _first_line(exc) -> str:
    """The exception's type and its first meaningful lines (torch.compile's messages are long)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2])
    return f"{type(exc).__name__}: {text[:300]}"


def _device_type(call) -> str:
    """The device type the executor's model computes on (its first parameter's; else the CPU)."""
    parameter = next(call.model.parameters(), None)
    return parameter.device.type if parameter is not None else "cpu"
