"""The compiled backend under poprun (runtime/compiled/processes.py): 2 instances of 1 replica
train one small model on the eager backend, the compiled program and the compiled regions; every
instance gets the eager backend's losses and weights, and those of a hand-written loop over both
replicas' data in one process. Where the program unit is refused (as on CUDA), ``auto`` takes the
regions and ``unit="program"`` is an error that leaves the weights as they were."""
import pytest
import torch

from openpop.runtime import messages

from helpers import compiled_processes as program
from helpers.oracle import train_loop
from helpers.poprun_runner import HELPERS, load_results, run_poprun

INSTANCES = 2


def plain_pytorch():
    """Weights and losses ``[calls][DI, GA, R]`` of a hand-written loop over every replica's data,
    from instance 0's initial weights."""
    torch.manual_seed(1234)
    model = program.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for call in range(program.CALLS):
        x, y = program.global_batch(call, INSTANCES)
        step = train_loop(model, optimizer, [x.reshape(-1, 8), y.reshape(-1)],
                          lambda m, xb, yb: program.loss_of(m(xb, yb)[0], yb), program.DI, program.GA, INSTANCES)
        losses.append(step.reshape(program.DI, program.GA, INSTANCES))
    return model.state_dict(), losses


@pytest.mark.slow
def test_compiled_units_under_poprun_equal_eager_and_plain_pytorch(tmp_path):
    result = run_poprun("--num-instances", str(INSTANCES), "--num-replicas", str(INSTANCES),
                        "python", f"{HELPERS}/compiled_processes.py", str(tmp_path),
                        OMP_NUM_THREADS="1", OPENPOP_EXECUTABLE_CACHE="0")
    assert result.returncode == 0, result.stdout + result.stderr
    weights, losses = plain_pytorch()
    for rank, runs in enumerate(load_results(tmp_path, INSTANCES)):
        assert [runs[run]["ran"] for run in program.RUNS] == ["eager", "compiled", "compiled"]
        assert runs["regions"]["regions"] and runs["regions"]["unit"] == "regions"
        assert runs["program"]["unit"] == "program" and runs["program"]["program_runs"] == program.CALLS
        error, unchanged = runs["refused"]
        assert messages.PROGRAM_PROCESSES_CUDA in error and unchanged
        for run in program.RUNS:
            ours = runs[run]
            for key, value in weights.items():
                torch.testing.assert_close(ours["weights"][key], value, atol=1e-6, rtol=0,
                                           msg=lambda m, run=run, rank=rank, key=key: f"{run} {rank} {key}: {m}")
                torch.testing.assert_close(ours["weights"][key], runs["eager"]["weights"][key], atol=1e-6, rtol=0)
            for mine, theirs, expected in zip(ours["losses"], runs["eager"]["losses"], losses):
                torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
                torch.testing.assert_close(mine, expected[:, :, rank].reshape(mine.shape), atol=1e-6, rtol=0)
