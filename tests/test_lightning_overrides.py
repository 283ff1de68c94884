"""Every ``IPUStrategy`` method that overrides a Lightning ``Strategy`` method says so with
``@override`` (``typing_extensions``), so a hook renamed in Lightning is visible in review."""
import inspect

import pytest

pytest.importorskip("lightning.pytorch")

from openpop.lightning import IPUStrategy


def _functions(value):
    if isinstance(value, (classmethod, staticmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    return [value] if inspect.isfunction(value) else []


def _overriding_names():
    bases = IPUStrategy.__mro__[1:]
    return sorted(name for name, value in vars(IPUStrategy).items()
                  if not (name.startswith("__") and name.endswith("__")) and _functions(value)
                  and any(name in vars(base) for base in bases))


def test_the_strategy_overrides_lightnings_loop_hooks():
    assert {"setup", "teardown", "training_step", "validation_step", "predict_step", "backward", "optimizer_step",
            "process_dataloader", "root_device", "register_strategies", "reduce"} <= set(_overriding_names())


@pytest.mark.parametrize("name", _overriding_names())
def test_overriding_method_is_marked(name):
    functions = _functions(vars(IPUStrategy)[name])
    assert functions and all(getattr(f, "__override__", False) for f in functions), \
        f"IPUStrategy.{name} overrides a base method: mark it with @override"


def test_methods_of_its_own_are_not_marked():
    bases = IPUStrategy.__mro__[1:]
    own = [name for name, value in vars(IPUStrategy).items()
           if _functions(value) and not any(name in vars(base) for base in bases)]
    assert "training_opts" in own and "_host_call" in own
    assert not [name for name in own
                if any(getattr(f, "__override__", False) for f in _functions(vars(IPUStrategy)[name]))]
