"""The one error type of ``openpop-k8s``: a manifest or command that cannot be used."""


class ManifestError(ValueError):
    """Bad input, named by the path of the offending field (``spec.workers.template``).

    The command line reports it as ``openpop-k8s: error: <path>: <reason>`` and exits
    with code 2, having written nothing to stdout.
    """

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


def join_path(base, key):
    """``spec`` + ``workers`` -> ``spec.workers``; list indices as ``containers[0]``."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else str(key)
