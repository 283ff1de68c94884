"""The ``Graph compilation`` bar is printed on stderr also when stderr is not a terminal (a log
file, a pipe), as PopTorch does: tools and tests grep logs for it."""
import io
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import openpop
import poptorch

from helpers.models import Classifier

FINISHED = re.compile(r"^Graph compilation: 100%\|█{10}\| 100/100 \[\d\d:\d\d<00:00\]$", re.MULTILINE)


def test_printed_once_when_stderr_is_captured(capfd):
    model = Classifier()
    training = poptorch.trainingModel(model, poptorch.Options(), torch.optim.SGD(model.parameters(), lr=0.1))
    training(torch.randn(2, 4), torch.tensor([0, 1]))
    training(torch.randn(2, 4), torch.tensor([0, 1]))
    err = capfd.readouterr().err
    assert len(FINISHED.findall(err)) == 1, err
    inference = poptorch.inferenceModel(Classifier(), poptorch.Options())
    inference.compile(torch.randn(2, 4), torch.tensor([0, 1]))
    assert len(FINISHED.findall(capfd.readouterr().err)) == 1


def test_not_printed_when_switched_off_or_when_compilation_fails(capfd):
    model = Classifier()
    opts = poptorch.Options().showCompilationProgressBar(False)
    poptorch.inferenceModel(model, opts)(torch.randn(2, 4), torch.tensor([0, 1]))
    assert "Graph compilation" not in capfd.readouterr().err

    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    no_loss = NoLoss()
    with pytest.raises(poptorch.Error, match="Couldn't find a loss"):
        poptorch.trainingModel(no_loss, poptorch.Options(), torch.optim.SGD(no_loss.parameters(), lr=0.1))(
            torch.randn(2, 4))
    assert "Graph compilation" not in capfd.readouterr().err


@pytest.mark.slow
def test_printed_when_stderr_is_a_file(tmp_path):
    script = textwrap.dedent("""
        import torch, poptorch
        model = torch.nn.Linear(4, 4)
        poptorch.inferenceModel(model)(torch.randn(2, 4))
        print("done")
    """)
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        done = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr,
                              text=True, timeout=120, env=_env())
    assert done.returncode == 0 and done.stdout.strip() == "done", log.read_text()
    assert len(FINISHED.findall(log.read_text(encoding="utf-8"))) == 1, log.read_text()


def _env():
    """This process's openpop first on the path, one thread."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(openpop.__file__)))
    return dict(os.environ, PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))


def test_live_bar_on_a_terminal_and_ascii_where_blocks_cannot_be_written():
    from openpop.runtime.progress import CompilationProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    progress = CompilationProgress(terminal)
    progress.finish()
    text = terminal.getvalue()
    assert "\r" in text and "Graph compilation: 100%|" in text and "100/100" in text

    class AsciiFile(io.StringIO):
        encoding = "ascii"

    log = AsciiFile()
    CompilationProgress(log).finish()
    assert re.fullmatch(r"Graph compilation: 100%\|#{10}\| 100/100 \[00:00<00:00\]\n", log.getvalue())
