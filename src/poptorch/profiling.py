"""``poptorch.profiling``: served by openpop."""
from openpop.profiling import *  # noqa: F401,F403
from openpop.profiling import Channel  # noqa: F401
