"""A profile report of a 4-stage pipelined MLP (4 virtual IPUs on one CPU, so micro-batches run
one after another), host calls 1-2 of 4 recorded, rendered in headless Chromium (PNG: by default
OUT_DIR/report.png). ``OPENPOP_CONCURRENT_STAGES=on`` shows micro-batches overlapping instead.
The docs' screenshots come from ``scripts/report_screenshots.py``, which uses this model.

    python scripts/profile_report_demo.py [OUT_DIR] [PNG]
"""
import os
import sys

import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.trace import TraceSession

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from headless_chromium import screenshot


class FourStages(torch.nn.Module):
    def __init__(self, width=512):
        super().__init__()
        self.stages = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(4))
        for i, stage in enumerate(self.stages):
            poptorch.BeginBlock(stage, user_id=f"stage{i}", ipu_id=i)

    def forward(self, x, y):
        for stage in self.stages:
            x = stage(x)
        return x, F.mse_loss(x, y)


def main(argv):
    out = argv[0] if argv else "profile_demo"
    png = argv[1] if len(argv) > 1 else os.path.join(out, "report.png")
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.showCompilationProgressBar(False)
    model = FourStages()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(2 * 8 * 32, 512), torch.randn(2 * 8 * 32, 512)
    with TraceSession(out, calls=range(1, 3)):
        for _ in range(4):
            training(x, y)
    training.destroy()
    messages = screenshot(os.path.join(out, "report.html"), png, 1100, 1250)
    print(f"{out}/report.html -> {png}; console messages: {messages}")
    return 1 if messages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
