"""PyTorch Lightning's IPU support (``accelerator="ipu"``, ``IPUStrategy``) on openpop, for
Lightning 2.6.

User code needs no import line: installing openpop installs an import hook (``hook.py``) so
that ``from lightning.pytorch.strategies import IPUStrategy``, ``Trainer(accelerator="ipu")``
and the ``pytorch_lightning`` equivalents work as soon as Lightning is imported. Where the hook
is not active (``OPENPOP_LIGHTNING_HOOK=0``, or an install without the ``.pth`` file),
``import openpop.lightning`` does the same.

One concept per module:

* ``accelerator.py``   ``IPUAccelerator``: virtual IPUs, ``devices`` = replicas
* ``strategy.py``      ``IPUStrategy``: the loops on openpop's executor (what a batch and a step are)
* ``stage_runner.py``  ``StageRunner``: one stage's executor, compiled shapes, per-step hooks, report
* ``manual_optimization.py`` manual optimization on the host; ``lockstep.py`` its replicas as DDP ranks
* ``precision.py``     ``IPUPrecision``: ``32-true``, ``16-mixed``, ``bf16-mixed``, ``16-true``, ``bf16-true``
* ``run_options.py``   the ``poptorch.Options`` each stage runs with (and the Sharded fallback's)
* ``trainer_checks.py`` Trainer settings the strategy refuses or warns about
* ``steps.py``         a LightningModule step as one micro-batch of a host call
* ``compiled_steps.py`` the step as the compiled backend traces it (``self.log`` as outputs)
* ``logs.py``          ``self.log`` reduced over micro-batches
* ``optimizer_steps.py`` per-optimizer-step hooks, clipping, ``global_step``, LR schedulers
* ``data.py``          dataloaders -> ``poptorch.DataLoader``
* ``instances.py``     Lightning's collectives across poprun's instances
* ``report.py``        ``autoreport`` profile reports
* ``integration.py``   names, registries and the Trainer's accelerator/strategy/precision choice
* ``hook.py``          the import hook; ``_framework.py`` the Lightning distribution bound to
"""
import sys

from ._framework import CLASSIC
from .accelerator import IPU_AVAILABLE, POPTORCH_AVAILABLE, IPUAccelerator
from .integration import integrate
from .precision import IPUPrecision
from .strategy import IPUStrategy

IPUPrecisionPlugin = IPUPrecision  # Lightning 2.0's name
IPUPlugin = IPUStrategy            # Lightning 1.x's name

__all__ = ["IPUAccelerator", "IPUPlugin", "IPUPrecision", "IPUPrecisionPlugin", "IPUStrategy"]

integrate()

if not CLASSIC:
    from . import hook

    hook.install(respect_env=False)
    if "pytorch_lightning" in sys.modules:
        hook.flavour_package("pytorch_lightning")
