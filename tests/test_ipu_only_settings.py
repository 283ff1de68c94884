"""IPU-only settings (memory proportions, tensor locations, PopART session keys openpop does not
read) are kept, change nothing, and are named once at INFO."""
import logging

import torch

import popart
import poptorch
from openpop import ipu_only_settings
from openpop.log import logger


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _ipu_tuned_options():
    opts = poptorch.Options()
    opts.setAvailableMemoryProportion({"IPU0": 0.3})
    opts.TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False))
    opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
    opts._Popart.set("accumulateOuterFragmentSettings.schedule",
                     int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized))
    opts._Popart.set("engineOptions", {"opt.useAutoloader": "true", "autoReport.all": "false"})
    opts._Popart.set("autoRecomputation", 0)  # read by openpop: not listed
    return opts


def test_the_ipu_only_settings_a_script_gave_are_named_as_it_named_them():
    assert ipu_only_settings.ipu_only_settings(_ipu_tuned_options()) == [
        "setAvailableMemoryProportion", "TensorLocations.setOptimizerLocation",
        "_Popart.accumulateOuterFragmentSettings.schedule", "engineOptions[opt.useAutoloader]",
        "_Popart.subgraphCopyingStrategy"]
    assert ipu_only_settings.ipu_only_settings(poptorch.Options()) == []


def test_they_are_logged_once_at_info_and_change_nothing(monkeypatch):
    monkeypatch.setattr(ipu_only_settings, "_logged", set())
    records = _Records()
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        x = torch.randn(3, 4)
        tuned = poptorch.inferenceModel(model, _ipu_tuned_options())(x)
        again = poptorch.inferenceModel(model, _ipu_tuned_options())(x)
        plain = poptorch.inferenceModel(model, poptorch.Options())(x)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    lines = [m for m in records.messages if "only steer IPU hardware" in m]
    assert len(lines) == 1 and "setAvailableMemoryProportion" in lines[0]
    torch.testing.assert_close(tuned, model(x))
    torch.testing.assert_close(again, plain)
