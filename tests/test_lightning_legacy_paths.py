"""Lightning 2.0's IPU module paths (and lightning-graphcore's) resolve on Lightning 2.6, with
the names those modules offered. (That a fresh interpreter needs no import line of openpop's is
``test_lightning_hook.py``'s subject; here the modules are imported afresh in this process.)"""
import importlib
import sys

import pytest

pytest.importorskip("lightning.pytorch")

import poptorch

# module -> (name of the class in it, attribute of openpop's package); the 2.0 modules of the
# accelerator and strategy also had _IPU_AVAILABLE, _POPTORCH_AVAILABLE and poptorch.
MODULES_2_0 = {
    "accelerators.ipu": ("IPUAccelerator", "IPUAccelerator"),
    "strategies.ipu": ("IPUStrategy", "IPUStrategy"),
    "plugins.precision.ipu": ("IPUPrecisionPlugin", "IPUPrecision"),
}
WITH_AVAILABILITY = ("accelerators.ipu", "strategies.ipu")


def _fresh_import(name):
    """Import ``name`` through the import system again (its alias is rebuilt by the hook)."""
    saved = sys.modules.pop(name, None)
    try:
        return importlib.import_module(name)
    finally:
        if saved is not None:
            sys.modules[name] = saved


@pytest.mark.parametrize("flavour", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_2_0_module_paths_resolve_with_their_names(flavour):
    pytest.importorskip(flavour)
    package = importlib.import_module("openpop.lightning" if flavour == "lightning.pytorch"
                                      else "openpop._pytorch_lightning")
    for path, (name, openpop_name) in MODULES_2_0.items():
        module = _fresh_import(f"{flavour}.{path}")
        assert getattr(module, name) is getattr(package, openpop_name), path
        assert name in module.__all__
        if path in WITH_AVAILABILITY:
            assert module._IPU_AVAILABLE is True and module._POPTORCH_AVAILABLE is True
            assert module.poptorch is poptorch
    pl = importlib.import_module(flavour)
    assert pl.accelerators.ipu.IPUAccelerator is pl.accelerators.IPUAccelerator
    assert pl.strategies.ipu.IPUStrategy is pl.strategies.IPUStrategy
    assert pl.plugins.precision.ipu.IPUPrecisionPlugin is pl.plugins.IPUPrecisionPlugin
    from_statement = {}
    exec(f"from {flavour}.accelerators.ipu import IPUAccelerator, _IPU_AVAILABLE", from_statement)
    assert from_statement["IPUAccelerator"] is package.IPUAccelerator and from_statement["_IPU_AVAILABLE"]


def test_lightning_graphcore_package_and_modules_resolve():
    import openpop.lightning as package
    if not isinstance(getattr(importlib.import_module("lightning_graphcore"), "__loader__", None),
                      importlib.import_module("openpop.lightning.hook")._AliasLoader):
        pytest.skip("the real lightning-graphcore is installed")
    root = _fresh_import("lightning_graphcore")
    assert (root.IPUAccelerator, root.IPUStrategy, root.IPUPrecision) == (
        package.IPUAccelerator, package.IPUStrategy, package.IPUPrecision)
    assert _fresh_import("lightning_graphcore.accelerator").IPUAccelerator is package.IPUAccelerator
    assert _fresh_import("lightning_graphcore.accelerator")._IPU_AVAILABLE is True
    assert _fresh_import("lightning_graphcore.strategy").IPUStrategy is package.IPUStrategy
    assert _fresh_import("lightning_graphcore.precision").IPUPrecision is package.IPUPrecision
