"""openpop's Inductor passes in one registry (``runtime/compiled/passes.py``): switch, probe, fallback."""
import importlib

import pytest
import torch

from openpop.runtime.compiled import kernel_batch, passes, regions
from openpop.runtime.compiled.attention_backward import ShortAttentionBackward
from openpop.runtime.compiled.dropout_masks import FastDropoutMasks
from openpop.runtime.compiled.onednn_matmuls import OneDnnMatmuls
from openpop.torch_compat import AsyncCompile

CPU = torch.device("cpu")


def test_the_reference_page_is_current():
    assert passes.PAGE.read_text() == passes.reference_page(), \
        "run: python -m openpop.runtime.compiled.passes --write"
    assert passes.main(["--check"]) == 0


@pytest.mark.parametrize("entry", passes.PASSES, ids=lambda p: p.name)
def test_every_pass_names_its_module_switch_probe_and_fallback(entry):
    module = importlib.import_module(f"openpop.runtime.compiled.{entry.name}")
    assert not entry.probe or callable(getattr(module, entry.probe))
    assert passes.DISABLE_ENV in entry.switch and entry.fallback and entry.probe_checks
    assert f"## {entry.name}" in passes.reference_page()


def test_the_switch_reads_a_list_of_names(monkeypatch):
    monkeypatch.setenv(passes.DISABLE_ENV, " Dropout_Masks, kernel_batch ,")
    assert passes.disabled() == {"dropout_masks", "kernel_batch"}
    assert not passes.switched_on("kernel_batch") and not passes.active("dropout_masks")
    assert passes.switched_on("attention_backward") and passes.active("attention_backward")
    monkeypatch.delenv(passes.DISABLE_ENV)
    assert passes.disabled() == frozenset()


def test_an_unknown_name_is_an_error_listing_the_passes(monkeypatch):
    monkeypatch.setenv(passes.DISABLE_ENV, "dropout_masks,fast_gemm")
    with pytest.raises(ValueError, match=r"OPENPOP_DISABLE_PASSES='dropout_masks,fast_gemm' names fast_gemm, not an "
                                         r"openpop pass: set it to a comma-separated list of attention_backward, "
                                         r"dropout_masks, onednn_matmuls, kernel_batch, flat_operands \(or unset it\)"):
        passes.disabled()


def test_an_unknown_name_fails_when_a_model_is_wrapped(monkeypatch):
    import poptorch
    monkeypatch.setenv(passes.DISABLE_ENV, "fast_gemm")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="names fast_gemm, not an openpop pass"):
        poptorch.inferenceModel(model)


def _installed(training):
    options = regions.compile_options(CPU, training)
    found = [type(p) for p in options.get("post_grad_custom_post_pass", [])]
    pre = options.get("post_grad_custom_pre_pass")
    return found + ([type(pre)] if pre is not None else [])


def test_regions_install_what_the_switches_and_probes_allow(monkeypatch):
    from openpop.runtime.compiled import dropout_masks, onednn_matmuls
    monkeypatch.setattr(onednn_matmuls, "gemm_choice", lambda: "onednn")
    monkeypatch.setattr(dropout_masks, "draws_like_aten", lambda: True)
    assert set(_installed(True)) == {ShortAttentionBackward, FastDropoutMasks, OneDnnMatmuls}
    assert _installed(False) == [OneDnnMatmuls]
    monkeypatch.setattr(dropout_masks, "draws_like_aten", lambda: False)  # the probe: aten's kernel stays
    assert set(_installed(True)) == {ShortAttentionBackward, OneDnnMatmuls}
    monkeypatch.setenv(passes.DISABLE_ENV, "attention_backward,onednn_matmuls,dropout_masks")
    monkeypatch.setattr(dropout_masks, "draws_like_aten", lambda: True)
    assert _installed(True) == [] and _installed(False) == []


def test_kernel_batch_switched_off_leaves_inductor_s_build(monkeypatch):
    original = AsyncCompile.cpp_pybinding
    with kernel_batch.batched_kernels():
        assert AsyncCompile.cpp_pybinding is not original
    assert AsyncCompile.cpp_pybinding is original
    monkeypatch.setenv(passes.DISABLE_ENV, "kernel_batch")
    with kernel_batch.batched_kernels():
        assert AsyncCompile.cpp_pybinding is original
