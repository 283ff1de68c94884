"""``build_program``: a ``Program`` (``program.py``) for an executor's host calls, from what the
probe found: the functional optimizer, the layout of inputs and outputs, torch.compile's options,
and, with the executable cache, the file the compiled program is saved as.
"""
import os

import torch

from ..half_compute import LOW_PRECISION
from .cache_hit import program_guards
from .eligibility import anchored_in_program
from .functional_optim import FunctionalOptimizer
from .inductor import ProgramCompiler
from .loss_scaling import ScalingState
from .processes import ProgramAllReduce
from .program_options import compile_kwargs
from .saved_programs import DIRECTORY, SUFFIX, SavedProgram, program_key


def build_program(call, inputs, compiled, probed, contexts, stepwise, cache, ops, ops_digest):
    """The program of ``probed`` (``eligibility.Probed``) for the host calls ``call`` (a
    ``CallView``) makes with ``inputs``, keyed for the executable ``cache``; ``ops`` and
    ``ops_digest``: the probe's aten op count and hash."""
    from .program import Layout, Program  # torch's while_loop and Inductor: only when compiling
    optimizer = call.optimizer
    model = call.model
    names = [n for n, _ in model.named_parameters()]
    if call.training:
        by_id = {id(p): n for n, p in model.named_parameters()}
        unused_names = set(probed.unused)
        functional = FunctionalOptimizer(optimizer, {i for i, n in by_id.items() if n in unused_names})
        trained = [by_id[id(p)] for p in functional.params]
    else:
        functional, trained = None, names
    frozen = [n for n in names if n not in set(trained)]
    # Precision.enableStochasticRounding: the half weights the update rounds with drawn numbers.
    rounded = [k for k, p in enumerate(functional.params) if p.dtype in LOW_PRECISION] \
        if call.training and call.precision.stochastic_rounding else []
    micro_batch_leaves = getattr(model, "compiled_micro_batch_leaves", None)
    layout = Layout(call, inputs, probed.spec, probed.leaves, micro_batch_leaves() if micro_batch_leaves else 0)
    device = next(iter(model.parameters()), torch.empty(0)).device
    kwargs = compile_kwargs(device, call.geometry, probed.draws_random, half_casts=bool(contexts or rounded),
                            loops=not stepwise, ops=ops, training=call.training,
                            saturate_half=call.precision.saturates(model))
    scaling = ScalingState(call.precision.dynamic if call.training else None,
                           call.geometry.device_iterations)
    sets = call.geometry.replication_factor if compiled.replica_buffers.per_replica else 1
    compiler = ProgramCompiler(kwargs.get("options"))

    def traced(fn):
        return torch.compile(fn, backend=compiler, fullgraph=True, dynamic=False,
                             options={"guard_filter_fn": program_guards})

    saved = []  # the SavedProgram compile_fn makes (Program wraps it in a CacheHitCall)

    def compile_fn(fn):
        saved.append(SavedProgram(fn, kwargs.get("options", {}), compiler, traced))
        return saved[-1]

    program = Program(model, layout, functional, compiled.loss_index, trained, frozen,
                      traced if cache is None else compile_fn,
                      contexts, stepwise, scaling,
                      anchored_in_program(compiled.anchors, model, trained, call.training,
                                          probed.updated_buffers),
                      buffer_names=probed.updated_buffers, buffer_sets=sets, draws_random=probed.draws_random,
                      all_reduce=ProgramAllReduce.of(call), assigned=probed.assigned,
                      rounded=rounded)
    program.compiler = compiler
    program.built_for = probed_facts(probed)
    if cache is not None:
        saved_as = program_key(call, program, ops_digest, kwargs.get("options", {}))
        program.saved = saved[0]
        program.saved.path = os.path.join(cache.path, DIRECTORY, saved_as + SUFFIX)
    program.host_call_result = getattr(model, "compiled_host_call_result", None)
    return program


def probed_facts(probed):
    """What a program is built for of what its probe found (``eligibility.Probed``): its outputs'
    structure, the buffers the forward writes and slots it assigns, whether it draws random
    numbers, the parameters it gives no gradient (the program's constants). A new trace with the
    same facts may replace the old one in the same program (``backend.py``)."""
    return (probed.spec, list(probed.leaves), list(probed.updated_buffers), probed.draws_random,
            list(probed.assigned), list(probed.unused))
