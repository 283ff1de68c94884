"""``poptorch.enums``: served by openpop."""
from openpop.enums import *  # noqa: F401,F403
from openpop import __getattr__  # noqa: F401  (deprecated AnchorMode)
