"""The import hook that gives Lightning its IPU classes back, with no import line in user code.

Installing openpop puts ``openpop-lightning.pth`` in site-packages. Python runs it at start-up;
it loads this file (standard library only, nothing else is imported: start-up stays cheap) and
calls ``install()``, which puts ``LightningFinder`` first on ``sys.meta_path``. The finder does
two things, both lazily:

* When ``lightning.pytorch`` or ``pytorch_lightning`` has *finished* importing, it imports the
  matching copy of ``openpop.lightning`` (see ``_framework.py``), whose ``integration`` module
  adds ``IPUStrategy`` / ``IPUAccelerator`` / ``IPUPrecision`` (and the old names
  ``IPUPrecisionPlugin``, ``IPUPlugin``) to ``strategies`` / ``accelerators`` / ``plugins``,
  registers ``"ipu"`` and ``"ipu_strategy"`` and teaches the Trainer to pick them.
* It serves the old submodules ``<pl>.strategies.ipu``, ``<pl>.accelerators.ipu``,
  ``<pl>.plugins.precision.ipu`` (with the names Lightning 2.0's modules had, e.g.
  ``_IPU_AVAILABLE``) and, when the real package is not installed, ``lightning_graphcore`` and
  its ``accelerator`` / ``strategy`` / ``precision`` modules, as aliases of openpop's classes.

So ``from lightning.pytorch.strategies import IPUStrategy`` works in a fresh interpreter. Where
no ``.pth`` file can be installed, ``import openpop.lightning`` (before or after importing
Lightning) does the same. ``OPENPOP_LIGHTNING_HOOK=0`` turns the hook off.

An error while integrating never breaks ``import lightning``: it is reported as a warning and
``import openpop.lightning`` shows the full traceback.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

DISABLE_ENV = "OPENPOP_LIGHTNING_HOOK"

# Lightning package -> the openpop.lightning copy bound to it.
FLAVOURS = {"lightning.pytorch": "openpop.lightning", "pytorch_lightning": "openpop._pytorch_lightning"}

# Modules served as aliases: name -> (Lightning package it belongs to, {attribute: openpop name}).
# An openpop name is an attribute of the bound openpop.lightning copy, or "module:<name>" for a
# module. Each alias carries what its original module offered users: Lightning 2.0's
# ``accelerators/ipu.py`` defined ``_POPTORCH_AVAILABLE``, ``_IPU_AVAILABLE`` and ``poptorch``
# next to the class, and ``strategies/ipu.py`` imported them.
_AVAILABILITY = {"_IPU_AVAILABLE": "IPU_AVAILABLE", "_POPTORCH_AVAILABLE": "POPTORCH_AVAILABLE",
                 "poptorch": "module:poptorch"}
_CLASSES = {"IPUStrategy": "IPUStrategy", "IPUAccelerator": "IPUAccelerator", "IPUPrecision": "IPUPrecision",
            "IPUPrecisionPlugin": "IPUPrecision"}
ALIASES = {}
for _pl in FLAVOURS:
    ALIASES[f"{_pl}.strategies.ipu"] = (_pl, {"IPUStrategy": "IPUStrategy", **_AVAILABILITY})
    ALIASES[f"{_pl}.accelerators.ipu"] = (_pl, {"IPUAccelerator": "IPUAccelerator", **_AVAILABILITY})
    ALIASES[f"{_pl}.plugins.precision.ipu"] = (_pl, {"IPUPrecision": "IPUPrecision",
                                                     "IPUPrecisionPlugin": "IPUPrecision"})
# lightning-graphcore (for Lightning 2.1/2.2, never importable on 2.6): the package and its modules.
FALLBACK_ALIASES = {
    "lightning_graphcore": ("lightning.pytorch", _CLASSES),
    "lightning_graphcore.accelerator": ("lightning.pytorch", {"IPUAccelerator": "IPUAccelerator", **_AVAILABILITY}),
    "lightning_graphcore.strategy": ("lightning.pytorch", {"IPUStrategy": "IPUStrategy", **_AVAILABILITY}),
    "lightning_graphcore.precision": ("lightning.pytorch", {"IPUPrecision": "IPUPrecision"}),
}


def flavour_package(pl_name: str):
    """Import (once) the openpop.lightning copy bound to ``pl_name`` and return it."""
    name = FLAVOURS[pl_name]
    if name in sys.modules:
        return sys.modules[name]
    if name == "openpop.lightning":
        return importlib.import_module(name)
    # The classic copy: the files of openpop.lightning loaded again under another name.
    main = importlib.util.find_spec("openpop.lightning")
    directory = next(iter(main.submodule_search_locations))
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, "__init__.py"),
                                                  submodule_search_locations=[directory])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(sys.modules["openpop"], name.rsplit(".", 1)[1], package)
    return package


def _messages():
    """``messages.py`` loaded by its path: this module may run without the ``openpop`` package."""
    spec = importlib.util.spec_from_file_location("openpop.lightning._hook_messages",
                                                  os.path.join(os.path.dirname(__file__), "messages.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _IntegratingLoader(importlib.abc.Loader):
    """Runs the real loader, then integrates openpop with the freshly imported package."""

    def __init__(self, loader, pl_name: str):
        self._loader = loader
        self._pl_name = pl_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        try:
            flavour_package(self._pl_name)
        except Exception as exc:  # never break the user's import of Lightning
            warnings.warn(_messages().HOOK_FAILED.format(package=self._pl_name, error=exc,
                                                      flavour=FLAVOURS[self._pl_name]), stacklevel=2)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, pl_name: str, names: dict):
        self._pl_name = pl_name
        self._names = names

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        importlib.import_module(self._pl_name)  # integrates, if not done yet
        package = flavour_package(self._pl_name)
        for alias, name in self._names.items():
            if name.startswith("module:"):
                value = importlib.import_module(name[len("module:"):])
            else:
                value = getattr(package, name)
            setattr(module, alias, value)
        module.__all__ = [alias for alias in self._names if not alias.startswith("_") and alias != "poptorch"]
        module.__doc__ = f"Alias served by openpop: the IPU classes of {package.__name__}."
        if module.__name__ == "lightning_graphcore":
            module.__path__ = []  # a package: its submodules are aliases too


class LightningFinder(importlib.abc.MetaPathFinder):
    _openpop_lightning_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname in FLAVOURS:
            spec = _find_elsewhere(self, fullname, path, target)
            if spec is None or spec.loader is None:
                return spec
            spec.loader = _IntegratingLoader(spec.loader, fullname)
            return spec
        if fullname in ALIASES:
            pl_name, names = ALIASES[fullname]
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(pl_name, names))
        if fullname in FALLBACK_ALIASES and _serves_fallback(fullname) \
                and _find_elsewhere(self, fullname, path, target) is None:
            pl_name, names = FALLBACK_ALIASES[fullname]
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(pl_name, names))
        return None


def _serves_fallback(fullname: str) -> bool:
    """A submodule of ``lightning_graphcore`` is served only under openpop's alias of the package."""
    parent = fullname.rpartition(".")[0]
    return not parent or isinstance(getattr(sys.modules.get(parent), "__loader__", None), _AliasLoader)


def _find_elsewhere(finder, fullname, path, target):
    for other in sys.meta_path:
        if other is finder or getattr(other, "_openpop_lightning_hook", False):
            continue
        find = getattr(other, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def installed() -> bool:
    return any(getattr(f, "_openpop_lightning_hook", False) for f in sys.meta_path)


def install(respect_env: bool = True) -> bool:
    """Put the finder first on ``sys.meta_path`` (once). Returns whether the hook is active.

    The ``.pth`` file honours ``OPENPOP_LIGHTNING_HOOK=0``; ``import openpop.lightning`` is an
    explicit request and installs it regardless."""
    if respect_env and os.environ.get(DISABLE_ENV, "1").lower() in ("0", "off", "false", "no"):
        return False
    if not installed():
        sys.meta_path.insert(0, LightningFinder())
    return True


# What the .pth file executes (one line; any failure is reported, never raised).
PTH_LINE = (
    "import sys; exec(\"try:\\n import importlib.util as _u, os as _o\\n _s = _u.find_spec('openpop')\\n"
    " if _s is not None and _s.submodule_search_locations and _o.environ.get('" + DISABLE_ENV + "', '1') not in"
    " ('0', 'off', 'false', 'no'):\\n  _p = _o.path.join(list(_s.submodule_search_locations)[0], 'lightning',"
    " 'hook.py')\\n  _h = _u.spec_from_file_location('openpop.lightning.hook', _p)\\n"
    "  _m = _u.module_from_spec(_h)\\n  sys.modules['openpop.lightning.hook'] = _m\\n  _h.loader.exec_module(_m)\\n"
    "  _m.install()\\nexcept Exception as _e:\\n print('openpop: Lightning IPU hook not installed:', repr(_e),"
    " file=sys.stderr)\\n\")\n")
PTH_NAME = "openpop-lightning.pth"
