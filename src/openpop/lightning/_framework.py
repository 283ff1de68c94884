"""Which Lightning distribution this copy of ``openpop.lightning`` is bound to.

Lightning ships the same trainer twice: ``lightning.pytorch`` (package ``lightning``) and
``pytorch_lightning`` (package ``pytorch-lightning``). Their classes are distinct, so a strategy
for one is not a strategy for the other. openpop keeps one source for both: this package is
``openpop.lightning`` (bound to ``lightning.pytorch``), and ``integration.classic_package()``
loads the very same files a second time as ``openpop._pytorch_lightning`` (bound to
``pytorch_lightning``). Every module reaches Lightning only through ``pl`` / ``module()`` here,
and imports its siblings relatively, so each copy stays on its own distribution.
"""
import importlib

CLASSIC_PACKAGE = "openpop._pytorch_lightning"
CLASSIC = __name__.startswith(CLASSIC_PACKAGE + ".")
PL_NAME = "pytorch_lightning" if CLASSIC else "lightning.pytorch"
FABRIC_NAME = "lightning_fabric" if CLASSIC else "lightning.fabric"

pl = importlib.import_module(PL_NAME)


def module(path: str):
    """``module("trainer.call")`` -> ``lightning.pytorch.trainer.call`` (or ``pytorch_lightning...``)."""
    return importlib.import_module(f"{PL_NAME}.{path}")


def fabric_module(path: str):
    return importlib.import_module(f"{FABRIC_NAME}.{path}")
