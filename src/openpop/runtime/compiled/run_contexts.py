"""Contexts a compiled call runs in: the model in the train/eval modes it was compiled in, and
torch's own warnings ignored while torch.compile compiles."""
import contextlib
import warnings


@contextlib.contextmanager
def compiled_modes(changed):
    """The model runs in the train/eval mode it was compiled in (as the eager backend does):
    ``changed``, the modules in the other mode, switch for the call."""
    for module in changed:
        module.training = not module.training
    try:
        yield
    finally:
        for module in changed:
            module.training = not module.training


@contextlib.contextmanager
def torch_warnings_ignored():
    """Compiling imports and runs parts of torch that warn (deprecations): not the user's
    business, and under a user's ``warnings.simplefilter("error")`` they would fail the compile."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")
        yield
