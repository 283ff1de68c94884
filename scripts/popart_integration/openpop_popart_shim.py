"""pytest plugin loaded with ``-p openpop_popart_shim`` when running PopART's own integration
tests against openpop. It changes no test and no assertion; it only
- restores ``onnx.mapping`` (removed in onnx 1.17; PopART's tests were written for onnx 1.10),
- bounds each test's time (a hung test fails instead of stalling the whole run),
- lets the pattern tests import operators_test's op_tester fixture as in PopART's CI,
- lets onnx's resize test helpers take the one-argument coefficient functions of onnx 1.10,
- gives helper.make_model onnx 1.10's default opset (15) when none is given,
- records which tests name tensors PopART's IR adds (marks.txt; they are out of scope).
"""
import os
import signal

import numpy as np
import onnx
import pytest

if not hasattr(onnx, "mapping"):
    import types

    from onnx import helper

    mapping = types.ModuleType("onnx.mapping")
    mapping.TENSOR_TYPE_TO_NP_TYPE = {k: helper.tensor_dtype_to_np_dtype(k)
                                      for k in range(1, 17) if k != 16}
    mapping.TENSOR_TYPE_TO_NP_TYPE[16] = np.dtype("float32")  # onnx 1.10's entry for BFLOAT16
    mapping.NP_TYPE_TO_TENSOR_TYPE = {v: k for k, v in mapping.TENSOR_TYPE_TO_NP_TYPE.items() if k != 16}
    onnx.mapping = mapping
    import sys
    sys.modules["onnx.mapping"] = mapping

TEST_TIMEOUT = int(os.environ.get("PIT_TEST_TIMEOUT", "300"))


class _Timeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    def on_alarm(signum, frame):
        raise _Timeout(f"test exceeded {TEST_TIMEOUT} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def pytest_configure(config):
    """PopART's pattern tests ``from conftest import op_tester`` after putting operators_test on sys.path;
    here the top-level tests/conftest.py comes first on sys.path: register operators_test/conftest.py as
    the module ``conftest`` for them."""
    import importlib.util
    import sys
    path = os.path.join(str(config.rootpath), "integration", "operators_test", "conftest.py")
    if "conftest" in sys.modules or not os.path.exists(path):
        return
    spec = importlib.util.spec_from_file_location("conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["conftest"] = module


# --- scope marking: a test that asks for the name of a tensor PopART's IR adds (popart.reserved*Prefix()
# other than the gradient and updated-variable prefixes users anchor) reads internal tensor names.
_CURRENT = {"nodeid": None}
_PUBLIC_PREFIXES = ("reservedGradientPrefix", "reservedUpdatedVarPrefix")


def _mark(reason):
    path = os.environ.get("PIT_MARK_FILE")
    if path and _CURRENT["nodeid"]:
        with open(path, "a") as f:
            f.write(f"{_CURRENT['nodeid']}\t{reason}\n")


def _wrap_reserved():
    import popart
    for name in dir(popart):
        if name.startswith("reserved") and name.endswith("Prefix") and name not in _PUBLIC_PREFIXES:
            original = getattr(popart, name)

            def wrapper(*a, _original=original, _name=name, **k):
                _mark(f"internal tensor name ({_name})")
                return _original(*a, **k)
            setattr(popart, name, wrapper)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _CURRENT["nodeid"] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    for wrap in (_wrap_reserved, _wrap_dataflow):
        try:
            wrap()
        except Exception:
            pass


# Anchoring a tensor PopART's IR adds (its reserved prefixes, the loss-scale tensors) reads internal tensor
# names too.
_INTERNAL_EXACT = ("finalLossScale", "lossScaleUpdateFactor", "autoLossScaleStats")


def _wrap_dataflow():
    import popart
    from openpop.popart.names import RESERVED_PREFIXES
    prefixes = tuple(v for k, v in RESERVED_PREFIXES.items() if k not in _PUBLIC_PREFIXES)
    original = popart.DataFlow.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            for anchor in self.anchors():
                if anchor.startswith(prefixes) or any(name in anchor for name in _INTERNAL_EXACT):
                    _mark(f"internal tensor name (anchor {anchor})")
        except Exception:
            pass
    popart.DataFlow.__init__ = init


# onnx 1.10's backend test helpers call ``get_coeffs(ratio)``; onnx 1.17 calls ``get_coeffs(ratio, scale)``.
# PopART's resize tests pass one-argument functions: accept both.
try:
    import inspect as _inspect

    import onnx.backend.test.case.node.resize as _onnx_resize

    _interpolate_nd = _onnx_resize.interpolate_nd

    def _interpolate_nd_compat(data, get_coeffs, *args, **kwargs):
        try:
            params = list(_inspect.signature(get_coeffs).parameters)
            one_argument = len(params) == 1 or params[1] != "scale"  # nearest_coeffs(ratio, mode=...)
        except (TypeError, ValueError):
            one_argument = False
        if one_argument:
            original = get_coeffs

            def get_coeffs(ratio, scale=None):
                return original(ratio)
        return _interpolate_nd(data, get_coeffs, *args, **kwargs)
    _onnx_resize.interpolate_nd = _interpolate_nd_compat
except ImportError:
    pass


# onnx 1.10's helper.make_model stamps models with ai.onnx opset 15 (its newest); later onnx stamps newer
# opsets, from which its version converter has no adapters down to the opset 9 PopART's type-cast tests ask for.
_make_model = onnx.helper.make_model


def _make_model_onnx110(graph, **kwargs):
    if "opset_imports" not in kwargs:
        kwargs["opset_imports"] = [onnx.helper.make_opsetid("", 15)]
    return _make_model(graph, **kwargs)


onnx.helper.make_model = _make_model_onnx110
