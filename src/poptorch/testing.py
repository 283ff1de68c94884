"""``poptorch.testing``: served by openpop."""
from openpop.testing import allclose
