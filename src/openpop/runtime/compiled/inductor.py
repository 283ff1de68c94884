"""The ``torch.compile`` backend of a program: Inductor, as ``torch.compile(options=...)`` runs it,
with one addition - ``compile()`` can compile the program without running it.

``compile()`` (``backend.py``, ``compile_ahead``) compiles by calling the program once: Dynamo
traces only when called, and a call runs what it compiled. Inside ``compiling_only()`` the
compiled graph is not run; the call returns uninitialised tensors of the graph's output shapes,
dtypes and strides (``compile_ahead`` discards them). So ``compile()`` costs Dynamo's trace and
Inductor's compile - or, from a warm executable cache, its loading - and no training step: on
BERT-base that step was a third of a cached compile (``benchmarks/RESULTS.md`` has the compile
times). The first host call then runs the program for the first time (``backend.py`` still treats
a failure of that run as a compile failure).
"""
import contextlib

import torch

from .kernel_batch import batched_kernels


class ProgramRetraced(Exception):
    """A program that has run was about to be traced again (``ProgramCompiler.locked``)."""


class ProgramCompiler:
    """``torch.compile(fn, backend=ProgramCompiler(options), ...)``: Inductor with ``options``
    (its config patches, ``torch.compile``'s ``options``); ``runs`` counts the compiled graph's runs.

    ``locked`` (set once the program has run): a new trace - torch.compile re-tracing because a
    Python value the model reads changed - raises ``ProgramRetraced`` before anything runs. What
    the program was built for came from a probe of the old trace: which parameters get a gradient
    (a parameter the new trace leaves out would be updated with a zero gradient, eager skips it),
    which buffers the forward writes, whether it draws random numbers. The backend probes the
    call: the same facts unlock the program for the new trace, others build it again
    (``backend._after_retrace``)."""

    def __init__(self, options=None):
        self.options = dict(options or {})
        self.runs = 0
        self._skip = False
        self.locked = False

    @property
    def skipping(self) -> bool:
        """Inside ``compiling_only()`` (``saved_programs.SavedProgram`` reads it too)."""
        return self._skip

    @contextlib.contextmanager
    def compiling_only(self):
        """Calls of the compiled function inside compile (or load) and return placeholders."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def __call__(self, graph, example_inputs):
        if self.locked:
            raise ProgramRetraced()
        from ...torch_compat import compile_fx
        with batched_kernels():
            compiled = compile_fx(graph, example_inputs, config_patches=self.options)
        outputs = [getattr(node, "meta", {}).get("example_value") for node in graph.graph.output_node().args[0]]
        skippable = all(isinstance(v, torch.Tensor) for v in outputs)  # else a dry call runs it
        boxed = getattr(compiled, "_boxed_call", False)  # takes its arguments as one list
        while getattr(compiled, "_torchdynamo_disable", False):  # run() is called with Dynamo's callback
            compiled = compiled._torchdynamo_orig_callable     # off already (its caller's disable, cache_hit.py)

        from ...torch_compat import functorch_config

        def run(*args):
            if self._skip and skippable:
                return tuple(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                             for v in outputs)
            self.runs += 1
            # AOTAutograd's first call checks custom ops for aliasing under a Python dispatch mode
            # around every op of every loop iteration (a while_loop of 100 000 steps: ~1 min); it
            # stays "first" while the check is off, so it is off for every call (~1 us).
            checked = functorch_config.check_custom_op_aliasing
            functorch_config.check_custom_op_aliasing = False
            try:
                return compiled(*args)
            finally:
                functorch_config.check_custom_op_aliasing = checked

        if boxed:
            run._boxed_call = True
        return run
