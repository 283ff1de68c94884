"""Make a Lightning distribution use openpop's IPU classes.

``integrate()`` runs once per copy of this package (``lightning.pytorch`` or
``pytorch_lightning``, see ``_framework.py``):

1. Names: ``strategies.IPUStrategy``, ``accelerators.IPUAccelerator``, ``plugins.IPUPrecision``
   (+ Lightning 2.0's ``IPUPrecisionPlugin`` in ``plugins`` and ``plugins.precision``, and
   Lightning 1.x's ``plugins.IPUPlugin`` = ``IPUStrategy``).
2. Registries: ``"ipu"`` in ``AcceleratorRegistry``, ``"ipu_strategy"`` in ``StrategyRegistry``.
3. ``trainer.estimated_stepping_batches`` with an ``IPUStrategy`` counts optimizer steps
   (``device_iterations`` per batch), e.g. for ``OneCycleLR(total_steps=...)``.
3b. A ``poptorch.DataLoader`` the user returns reaches ``IPUStrategy.process_dataloader`` as it
   is: Lightning's predict-time re-instantiation (to record batch indices) would rebuild it
   with its batch size as the micro-batch size; the strategy records them itself (``data.py``).
4. The Trainer's choices. Lightning 2.6 has no extension point for them, so three methods of
   its ``_AcceleratorConnector`` are wrapped; each defers to Lightning for anything not IPU:

   * flags: ``strategy=IPUStrategy(...)`` / ``"ipu_strategy"`` implies ``accelerator="ipu"``
     (an explicit other accelerator is an error); an ``IPUStrategy`` that carries its own
     ``IPUAccelerator`` (lightning-graphcore's ``IPUStrategy(accelerator=IPUAccelerator())``)
     leaves the flag alone, so that Lightning takes the strategy's accelerator as it does for
     any strategy (setting the flag too is what Lightning calls "set through both");
     ``accelerator="ipu"`` with a strategy that is not an ``IPUStrategy`` is an error; an
     ``IPUStrategy`` passed in ``plugins`` (Lightning 1.x style) is taken as the strategy.
   * strategy: ``accelerator="ipu"`` with ``strategy="auto"`` -> ``IPUStrategy()``.
   * precision: an ``IPUStrategy`` gets ``IPUPrecision(precision)``; unsupported precisions and
     other precision plugins are errors.
"""
from ._framework import module
from .accelerator import IPUAccelerator
from .precision import IPUPrecision
from .strategy import IPUStrategy

STRATEGY_WITH_OTHER_ACCELERATOR = (
    "`IPUStrategy` runs on openpop's virtual IPUs and needs `accelerator='ipu'` (or no accelerator), but "
    "`accelerator={accelerator!r}` was given. Remove `accelerator=` or set `accelerator='ipu'`.")
STRATEGY_CARRIES_OTHER_ACCELERATOR = (
    "`IPUStrategy` runs on openpop's virtual IPUs, but it was given `accelerator={accelerator}`. Pass "
    "`IPUStrategy(accelerator=IPUAccelerator())` or leave `accelerator` out.")
ACCELERATOR_WITH_OTHER_STRATEGY = (
    "`Trainer(accelerator='ipu')` runs with `IPUStrategy` only, but `strategy={strategy!r}` was given. Remove "
    "`strategy=` or pass `strategy=IPUStrategy(...)`.")
OTHER_PRECISION_PLUGIN = (
    "`IPUStrategy` needs its own precision plugin, `IPUPrecision`, but `{plugin}` was given. Pass "
    "`precision=...` (one of {supported}) instead.")

_done = False


def _is_ipu_accelerator(flag) -> bool:
    return isinstance(flag, IPUAccelerator) or (isinstance(flag, str) and flag.lower() == "ipu")


def _is_ipu_strategy(flag) -> bool:
    return isinstance(flag, IPUStrategy) or (isinstance(flag, str) and flag.lower() == IPUStrategy.strategy_name)


def _describe(flag) -> str:
    return flag if isinstance(flag, str) else type(flag).__name__


def _patch_connector() -> None:
    connector = module("trainer.connectors.accelerator_connector")._AcceleratorConnector
    if getattr(connector, "_openpop_ipu", False):
        return
    check_flags = connector._check_config_and_set_final_flags
    choose_strategy = connector._choose_strategy
    init_precision = connector._check_and_init_precision

    def _check_config_and_set_final_flags(self, strategy, accelerator, precision, plugins, sync_batchnorm):
        if plugins is not None:
            listed = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
            lifted = [p for p in listed if isinstance(p, IPUStrategy)]
            if lifted and (strategy == "auto" or strategy is None):
                strategy = lifted[0]
                listed = [p for p in listed if p is not lifted[0]]
                plugins = listed or None
        if _is_ipu_strategy(strategy):
            carried = getattr(strategy, "_accelerator", None)
            if carried is not None:  # lightning-graphcore's `IPUStrategy(accelerator=IPUAccelerator())`
                if not isinstance(carried, IPUAccelerator):
                    raise ValueError(STRATEGY_CARRIES_OTHER_ACCELERATOR.format(accelerator=_describe(carried)))
                # Lightning takes the strategy's accelerator itself (with an `accelerator=` flag as well,
                # it raises its own "set through both strategy class and accelerator flag").
            elif accelerator in ("auto", None):
                accelerator = "ipu"
            elif not _is_ipu_accelerator(accelerator):
                raise ValueError(STRATEGY_WITH_OTHER_ACCELERATOR.format(accelerator=_describe(accelerator)))
        elif _is_ipu_accelerator(accelerator) and strategy not in ("auto", None):
            raise ValueError(ACCELERATOR_WITH_OTHER_STRATEGY.format(strategy=_describe(strategy)))
        return check_flags(self, strategy, accelerator, precision, plugins, sync_batchnorm)

    def _choose_strategy(self):
        if _is_ipu_accelerator(self._accelerator_flag):
            return IPUStrategy()
        return choose_strategy(self)

    def _check_and_init_precision(self):
        if not isinstance(self.strategy, IPUStrategy):
            return init_precision(self)
        plugin = self._precision_plugin_flag
        if plugin is not None:
            if isinstance(plugin, IPUPrecision):
                return plugin
            from .precision import SUPPORTED
            raise ValueError(OTHER_PRECISION_PLUGIN.format(plugin=type(plugin).__name__, supported=SUPPORTED))
        return IPUPrecision(self._precision_flag)

    connector._check_config_and_set_final_flags = _check_config_and_set_final_flags
    connector._choose_strategy = _choose_strategy
    connector._check_and_init_precision = _check_and_init_precision
    connector._openpop_ipu = True


def _patch_estimated_stepping_batches() -> None:
    """``trainer.estimated_stepping_batches`` counts optimizer steps: device_iterations per batch."""
    trainer_class = module("trainer.trainer").Trainer
    original = trainer_class.estimated_stepping_batches
    if getattr(original.fget, "_openpop_ipu", False):
        return

    def estimated_stepping_batches(self):
        strategy = self.strategy
        if not isinstance(strategy, IPUStrategy) or self.max_epochs == -1:
            return original.fget(self)
        if self.train_dataloader is None:
            self.fit_loop.setup_data()
        batches = self.num_training_batches
        if batches == float("inf"):
            return self.max_steps
        steps = batches * strategy.training_opts.device_iterations * max(self.max_epochs, 1)
        return min(steps, self.max_steps) if self.max_steps != -1 else steps

    estimated_stepping_batches.__doc__ = original.__doc__
    patched = property(estimated_stepping_batches)
    patched.fget._openpop_ipu = True
    trainer_class.estimated_stepping_batches = patched


def _patch_data_connector() -> None:
    """User ``poptorch.DataLoader``s skip Lightning's re-instantiation under an ``IPUStrategy``."""
    from openpop.data import DataLoader as PoptorchDataLoader

    connector = module("trainer.connectors.data_connector")._DataConnector
    original = connector._prepare_dataloader
    if getattr(original, "_openpop_ipu", False):
        return

    def _prepare_dataloader(self, dataloader, shuffle, mode):
        if isinstance(dataloader, PoptorchDataLoader) and isinstance(self.trainer.strategy, IPUStrategy):
            return dataloader
        return original(self, dataloader, shuffle, mode)

    _prepare_dataloader._openpop_ipu = True
    connector._prepare_dataloader = _prepare_dataloader


def integrate() -> None:
    """Add the names, register, patch the connector (idempotent)."""
    global _done
    if _done:
        return
    strategies, accelerators = module("strategies"), module("accelerators")
    plugins, precision_plugins = module("plugins"), module("plugins.precision")
    strategies.IPUStrategy = IPUStrategy
    accelerators.IPUAccelerator = IPUAccelerator
    for namespace in (plugins, precision_plugins):
        namespace.IPUPrecision = IPUPrecision
        namespace.IPUPrecisionPlugin = IPUPrecision
    plugins.IPUPlugin = IPUStrategy
    IPUAccelerator.register_accelerators(accelerators.AcceleratorRegistry)
    IPUStrategy.register_strategies(strategies.StrategyRegistry)
    _patch_connector()
    _patch_estimated_stepping_batches()
    _patch_data_connector()
    _done = True
