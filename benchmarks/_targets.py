"""The performance targets openpop holds itself to, checked against the benchmarks' JSON lines.

Each target names the benchmark whose result holds the figure, how to read the figure from that
result (None when the result does not have it: the benchmark ran without that variant), and the
bound. ``run_all.py`` prints every target as met, short or not measured, in one table, and writes
it to ``RESULTS.md``. The figures are ratios measured side by side in one run, never absolute
times from another machine.
"""
from dataclasses import dataclass
from typing import Callable, Optional


def _path(*keys):
    """A reader of ``result[k0][k1]...`` (None when a key is missing)."""
    def read(result):
        value = result
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value
    return read


def _ratio(numerator, denominator):
    """A reader of ``numerator(result) / denominator(result)``."""
    def read(result):
        a, b = numerator(result), denominator(result)
        return None if a is None or not b else a / b
    return read


@dataclass(frozen=True)
class Target:
    """One bound on one benchmark figure.

    Attributes:
        name: What is measured, as the table prints it.
        benchmark: The benchmark (``benchmarks/<name>.py``) whose JSON line holds it.
        read: The figure from that JSON line, or None when the line does not have it.
        bound: The target value.
        at_least: True: the figure must be >= bound; False: <= bound.
        pending: Why the benchmark does not report the figure yet ('' once it does).
    """
    name: str
    benchmark: str
    read: Callable[[dict], Optional[float]]
    bound: float
    at_least: bool
    pending: str = ""

    def check(self, result: Optional[dict]):
        """``(figure, verdict)``: verdict "met", "short" or "not measured"."""
        figure = None if result is None else self.read(result)
        if figure is None:
            return None, "not measured"
        met = figure >= self.bound if self.at_least else figure <= self.bound
        return float(figure), "met" if met else "short"

    @property
    def bound_text(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.bound:g}"


TARGETS = [
    Target("BERT-base fp32: openpop compiled / hand-written torch.compile loop (samples/s)", "bert_throughput",
           _path("compiled_vs_hand_compiled", "fp32"), 1.0, True),
    Target("BERT-base bf16: openpop compiled / hand-written torch.compile loop (samples/s)", "bert_throughput",
           _path("compiled_vs_hand_compiled", "bf16"), 1.0, True),
    Target("tiny MLP: openpop compiled DI=256 step time / hand-compiled step time", "host_overhead",
           _ratio(_path("us_per_step", "compiled_di256"), _path("us_per_step", "hand_compiled")), 0.5, False),
    Target("small CNN (BatchNorm, dropout) DI=64: compiled step time / eager loop", "host_overhead",
           _path("cnn_ratio_vs_eager", "cnn_compiled_di64"), 0.3, False),
    Target("BERT-tiny DI=16: openpop compiled step time / hand-written torch.compile loop", "host_overhead",
           _ratio(_path("us_per_step", "bert_compiled_di16"), _path("us_per_step", "bert_hand_compiled")), 1.0, False),
    Target("scale-out: 2 instances x 1 thread vs 1 x 1, weak-scaling efficiency", "scaleout",
           _path("cpu_weak_scaling_efficiency_2_vs_1"), 0.85, True),
    Target("PopART tiny MLP: per-batch cost / hand-written torch.compile loop", "popart_overhead",
           _path("popart_vs_hand_compiled"), 1.0, False),
    Target("Graphcore's PopART sharding example: seconds for its 1 M-sample iteration", "popart_overhead",
           _path("sharding_1m_seconds"), 30.0, False),
    Target("BERT-base peak RSS: openpop / hand-written loop", "memory",
           _path("peak_rss_vs_hand"), 1.1, False),
    Target("IPUStrategy DI=64: samples/s / Lightning's own CPU loop", "lightning_overhead",
           _path("ratio_vs_lightning_cpu", "ipu_compiled_di64"), 3.0, True),
    Target("eager step after another model compiled in the process / before (worse of openpop eager, torch loop)",
           "eager_after_compile", _path("worst_step_ratio"), 1.05, False),
]


# What run_all.py gives a benchmark so that its JSON line holds every target's figure: arguments
# its defaults leave out (the slow variants), and the seconds it may take (over run_all's --timeout).
RUN_ARGUMENTS = {"bert_throughput": ("--compiled", "--hand-compiled", "--rounds", "2")}
RUN_SECONDS = {"bert_throughput": 3600}


def benchmarks() -> list:
    """The benchmarks the targets read, in the order of ``TARGETS``."""
    return list(dict.fromkeys(target.benchmark for target in TARGETS))


def check_all(results: dict) -> list:
    """Per target ``(target, figure, verdict)``; ``results``: benchmark name -> its JSON line (or None)."""
    return [(target, *target.check(results.get(target.benchmark))) for target in TARGETS]


def markdown(rows) -> str:
    lines = ["| target | benchmark | figure | bound | verdict |", "|---|---|---|---|---|"]
    for target, figure, verdict in rows:
        shown = "-" if figure is None else f"{figure:.3g}"
        lines.append(f"| {target.name} | {target.benchmark} | {shown} | {target.bound_text} | {verdict} |")
    return "\n".join(lines)
