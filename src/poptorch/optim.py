"""``poptorch.optim``: served by openpop."""
from openpop.optim import *  # noqa: F401,F403
