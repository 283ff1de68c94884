"""``poptorch.optim``: served by openpop."""
from openpop.optim import *
