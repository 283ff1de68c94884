"""Several Inductor post-grad passes in the one slot Inductor has for them."""
import hashlib

from torch._inductor.custom_graph_pass import CustomGraphPass


class PostGradPasses(CustomGraphPass):
    """``passes`` run in order; the ``uuid`` (the compile caches' key) is theirs together."""

    def __init__(self, *passes):
        self.passes = passes

    def __call__(self, graph) -> None:
        for graph_pass in self.passes:
            graph_pass(graph)

    def uuid(self):
        return hashlib.sha256(repr([p.uuid() for p in self.passes]).encode()).hexdigest()

    def __reduce__(self):  # saved programs pickle Inductor's options
        return (PostGradPasses, self.passes)

    def __repr__(self):  # saved_programs.program_key hashes the options' text
        return f"PostGradPasses({', '.join(map(repr, self.passes))})"
