"""The base of openpop's Inductor post-grad passes: keyed by the source file that defines them."""
import sys

from ...torch_compat import CustomGraphPass, get_hash_for_files


class SourceKeyedPass(CustomGraphPass):
    """A ``CustomGraphPass`` without arguments whose ``uuid`` is the hash of its module's file, so
    torch's FX-graph and AOTAutograd caches miss when the pass's code changes."""

    def uuid(self):
        return get_hash_for_files((sys.modules[type(self).__module__].__file__,))

    def __reduce__(self):  # saved programs pickle Inductor's options
        return (type(self), ())

    def __repr__(self):  # saved_programs.program_key hashes the options' text
        return f"{type(self).__name__}()"
