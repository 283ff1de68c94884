"""``poptorch.poptorch_core``: the exception classes PopTorch's C++ core exported."""
from openpop.errors import Error, RecoverableError, UnrecoverableError
