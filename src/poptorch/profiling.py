"""``poptorch.profiling``: served by openpop."""
from openpop.profiling import *
from openpop.profiling import Channel
