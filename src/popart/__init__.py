"""PopART's API, served by openpop. This package only re-exports ``openpop.popart``."""
from openpop.popart import *  # noqa: F403
from openpop.popart import (
                            __version__,
                            getLogger,
                            getSupportedOperations,
                            reservedGradientPrefix,
                            reservedUpdatedVarPrefix,
)
