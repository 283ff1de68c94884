"""``poptorch.enums``: served by openpop."""
from openpop import __getattr__
from openpop.enums import *
