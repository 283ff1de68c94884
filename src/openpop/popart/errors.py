"""PopART's exception types. ``popart_exception`` is what PopART raised for bad input;
``poplar_exception`` stands for the (here: torch) backend's errors."""


class popart_exception(RuntimeError):
    pass


class poplar_exception(RuntimeError):
    pass


class popart_internal_exception(popart_exception):
    pass


class OutOfMemoryException(popart_exception):
    """Raised by ``prepareDevice`` when the model does not fit (never on CPUs/GPUs here)."""

    def getSummaryReport(self) -> str:
        return ""

    def getProfilePath(self) -> str:
        return ""
