"""torch's random generators kept as they were: after ``compile()``'s dry run, and when a program
that draws random numbers raises (as eager's rollback keeps them)."""
import contextlib

import torch


class RngState:
    """The default generators' states, put back after a dry run (dropout draws from them)."""

    def __init__(self):
        self._cpu = torch.random.get_rng_state()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._cuda = torch.cuda.get_rng_state_all() if cuda else None

    def restore(self):
        torch.random.set_rng_state(self._cpu)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)


@contextlib.contextmanager
def generators_kept_on_error(tensors):
    """A program that raises leaves torch's generators as they were (as eager's rollback does)."""
    devices = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
    saved = torch.random.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]
    try:
        yield
    except BaseException:
        torch.random.set_rng_state(saved[0])
        for device, state in zip(devices, saved[1]):
            torch.cuda.set_rng_state(state, device)
        raise
