"""A PopART training script run under poprun (and, as the oracle, in one process with all replicas).

``python popart_distributed_program.py OUTDIR`` trains the Builder MLP of ``helpers.popart_models`` with
SGD (momentum) and Adam for a few steps, with ``popdist.popart.configureSessionOptions`` and
``getDevice``, and saves each config's weights and loss anchors to ``OUTDIR/rank<i>.pt``.
"""
import os
import sys

import numpy as np
import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import popart  # noqa: E402

from helpers.popart_models import build_mlp, mlp_weights  # noqa: E402

STEPS, BPS, ACCL, MICRO = 3, 2, 2, 4
OPTIMIZERS = {
    "sgd": lambda: popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True)}),
    "adam": lambda: popart.Adam({"defaultLearningRate": (0.01, False), "defaultWeightDecay": (0.01, True)}),
}


def global_batch(step, total_replicas):
    """Step ``step``'s data for every replica of the job: ``[bps, accl, replicas, ...]``."""
    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((BPS, ACCL, total_replicas, MICRO, 8)).astype(np.float32)
    y = rng.integers(0, 4, (BPS, ACCL, total_replicas, MICRO)).astype(np.int32)
    return x, y


def train(name, options, device, total_replicas, offset, local_replicas, init_seed):
    builder, x, labels, probs, loss, ids = build_mlp(MICRO, mlp_weights(init_seed))
    flow = popart.DataFlow(BPS, {loss: popart.AnchorReturnType("All"), probs: popart.AnchorReturnType("Final")})
    options.enableGradientAccumulation, options.accumulationFactor = True, ACCL
    session = popart.TrainingSession(builder.getModelProto(), flow, loss, OPTIMIZERS[name](), device,
                                     userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    losses = []
    for step in range(STEPS):
        data, target = global_batch(step, total_replicas)
        local = slice(offset, offset + local_replicas)
        session.run(popart.PyStepIO({x: np.ascontiguousarray(data[:, :, local]),
                                     labels: np.ascontiguousarray(target[:, :, local])}, anchors))
        losses.append(np.array(anchors[loss], copy=True))
    weights = {i: np.zeros_like(w) for i, w in zip(ids, [a for wb in mlp_weights() for a in wb])}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(weights))
    return {"weights": weights, "losses": losses, "shape": list(anchors[probs].shape)}


def main(outdir):
    import popdist
    import popdist.popart
    torch.set_num_threads(1)  # 2 instances x 1 thread
    results = {}
    for name in OPTIMIZERS:
        options = popart.SessionOptions()
        popdist.popart.configureSessionOptions(options)
        device = popdist.popart.getDevice(1)
        rank = popdist.getInstanceIndex()
        # Instances start from different weights: the first run must give them instance 0's.
        results[name] = train(name, options, device, popdist.getNumTotalReplicas(), popdist.getReplicaIndexOffset(),
                              popdist.getNumLocalReplicas(), init_seed=rank)
    results["options"] = {k: getattr(options, k) for k in (
        "enableReplicatedGraphs", "replicatedGraphCount", "enableDistributedReplicatedGraphs",
        "globalReplicationFactor", "globalReplicaOffset")}
    results["numIpus"] = device.numIpus
    torch.save(results, os.path.join(outdir, f"rank{popdist.getInstanceIndex()}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
