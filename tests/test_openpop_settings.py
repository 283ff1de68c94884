"""openpop's own settings (``openpop/openpop_settings.py``): one model, the one module that reads them."""
import ast
import pathlib

import pytest

from openpop import env_vars, openpop_settings
from openpop.distributed import instance
from openpop.lightning import hook

SRC = pathlib.Path(openpop_settings.__file__).resolve().parent
SETTINGS_FILE = pathlib.Path(openpop_settings.__file__).resolve()

# Modules that run before openpop can be imported keep their own copy of a variable's name (a
# test below checks it is the registry's): the Lightning hook's .pth line runs at interpreter
# start-up, and distributed/instance.py runs by path in each instance poprun starts.
RUNS_BEFORE_OPENPOP = {
    SRC / "lightning" / "hook.py": {"OPENPOP_LIGHTNING_HOOK"},
    SRC / "distributed" / "instance.py": {"OPENPOP_COLLECTIVE_TIMEOUT", "OPENPOP_DEVICE_MAP",
                                            "OPENPOP_HOROVOD_COMPAT"},
}


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield id(first.value)


def test_only_the_settings_module_names_a_setting_s_variable():
    """A variable's name as a string (``"OPENPOP_BACKEND"``, not in a docstring or a message) is
    how a module reads it: only openpop_settings.py does; the others ask it
    (``openpop_settings.read("backend")``, ``openpop_settings.env("backend")``)."""
    names = set(openpop_settings.BY_ENV)
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SETTINGS_FILE:
            continue
        tree = ast.parse(path.read_text())
        skip = set(_docstrings(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skip:
                if node.value not in RUNS_BEFORE_OPENPOP.get(path, ()):
                    offenders.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {node.value}")
    assert not offenders, "read these through openpop_settings:\n" + "\n".join(offenders)


def test_modules_that_run_before_openpop_use_the_registry_s_names():
    assert hook.DISABLE_ENV == openpop_settings.env("lightning_hook")
    assert instance.COLLECTIVE_TIMEOUT == openpop_settings.env("collective_timeout")
    assert instance.DEVICE_MAP == openpop_settings.env("device_map")
    assert instance.HOROVOD_COMPAT == openpop_settings.env("horovod_compat")
    assert instance.DEFAULT_COLLECTIVE_TIMEOUT == openpop_settings.read("collective_timeout", environ={})
    # the hook's .pth line turns off on the same words as the setting
    for word in ("0", "off", "false", "no", "OFF"):
        assert not openpop_settings.read("lightning_hook", {"OPENPOP_LIGHTNING_HOOK": word})
        assert f"'{word}'" in hook.PTH_LINE or word == "OFF"


def test_the_reference_page_s_first_group_is_the_settings():
    documented = [v for v in env_vars.VARIABLES if v.group == env_vars.OPENPOP]
    assert [v.name for v in documented] == [s.env for s in openpop_settings.SETTINGS]
    for variable, setting in zip(documented, openpop_settings.SETTINGS):
        assert (variable.default, variable.meaning, variable.see) == (setting.default, setting.meaning, setting.see)


DEFAULTS = {
    "device_map": None, "concurrent_stages": "auto", "host_memory": None, "backend": None, "compile_after": None,
    "compiled_unit": "auto", "cpu_gemm": None, "disable_passes": (), "cache_lock_timeout": 1800.0,
    "executable_cache": True, "executable_cache_max_mb": 2048.0,
    "half_compute": None, "half_overflow": None, "lightning_hook": True, "popart_num_ipus": 64,
    "collective_timeout": 600.0,
    "allreduce_bucket_mb": 25.0, "allreduce_overlap": True, "horovod_compat": True,
}


@pytest.mark.parametrize("setting", openpop_settings.SETTINGS, ids=lambda s: s.field)
def test_every_setting_is_documented_and_has_its_default_when_unset(setting):
    assert setting.env.startswith("OPENPOP_") and setting.default and setting.meaning
    if setting.field == "cache_dir":
        assert openpop_settings.read("cache_dir", {}).endswith("/.cache/openpop")
    else:
        assert openpop_settings.read(setting.field, {}) == DEFAULTS[setting.field]
    assert openpop_settings.read(setting.field, {setting.env: ""}) == openpop_settings.read(setting.field, {})


@pytest.mark.parametrize("field, text, value", [
    ("device_map", "cuda:0,cpu", "cuda:0,cpu"), ("concurrent_stages", "ON", "on"), ("compile_after", "0", 0.0),
    ("compiled_unit", "regions", "regions"), ("disable_passes", " Dropout_Masks,kernel_batch,", ("dropout_masks",
                                                                                                "kernel_batch")),
    ("cache_lock_timeout", "5", 5.0), ("executable_cache", "off", False), ("executable_cache", "0", False),
    ("executable_cache_max_mb", "512", 512.0), ("lightning_hook", "False", False), ("lightning_hook", "1", True),
    ("popart_num_ipus", "8", 8), ("cache_dir", "/data", "/data"), ("collective_timeout", "30", 30.0),
    ("allreduce_bucket_mb", "0.5", 0.5), ("allreduce_overlap", "0", False), ("horovod_compat", "0", False),
])
def test_a_set_variable_is_parsed(field, text, value):
    assert openpop_settings.read(field, {openpop_settings.env(field): text}) == value


def test_a_read_sees_the_environment_now(monkeypatch):
    monkeypatch.setenv("OPENPOP_COLLECTIVE_TIMEOUT", "12")
    assert openpop_settings.read("collective_timeout") == 12.0
    monkeypatch.delenv("OPENPOP_COLLECTIVE_TIMEOUT")
    assert openpop_settings.read("collective_timeout") == 600.0


def test_a_choice_outside_its_words_names_the_variable(monkeypatch):
    monkeypatch.setenv("OPENPOP_HOST_MEMORY", "Keep")
    with pytest.raises(ValueError, match=r"^OPENPOP_HOST_MEMORY='Keep' is bad$"):
        openpop_settings.choice("host_memory", ("auto", "retain"), "{env}={value!r} is bad")
    monkeypatch.setenv("OPENPOP_HOST_MEMORY", " RETAIN ")
    assert openpop_settings.choice("host_memory", ("auto", "retain"), "{env}={value!r} is bad") == "retain"
