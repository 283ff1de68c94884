"""Peak activation memory per virtual IPU in the profile report (issue 16), measured with
saved-tensor hooks, against a direct measurement: the bytes the allocator still holds after
each stage's forward in a plain PyTorch run (torch.profiler memory events)."""
import json

import pytest
import torch

import poptorch
from openpop.runtime.trace import TraceSession

STAGES, WIDTH, ROWS, GA = 4, 64, 4, 8


def stage_modules():
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(STAGES)]


class FourStages(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = torch.nn.ModuleList(stage_modules())
        for i, stage in enumerate(self.stages):
            poptorch.BeginBlock(stage, user_id=f"s{i}", ipu_id=i)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x, poptorch.identity_loss(x.square(), reduction="mean")


def retained_bytes(run):
    """Bytes allocated inside ``run()`` and still alive when it returns (its result kept)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        kept = run()
    return sum(e.self_cpu_memory_usage for e in prof.events()), kept


def directly_measured_per_stage():
    """Plain PyTorch, one micro-batch: what each stage's forward leaves allocated for the
    backward (the input micro-batch arrives on stage 0; the loss belongs to the last stage)."""
    stages = stage_modules()
    x = torch.randn(ROWS, WIDTH)

    def first(stage):
        arrived = x.clone()
        return stage(arrived), arrived

    def middle(stage, h):
        return stage(h), None

    def last(stage, h):
        out = stage(h)
        return out, out.square().mean()

    measured, kept, h = [], [], None
    for i, stage in enumerate(stages):
        run = first if i == 0 else last if i == STAGES - 1 else middle
        nbytes, (h, held) = retained_bytes(
            lambda run=run, stage=stage, h=h: run(stage) if run is first else run(stage, h))
        measured.append(nbytes)
        kept.append(held)
    return measured


def run_recorded(directory, recomputation):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(GA)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts._Popart.set("autoRecomputation", 1 if recomputation else 0)
    model = FourStages()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    with TraceSession(directory, calls=range(1)):
        training(torch.randn(GA * ROWS, WIDTH))
    training.destroy()
    return json.loads((directory / "report.json").read_text())


def test_peak_activation_memory_per_ipu_matches_a_direct_measurement(tmp_path, no_environment_session):
    direct = directly_measured_per_stage()
    assert direct[1] == ROWS * WIDTH * 4  # one tanh output: the measurement is sound
    report = run_recorded(tmp_path, recomputation=False)
    peaks = [m["activation_peak_bytes"] for m in report["memory"]]
    # Micro-batches run forward then backward one after another: one micro-batch's worth.
    for ipu, (ours, theirs) in enumerate(zip(peaks, direct)):
        assert ours == pytest.approx(theirs, rel=0.10), (ipu, peaks, direct)


def test_recomputation_keeps_only_the_stage_inputs(tmp_path, no_environment_session):
    report = run_recorded(tmp_path, recomputation=True)
    peaks = [m["activation_peak_bytes"] for m in report["memory"]]
    tensor = ROWS * WIDTH * 4
    # Each checkpointed stage stashes only its input; the last stage's output is also kept for
    # the loss (square saves it).
    assert peaks == [tensor, tensor, tensor, 2 * tensor]


def test_disabled_saved_tensor_hooks_leave_activations_unmeasured(tmp_path, no_environment_session):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(GA)
    opts._Popart.set("autoRecomputation", 0)  # torch.utils.checkpoint needs the hooks too
    model = FourStages()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    training.compile(torch.randn(GA * ROWS, WIDTH))
    with TraceSession(tmp_path, calls=range(1)), \
            torch.autograd.graph.disable_saved_tensors_hooks("not here"):
        training(torch.randn(GA * ROWS, WIDTH))
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["activation_peak_bytes"] for m in report["memory"]] == [None] * STAGES
    assert report["memory"][0]["parameter_bytes"] == (WIDTH * WIDTH + WIDTH) * 4
    training.destroy()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_peak_per_ipu(tmp_path, no_environment_session):
    opts = poptorch.Options().deviceMap(["cuda:0"])
    opts.Training.gradientAccumulation(GA)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = FourStages()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    with TraceSession(tmp_path, calls=range(1)):
        training(torch.randn(GA * ROWS, WIDTH))
    memory = json.loads((tmp_path / "report.json").read_text())["memory"]
    weights = sum(m["parameter_bytes"] for m in memory)
    # One device holds all four stages: its peak covers every weight and the activations.
    assert {m["device_peak_bytes"] for m in memory} == {memory[0]["device_peak_bytes"]}
    assert memory[0]["device_peak_bytes"] >= weights + max(m["activation_peak_bytes"] for m in memory)
    training.destroy()
