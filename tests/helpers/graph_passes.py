"""Inductor post-grad passes observed in tests."""
import uuid


def recorded(pass_class, graphs: list):
    """An instance of ``pass_class`` that appends each graph it rewrote to ``graphs``; its uuid is
    new, so torch's compile caches miss and the pass runs."""

    class Recorded(pass_class):
        def __call__(self, graph):
            super().__call__(graph)
            graphs.append(graph)

        def uuid(self):
            return f"recorded-{uuid.uuid4()}"

    return Recorded()
