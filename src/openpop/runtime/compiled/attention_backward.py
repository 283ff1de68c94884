"""The backward of short CPU attention as tensor math inside a compiled program.

On CPU, ``F.scaled_dot_product_attention`` runs aten's flash kernel, and Inductor calls it as an
opaque kernel in both directions. Its backward is slow for short sequences in half precision:
at BERT-base's shape (batch 8, 12 heads, 128 tokens, head size 64, bfloat16) forward and
backward take ~26 ms, of which the forward ~1.4 ms: a sixth of a compiled bfloat16 training step
(``benchmarks/bert_throughput.py``). The same gradients written as matrix products over the
saved output and logsumexp (the standard flash-attention backward, in float32) bring forward and
backward to ~12 ms once Inductor fuses the element-wise part, with equal or smaller error
against float64 autograd; float32 ~12 -> ~11 ms. At 256 tokens the kernel is as fast, beyond
it faster, and its memory stays linear in the sequence, so only score matrices of at most
``MAX_SCORES`` elements per head are rewritten (AMX Xeon, 2 threads, torch 2.13; ``benchmarks/RESULTS.md``
has the BERT-base steps).

``ShortAttentionBackward`` is an Inductor post-grad pass (``post_grad_custom_pre_pass``, set by
``program_options.compile_kwargs`` for CPU training programs): it replaces each eligible
``_scaled_dot_product_flash_attention_for_cpu_backward`` node, in the graph and in its
``while_loop`` bodies, by the traced ``attention_backward``. Its ``uuid`` (this file's hash)
enters the keys of torch's FX-graph and AOTAutograd caches, so programs compiled without it are
not loaded in its place. Not rewritten: dropout inside the attention (the mask is the kernel's
own), grouped-query attention, longer sequences.
"""
import operator

import torch

from ...torch_compat import flash_attention_cpu_backward
from .graph_pass import SourceKeyedPass

MAX_SCORES = 128 * 128
FLASH_BACKWARD = flash_attention_cpu_backward


def attention_backward(grad_out, query, key, value, out, logsumexp, is_causal=False, attn_mask=None, scale=None):
    """Gradients of ``softmax(q k^T * scale + mask) v`` with respect to q, k and v, from the
    forward's output and (natural-log) row logsumexp, computed in float32."""
    f = torch.float32
    scale = query.size(-1) ** -0.5 if scale is None else scale
    q, k, v, o, do = (t.to(f) for t in (query, key, value, out, grad_out))
    scores = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        length, keys = scores.shape[-2:]
        # torch's convention (the kernel's too): query i sees keys 0..i, aligned top-left when L != S
        hidden = torch.ones(length, keys, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    if attn_mask is not None:  # additive, the query's dtype (the kernel's; SDPA turns boolean masks into -inf)
        scores = scores + attn_mask.to(f)
    lse = logsumexp.to(f).unsqueeze(-1)
    probs = torch.exp(scores - lse).masked_fill(torch.isneginf(lse), 0.0)  # fully masked rows: no gradient
    grad_value = probs.transpose(-2, -1) @ do
    grad_probs = do @ v.transpose(-2, -1)
    grad_scores = probs * (grad_probs - (do * o).sum(-1, keepdim=True))
    grad_query = (grad_scores @ k) * scale
    grad_key = (grad_scores.transpose(-2, -1) @ q) * scale
    return grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype)


def _arguments(node):
    """``(tensors, their fake values, constants)`` of a flash-backward node, or ``None`` if it is
    not rewritten."""
    args = list(node.args) + [None] * (8 - len(node.args))
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal = args[:8]
    mask, scale = node.kwargs.get("attn_mask"), node.kwargs.get("scale")
    tensors = [grad_out, query, key, value, out, logsumexp] + ([mask] if mask is not None else [])
    values = [getattr(t, "meta", {}).get("val") for t in tensors]
    if any(not isinstance(v, torch.Tensor) for v in values) or dropout_p:
        return None
    q, k = values[1], values[2]
    if q.dim() != 4 or k.dim() != 4 or q.size(1) != k.size(1) or q.device.type != "cpu":
        return None
    if q.size(-2) * k.size(-2) > MAX_SCORES:
        return None
    return tensors, values, {"is_causal": bool(is_causal), "scale": scale, "masked": mask is not None}


def _rewrite(module) -> bool:
    """Rewrite the eligible nodes of ``module``'s graph in place; True if any was."""
    from ...torch_compat import fwd_only
    graph, changed = module.graph, False
    for node in list(graph.find_nodes(op="call_function", target=FLASH_BACKWARD)):
        found = _arguments(node)
        if found is None:
            continue
        tensors, values, constants = found

        def backward(*ts, constants=constants):
            mask = ts[6] if constants["masked"] else None
            return attention_backward(*ts[:6], is_causal=constants["is_causal"], attn_mask=mask,
                                      scale=constants["scale"])

        with values[0].fake_mode:  # the graph's: constants the trace creates are fake too
            traced = fwd_only(backward, values)
        placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
        with graph.inserting_before(node):
            results = graph.graph_copy(traced.graph, dict(zip(placeholders, tensors)))
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
        if node.users:  # used whole (not expected from AOTAutograd): keep the kernel
            continue
        graph.erase_node(node)
        changed = True
    return changed


class ShortAttentionBackward(SourceKeyedPass):
    """Inductor post-grad pass: the flash backward of short CPU attention as tensor math (module
    docstring), in the graph and its subgraphs (``while_loop`` bodies)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        root = graph.owning_module
        if root is None:
            return
        for module in [m for m in root.modules() if isinstance(m, torch.fx.GraphModule)]:
            if _rewrite(module):  # only then: dead code of the unused gradients (Inductor's own pass runs none)
                module.graph.eliminate_dead_code()
                if module is not root:
                    module.recompile()
