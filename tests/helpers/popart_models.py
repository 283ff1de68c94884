"""Builder-made models and their plain-PyTorch twins for the PopART tests."""
import numpy as np
import torch

import popart


def mlp_weights(seed=0, sizes=(8, 16, 4)):
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        weights.append(((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
                        (rng.standard_normal(fan_out) * 0.1).astype(np.float32)))
    return weights


def build_mlp(micro_batch, weights, *, vgraphs=False, stages=False):
    """x[mb, 8] -> matmul/add/relu -> matmul/add -> softmax -> nll(labels) (Mean)."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [micro_batch, weights[0][0].shape[0]]), "x")
    labels = builder.addInputTensor(popart.TensorInfo("INT32", [micro_batch]), "labels")
    ids = []
    h = x
    for k, (w, b) in enumerate(weights):
        scope = []
        if vgraphs:
            scope.append(builder.virtualGraph(k))
        if stages:
            scope.append(builder.pipelineStage(k))
        for s in scope:
            s.__enter__()
        w_id = builder.addInitializedInputTensor(w, f"w{k}")
        b_id = builder.addInitializedInputTensor(b, f"b{k}")
        ids += [w_id, b_id]
        h = builder.aiOnnx.add([builder.aiOnnx.matmul([h, w_id]), b_id])
        if k < len(weights) - 1:
            h = builder.aiOnnx.relu([h])
        else:
            probs = builder.aiOnnx.softmax([h], axis=1, debugContext="probs")
            loss = builder.aiGraphcore.nllloss([probs, labels], reduction=popart.ReductionType.Mean)
        for s in reversed(scope):
            s.__exit__(None, None, None)
    return builder, x, labels, probs, loss, ids


def torch_mlp_loss(params, x, labels):
    h = x
    n = len(params) // 2
    for k in range(n):
        h = h @ params[2 * k] + params[2 * k + 1]
        if k < n - 1:
            h = torch.relu(h)
    return torch.nn.functional.nll_loss(torch.log(torch.softmax(h, dim=1)), labels.long())


def torch_reference_training(weights, data, labels, *, bps, accl, repl, make_optimizer, reduction="sum"):
    """Hand-written loop: per step, accl*repl micro-batches, gradients summed (PopART's default)
    or averaged, then one optimizer step. Returns (per-micro-batch losses [bps, accl, repl],
    final params)."""
    params = [torch.tensor(a, requires_grad=True) for wb in weights for a in wb]
    optimizer = make_optimizer(params)
    mb = data.shape[-2]
    xs = torch.from_numpy(data.reshape(bps, accl, repl, mb, -1))
    ys = torch.from_numpy(labels.reshape(bps, accl, repl, mb))
    losses = torch.zeros(bps, accl, repl)
    for d in range(bps):
        optimizer.zero_grad()
        for g in range(accl):
            for r in range(repl):
                loss = torch_mlp_loss(params, xs[d, g, r], ys[d, g, r])
                losses[d, g, r] = loss.detach()
                (loss / (accl * repl) if reduction == "mean" else loss).backward()
        optimizer.step()
    return losses, [p.detach().numpy() for p in params]
