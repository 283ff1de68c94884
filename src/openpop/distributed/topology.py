"""poprun's topology table (``--print-topology=yes``): hosts, IPU-Link domains, instances and
replicas, each row's cells spanning the replicas they hold.

Layout (Graphcore's format): a label column 11 characters wide; one cell per replica, all the
same width (the widest index plus a space each side, widened until every cell of the rows above
fits its text with a space each side); a cell spanning ``k`` replicas is ``k`` replica cells and
the ``k - 1`` bars between them; text is centred, an odd leftover space going to the right.
"""
from collections.abc import Sequence

TITLE = "poprun topology"
LABEL_WIDTH = 11  # " instances "
MAX_DRAWN = 1024  # cells per row: a larger system gets one line (a table with a cell per replica would not fit)


def _centre(text: str, width: int) -> str:
    pad = width - len(text)
    left = pad // 2
    return " " * left + text + " " * (pad - left)


def _spans(count: int, parts: int) -> list[int]:
    """``count`` replicas divided evenly into ``parts`` consecutive cells."""
    return [count // parts] * parts


def topology_table(hosts: Sequence[str], num_instances: int, num_replicas: int, num_ilds: int = 1) -> str:
    """The table for ``num_instances`` instances spread evenly over ``hosts`` (one line beyond
    ``MAX_DRAWN`` replicas, instances, ILDs or hosts)."""
    if max(num_replicas, num_instances, num_ilds, len(hosts)) > MAX_DRAWN:
        return (f" {TITLE}: {len(hosts)} host(s), {num_ilds} ILD(s), {num_instances} instance(s), "
                f"{num_replicas} replicas (more than {MAX_DRAWN} to draw)\n")
    rows = [
        ("hosts", list(hosts), _spans(num_replicas, len(hosts))),
        ("ILDs", [str(i) for i in range(num_ilds)], _spans(num_replicas, num_ilds)),
        ("instances", [str(i) for i in range(num_instances)], _spans(num_replicas, num_instances)),
    ]
    cell = max(len(str(r)) for r in range(num_replicas)) + 2
    for _, texts, spans in rows:
        for text, span in zip(texts, spans):
            while span * cell + span - 1 < len(text) + 2:
                cell += 1
    data_width = num_replicas * cell + num_replicas - 1
    inner = LABEL_WIDTH + 1 + data_width

    def row(label: str, texts, spans) -> str:
        cells = [_centre(text, span * cell + span - 1) for text, span in zip(texts, spans)]
        return "|" + (" " + label).ljust(LABEL_WIDTH) + "|" + "|".join(cells) + "|"

    rule = "|" + "-" * LABEL_WIDTH + "|" + "-" * data_width + "|"
    lines = [" " + "=" * inner, "|" + _centre(TITLE, inner) + "|", "|" + "=" * inner + "|"]
    for label, texts, spans in rows:
        lines.append(row(label, texts, spans))
        lines.append(rule)
    lines.append(row("replicas", [str(r) for r in range(num_replicas)], [1] * num_replicas))
    lines.append(" " + "-" * inner)
    return "\n".join(lines) + "\n"
