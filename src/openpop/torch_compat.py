"""Every private torch name openpop uses, in one place, with the torch versions it was checked on.

torch's private modules and names (``torch._dynamo``, ``torch._inductor``, ``torch._C._...``,
``torch.utils._pytree``, ``torch.ops.mkldnn._linear_pointwise``...) change between torch's minor
versions without notice. openpop reaches them only through this module (``tests/test_torch_compat.py``
fails on a private torch name anywhere else in ``src/openpop``), so a new torch is one file to check:
``PRIVATE`` lists each name with what openpop uses it for and the minor versions it was checked on
(``torch_version.CHECKED``, where the whole suite passes; ``tests/test_torch_compat.py`` resolves
every entry on the installed torch).

    from openpop.torch_compat import pytree, while_loop   # resolved when the importer is imported
    from openpop import torch_compat
    torch_compat.compile_fx(...)                          # resolved at first use (Dynamo, Inductor)

A name is imported when first read (``__getattr__``): naming Inductor's or Dynamo's here costs
nothing until a compiled program needs them (importing Dynamo takes seconds). Where openpop needs
a value read at each use (a flag torch flips), this module has a function instead.

The range of torch versions openpop accepts at all is ``torch_version.py``'s, checked at import.
"""
import importlib
import sys
from dataclasses import dataclass

import torch

from . import errors
from .torch_version import CHECKED

_CHECKED = tuple(".".join(map(str, version)) for version in CHECKED)


@dataclass(frozen=True)
class Private:
    """One private torch name: ``name`` (openpop's, read as ``torch_compat.<name>``) stands for
    ``path`` - ``"module"`` or ``"module:attribute.chain"`` - used for ``use``; ``checked`` are the
    torch minor versions it was checked on."""

    name: str
    path: str
    use: str
    checked: tuple = _CHECKED

    def resolve(self):
        module_name, _, attributes = self.path.partition(":")
        value = importlib.import_module(module_name)
        for attribute in filter(None, attributes.split(".")):
            value = getattr(value, attribute)
        return value


_FOREACH_OPS = ("add", "add_", "addcdiv_", "addcmul", "addcmul_", "copy_", "div", "div_", "lerp_", "mul",
                "mul_", "neg", "norm", "sqrt", "sqrt_", "sub_")

PRIVATE = (
    # --- torch's own utilities, imported by torch itself ------------------------------------------
    Private("pytree", "torch.utils._pytree", "flattening nested arguments and outputs (every module)"),
    Private("TorchDispatchMode", "torch.utils._python_dispatch:TorchDispatchMode",
            "dispatch modes: shapes-only runs, compile cost counting, saved programs, the plan's probes"),
    Private("disable_current_modes", "torch.utils._python_dispatch:_disable_current_modes",
            "measuring and probing while a user's (or Dynamo's) mode is active"),
    Private("get_current_function_mode_stack", "torch.overrides:_get_current_function_mode_stack",
            "the torch function modes a pipeline stage's thread inherits"),
    Private("DisableTorchFunction", "torch._C:DisableTorchFunction", "half-precision measurements"),
    Private("NN_FUNCTIONS_MODULE", "torch._C._nn:__name__",
            "the ``__module__`` of ``torch.nn.functional``'s C++ functions (op names in messages)"),
    Private("FakeTensor", "torch._subclasses.fake_tensor:FakeTensor", "outputs of shapes-only runs"),
    Private("FakeTensorMode", "torch._subclasses.fake_tensor:FakeTensorMode", "shapes-only runs, saved programs"),
    Private("OpOverload", "torch._ops:OpOverload", "aten ops in graph passes (float16 saturation)"),
    Private("while_loop", "torch._higher_order_ops:while_loop", "loops over steps and micro-batches in programs"),
    Private("while_loop_op", "torch._higher_order_ops.while_loop:while_loop_op",
            "the loop operator itself, called with flat operands (``compiled/flat_loop.py``)"),
    Private("NormBase", "torch.nn.modules.batchnorm:_NormBase", "batch norms in training (compile eligibility)"),
    Private("nn_module_globals", "torch.nn.modules.module",
            "global module hooks (``_global_forward_hooks``...; compile eligibility)"),
    Private("format_tensor", "torch._tensor_str:_tensor_str", "ipu_print_tensor's text"),
    Private("PRINT_OPTS", "torch._tensor_str:PRINT_OPTS", "ipu_print_tensor's print options"),
    Private("set_grad_enabled", "torch._C:_set_grad_enabled", "grad mode without a context object per call"),
    Private("top_saved_tensors_default_hooks", "torch._C._autograd:_top_saved_tensors_default_hooks",
            "saved-tensor hooks (compile eligibility)"),
    Private("has_internal_overlap", "torch:_debug_has_internal_overlap", "inputs whose elements share memory"),
    Private("amp_foreach_non_finite_check_and_unscale_", "torch:_amp_foreach_non_finite_check_and_unscale_",
            "loss scaling's unscale and overflow check"),
    *(Private(f"foreach_{op}", f"torch:_foreach_{op}", "multi-tensor kernels (torch.optim's own)")
      for op in _FOREACH_OPS),
    Private("functional_all_reduce", "torch.distributed._functional_collectives:all_reduce",
            "the gradient all-reduce between processes (popdist) inside a compiled program"),
    Private("ExperimentalProfilerConfig", "torch._C._profiler:_ExperimentalConfig",
            "profiling every thread (trace)"),
    # --- kernels ------------------------------------------------------------------------------------
    Private("flash_attention_cpu_backward",
            "torch:ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
            "the op the attention_backward pass replaces"),
    Private("mkldnn_linear_pointwise", "torch:ops.mkldnn._linear_pointwise", "oneDNN's GEMM (onednn_matmuls)"),
    # --- Dynamo -----------------------------------------------------------------------------------
    Private("dynamo_config", "torch._dynamo.config", "recompile limits of fused updates"),
    Private("dynamo_eval_frame", "torch._dynamo.eval_frame", "cache entries of compiled code (cache_hit)"),
    Private("dynamo_c_eval_frame", "torch._C._dynamo.eval_frame", "cache entries of compiled code (cache_hit)"),
    Private("debug_get_cache_entry_list", "torch._dynamo.eval_frame:_debug_get_cache_entry_list",
            "dropping a program's compiled code"),
    Private("remove_from_cache", "torch._dynamo.eval_frame:remove_from_cache", "dropping a program's compiled code"),
    Private("dynamo_side_effects_allowed",
            "torch._dynamo.utils:_disable_side_effect_safety_checks_for_current_subtracer",
            "a forward's assignments to its modules' tensors inside a program's loops (assigned_slots)"),
    Private("FailOnRecompileLimitHit", "torch._dynamo.exc:FailOnRecompileLimitHit",
            "a saved program with assigned slots whose values changed (declined as past the recompile limit)"),
    Private("dynamo_higher_order_ops", "torch._dynamo.variables.higher_order_ops",
            "flattening a program's loop operands without traced pytree (flat_operands)"),
    Private("dynamo_ListVariable", "torch._dynamo.variables.lists:ListVariable", "flat_operands"),
    Private("dynamo_TupleVariable", "torch._dynamo.variables.lists:TupleVariable", "flat_operands"),
    Private("dynamo_SourcelessBuilder", "torch._dynamo.variables.builder:SourcelessBuilder", "flat_operands"),
    Private("dynamo_counters", "torch._dynamo.utils:counters", "cache hits and fresh compiles"),
    Private("get_metrics_context", "torch._dynamo.utils:get_metrics_context", "saved programs"),
    Private("AOTCompiledFunction", "torch._dynamo.aot_compile:AOTCompiledFunction", "saved programs"),
    Private("get_compile_id", "torch._dynamo.convert_frame:get_compile_id", "saved programs"),
    Private("CompileContext", "torch._guards:CompileContext", "saved programs"),
    Private("TracingContext", "torch._guards:TracingContext", "saved programs"),
    Private("compile_context", "torch._guards:compile_context", "saved programs"),
    Private("tracing", "torch._guards:tracing", "saved programs"),
    # --- AOTAutograd, Inductor ---------------------------------------------------------------------
    Private("functorch_config", "torch._functorch.config",
            "the AOTAutograd cache (executable cache); its first call's custom-op aliasing check (inductor)"),
    Private("inductor_config", "torch._inductor.config", "the FX-graph cache (executable cache)"),
    Private("clear_inductor_caches", "torch._inductor.utils:clear_caches", "moving the executable cache"),
    Private("VecISA", "torch._inductor.cpu_vec_isa:VecISA", "remembering Inductor's ISA probes"),
    Private("compile_fx", "torch._inductor.compile_fx:compile_fx", "compiling a program's graph"),
    Private("CustomGraphPass", "torch._inductor.custom_graph_pass:CustomGraphPass", "openpop's Inductor passes"),
    Private("get_hash_for_files", "torch._inductor.custom_graph_pass:get_hash_for_files",
            "the cache keys of openpop's Inductor passes"),
    Private("fwd_only", "torch._inductor.pattern_matcher:fwd_only", "tracing attention_backward's replacement"),
    Private("AsyncCompile", "torch._inductor.async_compile:AsyncCompile", "kernel_batch (patched while compiling)"),
    Private("get_compile_threads", "torch._inductor.async_compile:get_compile_threads", "kernel_batch"),
    Private("CppPythonBindingsCodeCache", "torch._inductor.codecache:CppPythonBindingsCodeCache", "kernel_batch"),
    Private("CppCodeCache", "torch._inductor.codecache:CppCodeCache", "dropout_masks' kernel"),
    # --- functorch's per-thread state, dropped after a compiled call (runtime/compiled/functorch_state.py)
    Private("functorch_layer_depth", "torch._C._functorch:get_dynamic_layer_stack_depth",
            "functorch_state: no transform on the thread's stack"),
    Private("functorch_inplace_requires_grad_allowed", "torch._C._functorch:get_inplace_requires_grad_allowed",
            "functorch_state: the flag at its default"),
    Private("functorch_single_level_function_allowed",
            "torch._C._functorch:get_single_level_autograd_function_allowed",
            "functorch_state: the flag at its default"),
)

_BY_NAME = {private.name: private for private in PRIVATE}


def __getattr__(name: str):
    private = _BY_NAME.get(name)
    if private is None:
        raise AttributeError(errors.NO_PRIVATE_NAME.format(module=__name__, name=name))
    value = private.resolve()
    globals()[name] = value  # (resolved once)
    return value


def __dir__():
    return sorted(set(globals()) | set(_BY_NAME))


def profiler_enabled() -> bool:
    """Whether a ``torch.profiler`` session runs in this process: torch's Python flag (every
    profiler started from Python) or its C++ one."""
    return bool(torch.autograd.profiler._is_profiler_enabled) or torch._C._autograd._profiler_enabled()


def dynamo_loaded() -> bool:
    """Whether Dynamo is imported (its counters exist; importing it takes seconds)."""
    return "torch._dynamo.utils" in sys.modules


def global_module_hooks(kind: str) -> dict:
    """The hooks registered on every module, of ``kind`` (``"_forward_hooks"``...): ``{}`` where
    this torch has none of that kind."""
    return getattr(_BY_NAME["nn_module_globals"].resolve(), "_global" + kind, {})
