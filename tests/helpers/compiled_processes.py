"""The program ``tests/test_poprun_compiled.py`` launches under poprun: one small model trained by
each backend - eager, compiled regions, compiled program - in every instance, from the same
weights and data; writes each run's losses, weights and which backend ran to OUTDIR/rank<i>.pt.

The regions run is the compiled backend with ``unit="auto"`` where the program unit is refused, as
it is on CUDA (``processes.program_reason``, made to answer as there): ``auto`` must take the
regions, not eager; ``unit="program"`` must then be an error, raised before the weights change.

    python helpers/compiled_processes.py OUTDIR
"""
import os
import sys

import torch

CALLS = 3  # host calls per run
DI, GA, MICRO = 2, 2, 2
RUNS = ("eager", "program", "regions")  # (regions last: its run refuses the program from then on)


class Net(torch.nn.Module):
    """One compiled region (``body``): one graph to compile, forward and backward."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def forward(self, x, y):
        out = self.body(x)
        return out, loss_of(out, y)


def loss_of(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def global_batch(call, total_replicas):
    """Host call ``call``'s inputs for every replica: ``[DI, GA, R, micro, ...]``."""
    generator = torch.Generator().manual_seed(1000 + call)
    x = torch.randn(DI, GA, total_replicas, MICRO, 8, generator=generator)
    y = torch.randint(0, 4, (DI, GA, total_replicas, MICRO), generator=generator)
    return x, y


def local_part(tensor, first_replica, local_replicas):
    return tensor[:, :, first_replica:first_replica + local_replicas].reshape(-1, *tensor.shape[4:])


def optimizer_of(model):
    import poptorch
    return poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def refuse_the_program():
    """The program unit answers as on CUDA with several processes (``processes.program_reason``)."""
    from openpop.runtime import messages
    from openpop.runtime.compiled import backend
    backend.program_reason = lambda call: messages.PROGRAM_PROCESSES_CUDA


def options_of(run):
    import popdist.poptorch
    import poptorch
    options = popdist.poptorch.Options()
    options.deviceIterations(DI)
    options.Training.gradientAccumulation(GA)
    options.outputMode(poptorch.OutputMode.All)
    options.showCompilationProgressBar(False)
    if run == "eager":
        return options.openpopBackend("eager")
    return options.openpopBackend("compiled", unit="auto" if run == "regions" else run)


def refused_program(x, y):
    """``unit="program"`` where the program is refused: the error, and whether the weights stayed."""
    import poptorch
    torch.manual_seed(1234)  # (the same everywhere: instance 0's weights, which the first call broadcasts)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    training = poptorch.trainingModel(model, options_of("program"), optimizer_of(model))
    try:
        training(x, y)
    except poptorch.Error as error:
        message = str(error)
    else:
        message = None
    unchanged = all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    training.destroy()
    return message, unchanged


def train(outdir):
    import popdist
    import poptorch
    popdist.init()
    torch.set_num_threads(1)
    rank = popdist.getInstanceIndex()
    total, local, offset = popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset()
    results = {}
    for run in RUNS:
        if run == "regions":
            refuse_the_program()
        torch.manual_seed(1234 + rank)  # instances start apart: the first call gives them instance 0's weights
        model = Net()
        training = poptorch.trainingModel(model, options_of(run), optimizer_of(model))
        losses = []
        for call in range(CALLS):
            x, y = global_batch(call, total)
            _, loss = training(local_part(x, offset, local), local_part(y, offset, local))
            losses.append(loss.detach().clone())
        compiled = training._dispatch.compiled
        results[run] = {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                        "losses": losses, "ran": compiled.last, "unit": compiled.selection.unit,
                        "regions": compiled.regions is not None,
                        "program_runs": compiled._program.compiler.runs if compiled._program is not None else 0}
        training.destroy()
    x, y = global_batch(0, total)
    results["refused"] = refused_program(local_part(x, offset, local), local_part(y, offset, local))
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))


if __name__ == "__main__":
    train(sys.argv[1])
