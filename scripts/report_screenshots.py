"""The profile report's screenshots in the docs (docs/images/report-900.png, report-1600.png):
a 4-stage pipelined MLP on one CPU (``profile_report_demo.FourStages``), host calls 0-3
recorded (call 0 is the warm-up the report leaves out), rendered in headless Chromium 900 and
1600 px wide, each as tall as the page.

    python scripts/report_screenshots.py [OUT_DIR] [IMAGES_DIR]

Exits 1 if the page scrolls sideways at a width or logs console messages.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from headless_chromium import page_metrics, screenshot  # noqa: E402

WIDTHS = (900, 1600)


def record(out):
    from profile_report_demo import FourStages

    import poptorch
    from openpop.runtime.trace import TraceSession
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.showCompilationProgressBar(False)
    model = FourStages(width=256)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(2 * 8 * 16, 256), torch.randn(2 * 8 * 16, 256)
    with TraceSession(out, calls=range(4)):
        for _ in range(4):
            training(x, y)
    training.destroy()
    return os.path.join(out, "report.html")


def shoot(page, images, widths=WIDTHS):
    """A screenshot per width, as tall as the page there; returns the problems found."""
    os.makedirs(images, exist_ok=True)
    problems = []
    for width in widths:
        metrics = page_metrics(page, width)
        if metrics["scrollWidth"] > metrics["clientWidth"]:
            problems.append(f"{width} px: the page scrolls sideways ({metrics['scrollWidth']} px wide)")
        png = os.path.join(images, f"report-{width}.png")
        messages = screenshot(page, png, width, metrics["scrollHeight"])
        problems += [f"{width} px: console: {m}" for m in messages]
        print(f"{png}: {width} x {metrics['scrollHeight']} px, {os.path.getsize(png) // 1024} KiB")
    return problems


def main(argv):
    out = argv[0] if argv else "report_screenshots"
    images = argv[1] if len(argv) > 1 else os.path.join(HERE, "..", "docs", "images")
    problems = shoot(record(out), images)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
