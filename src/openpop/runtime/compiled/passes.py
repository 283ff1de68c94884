"""openpop's additions to Inductor (and one to Dynamo, ``flat_operands``), in one registry: each
with its switch, its probe and its fallback.

Each pass changes how a compiled program or region computes, never what: its results equal the
fallback's (bit for bit, or within the rounding of another summation order, as the pass's module
says). ``PASSES`` lists them; ``active(name)`` is what the compiled backend asks before installing
one: the pass is on unless its switch turns it off (``OPENPOP_DISABLE_PASSES``, and the pass's own
setting where it has one) and its probe finds it applies on this machine (or torch). Where it is
off, the fallback - torch's own path - runs.

The documentation's page (``docs/reference/inductor-passes.md``) is generated from ``PASSES``:

    python -m openpop.runtime.compiled.passes --write    # rewrite the page
    python -m openpop.runtime.compiled.passes --check    # exit status 1 if it is out of date
"""
import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from ... import openpop_settings
from .. import messages

DISABLE_ENV = openpop_settings.env("disable_passes")
PAGE = Path(__file__).resolve().parents[4] / "docs" / "reference" / "inductor-passes.md"



@dataclass(frozen=True)
class InductorPass:
    """One pass: ``name`` (the module in ``runtime/compiled`` that defines it), what it does and
    where it applies, ``switch`` (settings that turn it off, in words), ``probe`` (``"function"`` of
    that module returning whether the pass applies here; ``""`` for none) and what it checks, and
    ``fallback``: what runs where the pass does not."""

    name: str
    does: str
    where: str
    switch: str
    probe: str
    probe_checks: str
    fallback: str

    def probed(self) -> bool:
        if not self.probe:
            return True
        module = importlib.import_module(f"{__package__}.{self.name}")
        return bool(getattr(module, self.probe)())


PASSES = (
    InductorPass(
        "attention_backward",
        "the backward of short attention (score matrices of at most 128 x 128 per head) as tensor math "
        "that Inductor fuses, instead of aten's flash-attention backward kernel: ~2x faster forward and "
        "backward at BERT-base's shape in bfloat16",
        "CPU training programs and regions (Inductor's `post_grad_custom_pre_pass`)",
        f"`{DISABLE_ENV}=attention_backward`",
        "", "none: it rewrites every eligible op",
        "aten's `_scaled_dot_product_flash_attention_for_cpu_backward` kernel"),
    InductorPass(
        "dropout_masks",
        "CPU dropout masks drawn by a vectorised Mersenne Twister kernel, bit for bit as aten's serial "
        "`bernoulli_` draws them (~10x faster), continuing torch's default CPU generator",
        "CPU training regions (Inductor's `post_grad_custom_post_pass`)",
        f"`{DISABLE_ENV}=dropout_masks`",
        "draws_like_aten", "the kernel builds (a C++ compiler) and its masks and the generator's state "
        "after them equal aten's `bernoulli_` on this machine (once per process)",
        "aten's `native_dropout` kernel"),
    InductorPass(
        "onednn_matmuls",
        "large float32 CPU matrix products (`mm`, `addmm`) on oneDNN's GEMM where this CPU runs it faster "
        "than the BLAS torch was built with (~2x on AMD CPUs)",
        "CPU regions (Inductor's `post_grad_custom_post_pass`)",
        f"`{DISABLE_ENV}=onednn_matmuls` or `OPENPOP_CPU_GEMM=aten` (`onednn` forces it)",
        "uses_onednn", "`OPENPOP_CPU_GEMM=auto`: oneDNN is available and at least 1.25x faster than aten's "
        "GEMM on one probe shape (measured once per machine)",
        "aten's `mm`/`addmm` (torch's BLAS)"),
    InductorPass(
        "kernel_batch",
        "the C++ kernels of one generated module built by one compiler run per compile thread instead of "
        "one run per kernel (a BERT program's 30-60 kernels: most of the compiler's time was per-run cost)",
        "every Inductor compile and saved-program load on the CPU (`inductor.ProgramCompiler`, `saved_programs`)",
        f"`{DISABLE_ENV}=kernel_batch`",
        "", "none: a kernel of a shape it does not expect, and every kernel when a batch fails to build, "
        "is built by Inductor as before",
        "Inductor's own build, one library per kernel (`AsyncCompile.cpp_pybinding`)"),
    InductorPass(
        "flat_operands",
        "a Dynamo pass, not an Inductor one: while a program is traced, Dynamo flattens the flat tuples of "
        "tensors its loops carry (`while_loop`'s operands and results) directly, instead of inlining "
        "pytree's Python for every carried tensor; the same graph, built in ~2/3 of the time where the "
        "graphs are cached",
        "every program's trace through Dynamo (`Program`'s calls; higher-order ops of the model traced "
        "with it too)",
        f"`{DISABLE_ENV}=flat_operands`",
        "applies", "the Dynamo function it replaces (`higher_order_ops._make_inlined`) and the variable "
        "classes it builds exist in this torch",
        "Dynamo's inlined `torch.utils._pytree`; also for any operand that is not a flat list or tuple of tensors"),
)

_BY_NAME = {p.name: p for p in PASSES}


def disabled() -> frozenset:
    """The passes ``OPENPOP_DISABLE_PASSES`` turns off (a ``ValueError`` naming the known ones for
    any other name)."""
    raw = openpop_settings.raw("disable_passes")
    names = set(openpop_settings.read("disable_passes"))
    unknown = sorted(names - set(_BY_NAME))
    if unknown:
        raise ValueError(messages.UNKNOWN_PASS.format(env=DISABLE_ENV, value=raw, unknown=", ".join(unknown),
                                             known=", ".join(_BY_NAME)))
    return frozenset(names)


def switched_on(name: str) -> bool:
    """Whether ``name``'s switch leaves it on (its probe not asked)."""
    if name not in _BY_NAME:
        raise KeyError(name)
    return name not in disabled()


def active(name: str) -> bool:
    """Whether the pass ``name`` runs here: its switch on and its probe passed."""
    return switched_on(name) and _BY_NAME[name].probed()


def reference_page() -> str:
    lines = [
        "# Inductor passes",
        "",
        "<!-- Generated by `python -m openpop.runtime.compiled.passes --write` from "
        "`openpop/runtime/compiled/passes.py`; do not edit by hand. -->",
        "",
        "The compiled backend (see [the guide](../guides/compiled-backend.md)) adds a few passes to "
        "Inductor, and one to Dynamo (`flat_operands`). Each computes what torch's own path computes - "
        "bit for bit, or within the rounding of another summation order - only faster. Each has a "
        "switch that turns it off, a probe that checks it applies on this machine and this torch, "
        "and a fallback: torch's own path, which runs wherever the pass does not.",
        "",
        f"`{DISABLE_ENV}` takes a comma-separated list of the names below "
        f"(`{DISABLE_ENV}=dropout_masks,kernel_batch`); another name is an error that lists them. "
        "A pass's code is part of the keys of torch's compile caches, so programs compiled with a pass "
        "are not loaded without it, and the other way round.",
        "",
        "The private torch names the passes use are listed, with the torch versions they were checked "
        "on, in `openpop/torch_compat.py`.",
        "",
    ]
    for p in PASSES:
        lines += [
            f"## {p.name}",
            "",
            p.does[0].upper() + p.does[1:] + ".",
            "",
            f"- **Where:** {p.where}; `openpop/runtime/compiled/{p.name}.py`.",
            f"- **Switch:** {p.switch}.",
            f"- **Probe:** {p.probe_checks}" + (f" (`{p.probe}()`)." if p.probe else "."),
            f"- **Fallback:** {p.fallback}.",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openpop.runtime.compiled.passes",
                                     description="The reference page of openpop's Inductor passes.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"rewrite {PAGE.name}")
    group.add_argument("--check", action="store_true", help=f"exit status 1 if {PAGE.name} is out of date")
    args = parser.parse_args(argv)
    page = reference_page()
    if args.write:
        PAGE.write_text(page)
        return 0
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE} is out of date: run python -m openpop.runtime.compiled.passes --write", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
