"""The host call that repeats the previous compiled call's structure, run with little Python.

A compiled host call of a small model costs tens of microseconds, of which torch's own call
machinery (Dynamo's guards, AOTAutograd's and Inductor's wrappers) is most; what the executor
adds around it - binding the arguments, checking them against the compiled signature, looking
up the program, building its inputs - shows (``benchmarks/host_overhead.py``). After a compiled
training call of positional tensors ran, the backend keeps a ``RepeatCall``: the next call
checks, in one pass, that it is the same kind of call - as many tensors with the same dtypes and
shapes, none needing a conversion (requires grad, not contiguous) nor sharing memory with another,
the same optimizer with the same static choices, no parameter frozen or unfrozen and no hook added, the same
train/eval modes, no trace session watching the call, no saved-tensor hooks - and then runs the
program as the general path would (``CompiledBackend.run_tensors``), or, for a *plain* program
(only weights and optimizer state to commit: no updated buffers, anchors, random numbers,
automatic loss scaling, per-step hyperparameters, stochastic rounding, stepwise loop or CUDA
tensors), as ``_run_plain``: the same steps in one function. Whenever one check fails it returns
``DECLINED`` having changed nothing, and the executor takes its general path, which checks
everything again, explains what is wrong or rebuilds the program.
"""
import time

import torch
from torch.utils.hooks import RemovableHandle

from ...torch_compat import foreach_copy_, set_grad_enabled
from .. import trace
from ..args import plain_parameter_names
from ..backend_contract import DECLINED, RETRACED
from ..devices import HostPlacement
from ..perf import UniformCounters
from ..weights import version_cell
from .arguments import share_memory
from .eligibility import saved_tensor_hooks_active
from .optimizer_snapshot import OptimizerSnapshot
from .optimizer_support import signature


class RepeatCall:
    """See the module docstring. Built by ``CompiledBackend`` from a call that just ran compiled."""

    def __init__(self, backend, call, inputs, compiled, program):
        self.backend = backend
        self.program = program
        self.compiled = compiled
        self.session = call.session
        self.optimizer = call.optimizer
        self.signature = signature(call.optimizer)
        self.snapshot = OptimizerSnapshot(call.optimizer)
        self.hyper = None  # (hyperparameters, loss scale) as program inputs while the snapshot holds
        self.hooks_seen = backend._hooks_seen
        self.hook_state = backend._hook_state
        # requires_grad of every optimizer parameter: frozen ones are the program's constants
        self.requires_grad = [(p, p.requires_grad) for group in call.optimizer.param_groups for p in group["params"]]
        self.training_flags = compiled.training_flags
        self.specs = [(t.dtype, t.shape) for t in inputs.args]
        self.arguments = backend._arguments
        self.weights_version = version_cell(call.user_model)
        self.steps = call.geometry.device_iterations
        trained, frozen = self.arguments.parameters()
        # A program with nothing but weights and optimizer state to commit runs in ``_run_plain``.
        self.plain = not (program.stepwise or program.per_step_hyper or program.buffer_names or compiled.anchors
                          or program.draws_random or program.rounded or program.scaling.automatic
                          or program.host_call_result
                          or any(p.is_cuda for p in (*trained, *frozen)))

    @classmethod
    def possible(cls, call, inputs, compiled) -> bool:
        """Whether calls like ``inputs`` can repeat: a training call binding positional tensors
        without defaults, host-placed inputs and weights the model's own tensors."""
        names = plain_parameter_names(call.signature)
        return (call.training and inputs.simple and names is not None and len(names) == len(inputs.args)
                and type(call.session.placement) is HostPlacement and not call.session.replicas.own_weights
                and compiled.weights.shares_host_tensors)

    def run(self, call, args):
        """The call's result, or ``DECLINED`` (nothing changed) when it is not a repeat."""
        if len(args) != len(self.specs):
            return DECLINED
        for tensor, (dtype, shape) in zip(args, self.specs):
            if (type(tensor) is not torch.Tensor or tensor.dtype != dtype or tensor.shape != shape
                    or tensor.requires_grad or not tensor.is_contiguous()):
                return DECLINED
        if len(args) > 1 and share_memory(args):  # (the general path copies them: arguments.py)
            return DECLINED
        backend = self.backend
        optimizer = call.optimizer
        if (backend._program is not self.program or backend.progress is not None
                or call.executable is not self.compiled or not self.session.attached
                or optimizer is not self.optimizer or RemovableHandle.next_id != self.hooks_seen
                or not self.hook_state.still(call.model)
                or not backend.selection.wants_compiled() or saved_tensor_hooks_active()
                or trace.watches(call.identity)):
            return DECLINED
        for module, mode in self.training_flags:
            if module.training != mode:
                return DECLINED
        for p, flag in self.requires_grad:
            if p.requires_grad is not flag:  # (frozen or unfrozen since: another program)
                return DECLINED
        if not self.snapshot.unchanged():
            self.hyper = None
            if signature(optimizer) != self.signature:
                return DECLINED
        if self.plain:
            try:
                return self._run_plain(call, args)
            except Exception as exc:
                result = backend.program_failed(exc)
        else:
            result = backend.run_tensors(call, args, self.compiled, self.program)
        return DECLINED if result is RETRACED else result  # (retraced: the general path builds it again)

    def _run_plain(self, call, tensors):
        """``CompiledBackend._execute`` of a program without buffers, anchors, random numbers,
        automatic loss scaling, per-step hyperparameters or CUDA tensors (what it commits is the
        weights and the optimizer state), in fewer steps."""
        program = self.program
        functional = program.optim
        started = time.time()
        grad_enabled = torch.is_grad_enabled()
        set_grad_enabled(False)
        hyper = self.hyper
        if hyper is None:
            hyper = self.hyper = (functional.hyper(), {"scale": functional.loss_scale()})
        try:  # (no run context: the program enters it if Dynamo traces)
            trained, frozen = self.arguments.parameters()
            new_params, new_state, _, outs, _, _ = program.run(
                tensors, trained, [p.detach() for p in frozen], (), functional.state_in(), *hyper)
            if program.aliased:
                outs = [out.clone() if i in program.aliased else out for i, out in enumerate(outs)]
            foreach_copy_(trained, list(new_params))
            functional.commit(list(new_state))
            for p in trained:
                p.grad = None
        finally:
            set_grad_enabled(grad_enabled)
        self.weights_version[0] += 1  # (bump_weights_version)
        result = program.finish(outs)
        done = time.time()
        self.backend.last_run = UniformCounters(started, done, self.steps)
        self.backend.last_run_seconds = done - started
        self.backend.last = "compiled"
        return result
