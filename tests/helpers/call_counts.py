"""Counting what a call runs (``sys.setprofile``), for tests that hold a path to "the same work as
before" without timing it: a declined compile must leave the eager host call as it was."""
import collections
import sys


def calls_made(call, c_functions: bool = False) -> collections.Counter:
    """The Python functions ``call()`` runs, by ``(file, function)``; with ``c_functions`` also the C
    functions it calls (torch's ops, builtins), by ``("C", name)``.

    torch's optimizers wrap helpers in ``torch._disable_dynamo``, which goes through Dynamo's
    ``disable`` (``eval_frame.py``, ``is_exporting``) on each call once Dynamo has been imported (by
    any compile, a user's own too): those frames are torch's, not a declined compile's leftovers,
    and are left out. The first ``torch.compile`` in a process (any, a user's own too) wraps every
    ``torch.optim`` class's ``_init_group`` the same way (Dynamo's ``TorchPatcher.patch``): one more
    such wrapper per optimizer step from then on, its frames left out too; ``c_functions`` counts
    its C calls (``set_eval_frame``, ``getattr``)."""
    counts = collections.Counter()

    def profile(frame, event, arg):
        if event == "c_call":
            if c_functions:
                counts[("C", getattr(arg, "__qualname__", repr(arg)))] += 1
            return
        name = (frame.f_code.co_filename, frame.f_code.co_name)
        if event == "call" and not name[0].endswith("eval_frame.py") and name[1] != "is_exporting":
            counts[name] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return counts
