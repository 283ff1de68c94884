"""The compiled backend builds a program's C++ kernels in one g++ run (runtime/compiled/kernel_batch.py)."""
import copy
import pathlib

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.compiled import kernel_batch

from helpers.models import make_data, regressor_loss
from helpers.oracle import train_loop


class Deep(torch.nn.Module):
    """More aten ops than a small program has (``program_options.SMALL_PROGRAM_OPS``: those use the C++ wrapper)."""

    def __init__(self, depth=8):
        super().__init__()
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(depth))
        self.out = torch.nn.Linear(6, 2)

    def forward(self, x, target):
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        out = self.out(x)
        return out, F.mse_loss(out, target)


def _sources(cache_dir):
    return [p.read_text(errors="replace") for p in pathlib.Path(cache_dir).rglob("*.cpp")]


@pytest.mark.slow
def test_program_kernels_are_built_as_one_library_and_train_as_eager(tmp_path):
    torch.manual_seed(0)
    model = Deep()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().openpopBackend("compiled").enableExecutableCaching(str(tmp_path))
    opts.Training.gradientAccumulation(2)
    opts.outputMode(poptorch.OutputMode.Sum)
    opts.showCompilationProgressBar(False)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.Adam(model.parameters(), lr=0.01))
    x, t = make_data(2 * 3)
    losses = torch.stack([pop(x, t)[1] for _ in range(2)])
    assert pop._dispatch.compiled.last == "compiled"

    sources = _sources(tmp_path)
    batches = [s for s in sources if "namespace openpop_kernel_0" in s]
    single = [s for s in sources if 'extern "C"  void  kernel(' in s]
    assert len(batches) == 1 and not single, (len(batches), len(single))
    assert "openpop_kernel_2" in batches[0]  # several kernels in it (Adam, forward, backward)

    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    expected = [train_loop(reference, optimizer, (x, t), regressor_loss, 1, 2, 1).sum() for _ in range(2)]
    torch.testing.assert_close(losses.reshape(-1), torch.stack(expected), rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_kernels_of_unexpected_shape_are_left_to_inductor():
    kernel = '#include <torch/csrc/inductor/cpp_prefix.h>\nextern "C"  void  kernel(float* out_ptr0)\n{\n}\n'
    assert kernel_batch._batchable(kernel)
    assert not kernel_batch._batchable("#include <vector>\n" + kernel)
    assert not kernel_batch._batchable(kernel + kernel.splitlines()[1] + "{}\n")
    source = kernel_batch.combined_source([kernel_batch._Pending(["float*"], kernel)] * 2)
    assert 'extern "C"' not in source and source.count("void kernel(float* out_ptr0)") == 2
    assert '{"kernel_1", kernel_1_py, METH_VARARGS, ""},' in source and "PyInit_kernel(void)" in source
