"""One run of a compiled program for a host call: its inputs gathered (optimizer state,
hyperparameters, loss scale, the updated buffers' replica sets, stochastic rounding's numbers),
the program run, and its results committed - parameters, buffers, optimizer state, loss scaler,
anchors - or, for ``compile()``'s dry run, nothing committed."""
import torch

from ...torch_compat import foreach_copy_
from . import step_hooks
from .cuda_graphs import mark_step_begin
from .generator_states import generators_kept_on_error

_ONE = torch.tensor(1.0)


def run_program(call, compiled, program, tensors, trained, frozen, dry_run):
    """Run ``program`` and (unless ``dry_run``) commit its results to the parameters, buffers,
    optimizer, loss scaler and anchors; returns its output leaves."""
    functional = program.optim
    hooks = step_hooks.of(call.optimizer) if program.per_step_hyper else None
    if functional is not None:
        state = functional.state_in(placeholders=dry_run)
        scaling = program.scaling.inputs(functional.loss_scale(), call.precision.dynamic)
        hyper = functional.hyper() if hooks is None else functional.hyper_steps(
            hooks.begin_compiled_call(call.geometry.device_iterations, functional.hyper_values))
    else:
        state, hyper, scaling = [], [], {"scale": _ONE}
    buffers = _buffer_sets(call.model, program, compiled.replica_buffers)
    graphed = mark_step_begin(trained)
    args = (tensors, trained, [p.detach() for p in frozen],
            [b for values in buffers for b in values], state, hyper, scaling)
    try:
        if program.rounded:  # drawn as eager draws them; put back if the program raises, and after a dry run
            with call.precision.generators_kept(always=dry_run):
                rounded = [trained[k] for k in program.rounded]
                new_params, new_state, new_buffers, outs, scaling, anchored = _run(
                    program, args + (call.precision.rounding_draws(rounded),), trained, frozen)
        else:
            new_params, new_state, new_buffers, outs, scaling, anchored = _run(program, args, trained, frozen)
    except BaseException:
        if hooks is not None:
            hooks.abort_compiled_call()
        raise
    if dry_run:  # compile(): nothing is committed, per-step state is put back
        if hooks is not None:
            hooks.abort_compiled_call()
        return None
    if program.aliased is None:  # where Inductor returns input memory is fixed at compile
        program.aliased = _aliased(outs, [*tensors, *trained, *frozen])
    if program.aliased:
        outs = [out.clone() if i in program.aliased else out for i, out in enumerate(outs)]
    if graphed:  # the graph's outputs are overwritten by its next replay
        new_state = [{k: v.clone() for k, v in st.items()} for st in new_state]
    if buffers:
        foreach_copy_([b for values in buffers for b in values], list(new_buffers))
    if functional is not None:
        foreach_copy_(trained, list(new_params))
        functional.commit(list(new_state))
        if program.scaling.automatic:
            program.scaling.commit(call.precision.loss_scaler(call.optimizer), scaling)
        for p in (*trained, *frozen):  # (as eager's steps: a frozen parameter's leftover .grad too)
            p.grad = None
    if compiled.anchors:
        program.record_anchors(compiled.anchors, anchored)
    return outs


def _run(program, args, trained, frozen):
    """``program.run(*args)``; one that draws random numbers leaves torch's generators of the
    weights' devices as they were if it raises."""
    if program.draws_random:
        with generators_kept_on_error([*trained, *frozen]):
            return program.run(*args)
    return program.run(*args)


def _buffer_sets(model, program, replica_buffers):
    """The tensors holding the updated buffers' values, per replica set: set 0 is the live
    buffers (``ReplicaBuffers`` keeps replica 0's there between calls), set r its stored copies."""
    if not program.buffer_names:
        return []
    replica_buffers.switch_to(0)
    named = dict(model.named_buffers())
    live = [named[n] for n in program.buffer_names]
    if program.buffer_sets == 1:
        return [live]
    position = {id(b): i for i, b in enumerate(replica_buffers.buffers)}
    return [live] + [[replica_buffers.values[r][position[id(b)]] for b in live]
                     for r in range(1, program.buffer_sets)]


def _aliased(outs, inputs):
    """The indices of the outputs sharing memory with a program input: Inductor may hand back an
    input's own memory for an output that only copies it (it drops the copy), and a returned
    tensor must not alias the caller's inputs or the model's weights (such outputs are copied)."""
    shared = {t.untyped_storage().data_ptr() for t in inputs}
    return {i for i, out in enumerate(outs) if out.untyped_storage().data_ptr() in shared}
