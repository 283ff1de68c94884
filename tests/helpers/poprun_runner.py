"""Running poprun from the tests: the command, the environment, the one-process oracle."""
import os
import subprocess
import sys

import torch

from helpers import poprun_programs as programs

HELPERS = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HELPERS)
SRC = os.path.join(os.path.dirname(TESTS), "src")
PROGRAMS = os.path.join(HELPERS, "poprun_programs.py")


def environment(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, TESTS, env.get("PYTHONPATH", "")) if p)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "PET_NNODES",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        env.pop(name, None)
    env.update(extra)
    return env


def poprun_command(*arguments):
    return [sys.executable, "-m", "openpop.distributed.poprun", *arguments]


def run_poprun(*arguments, timeout=240, **env):
    return subprocess.run(poprun_command(*arguments), env=environment(**env), capture_output=True, text=True,
                          timeout=timeout)


def oracle(name, total_replicas):
    """Weights and per-call losses of one process running all replicas (replicationFactor)."""
    import poptorch
    options = poptorch.Options().replicationFactor(total_replicas)
    model, training, optimizer = programs.build(name, options, init_seed=1234)
    losses = []
    for call in range(programs.STEPS):
        x, y = programs.global_batch(name, call, total_replicas)
        _, loss = training(x.reshape(-1, *x.shape[4:]), y.reshape(-1))
        losses.append(loss.detach().clone())
    training.destroy()
    return model.state_dict(), losses, getattr(optimizer, "loss_scaling", None)


def assert_matches_oracle(results, name, total_replicas, local_replicas):
    weights, losses, loss_scaling = oracle(name, total_replicas)
    for rank, result in enumerate(results):
        ours = result[name]
        for key, value in weights.items():
            torch.testing.assert_close(ours["weights"][key], value, atol=1e-6, rtol=0,
                                       msg=lambda m, rank=rank, key=key: f"{name}, instance {rank}, {key}: {m}")
        assert ours["loss_scaling"] == loss_scaling
        first = rank * local_replicas
        for mine, all_replicas in zip(ours["losses"], losses):
            # Each instance returns its own replicas' losses, as on PopTorch.
            expected = all_replicas.reshape(-1, total_replicas)[:, first:first + local_replicas].reshape(mine.shape)
            torch.testing.assert_close(mine, expected, atol=1e-6, rtol=0)


def load_results(directory, instances):
    return [torch.load(os.path.join(directory, f"rank{r}.pt"), weights_only=False) for r in range(instances)]
