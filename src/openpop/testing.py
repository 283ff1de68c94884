"""``poptorch.testing``: comparison helpers for tests of PopTorch code."""
import torch


def allclose(ref, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    """``torch.allclose`` that also accepts nested tuples/lists and compares returned dtypes loosely."""
    if isinstance(ref, (list, tuple)):
        return len(ref) == len(other) and all(allclose(r, o, rtol, atol, equal_nan) for r, o in zip(ref, other))
    ref = torch.as_tensor(ref)
    other = torch.as_tensor(other).to(ref.dtype)
    return ref.shape == other.shape and torch.allclose(ref, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
