"""CUDA: the compiled host call replayed as a CUDA graph.

On a CUDA device the program is compiled with ``mode="reduce-overhead"``: Inductor captures the
whole step (forward, ``torch.func.grad``, gradient reduction, the functional optimizer update -
whose state tensors live on the device, i.e. capturable) into one CUDA graph, copies inputs into
static buffers it owns and replays the graph on later calls. Each host call starts a new
"step" for the graph trees (``torch.compiler.cudagraph_mark_step_begin``), so outputs of the
previous call may be overwritten only after the executor has copied them out (``assemble``
clones or concatenates every returned leaf).
"""
import torch


def uses_cuda_graphs(device: torch.device) -> bool:
    return device.type == "cuda"


def compile_options(device: torch.device) -> dict:
    """Inductor options for a program whose parameters live on ``device`` (``"reduce-overhead"``
    mode's, which ``torch.compile`` takes only without other options)."""
    return {"triton.cudagraphs": True} if uses_cuda_graphs(device) else {}


def mark_step_begin(params) -> bool:
    """Start a new CUDA-graph step before each host call on CUDA; no-op (False) elsewhere."""
    if params and params[0].is_cuda:
        torch.compiler.cudagraph_mark_step_begin()
        return True
    return False
