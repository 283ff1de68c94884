"""The compiled backend: a host call as one ``torch.compile``d program, or its regions compiled.

* ``selection.py``       auto | eager | compiled, and the ski-rental rule of ``auto``
* ``compile_cost.py``    ``auto``'s estimate of what compiling a program costs (calibrated constants)
* ``eligibility.py``     what cannot be compiled exactly, found before compiling
* ``functional_optim.py`` the optimizer's update (``optim/updates.py``) as a pure function of tensors
* ``program.py``         DI x GA x R micro-batches, gradients, update, outputs, compiled
* ``regions.py``          the other unit: the model's blocks compiled, the host call eager
* ``cuda_graphs.py``     CUDA graph capture of the program on GPUs
* ``arguments.py``       the program's parameter and input arguments, resolved once per program
* ``backend.py``         ``CompiledBackend``: the ``Backend`` (``backend_contract.py``) ``dispatch.py`` asks
* ``repeat_call.py``     the executor's fast path for a host call like the last compiled one
* ``functorch_state.py`` a compiled call leaves no empty functorch state on its thread

What front-ends use (Lightning's step module and step hooks, the BERT app) is exported here;
they import nothing else from this package.
"""
from ..backend_contract import DECLINED, REGIONS
from . import step_hooks
from .backend import CompiledBackend
from .eligibility import Ineligible
from .selection import backend_from_env

__all__ = ["DECLINED", "REGIONS", "CompiledBackend", "Ineligible", "backend_from_env", "step_hooks"]
