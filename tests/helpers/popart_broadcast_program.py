"""Run under poprun by tests/test_popart_distributed.py: PopART sessions without distributed options.

``python popart_broadcast_program.py OUTDIR``: each instance builds a weight of its own value
(42 on instance 0). The first session calls ``broadcastWeights()`` before ``prepareDevice`` and
anchors ``input + weight``; the second does not broadcast and trains one SGD step on its own.
Saves ``OUTDIR/rank<i>.npz``: the first session's anchor and the second's trained weight.
"""
import os
import sys

import numpy as np

import popart
import popdist


def session_of(value, broadcast):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1]), "x")
    w = builder.addInitializedInputTensor(np.array([value], dtype=np.float32), "w")
    out = builder.aiOnnx.add([x, w])
    loss = builder.aiGraphcore.identityloss([out])
    session = popart.TrainingSession(fnModel=builder.getModelProto(),
                                     dataFlow=popart.DataFlow(1, {out: popart.AnchorReturnType("All")}),
                                     loss=loss, optimizer=popart.ConstSGD(0.5),
                                     deviceInfo=popart.DeviceManager().createCpuDevice())
    if broadcast:
        session.broadcastWeights()
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: np.array([1.0], dtype=np.float32)}, anchors))
    session.weightsToHost()
    weights = {w: np.zeros(1, dtype=np.float32)}
    session.readWeights(popart.PyWeightsIO(weights))
    return anchors[out].copy(), weights[w]


def main(outdir):
    popdist.init()
    rank = popdist.getInstanceIndex()
    broadcast_anchor, _ = session_of(42.0 if rank == 0 else float(rank), broadcast=True)
    _, own_weight = session_of(10.0 * (rank + 1), broadcast=False)
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), anchor=broadcast_anchor, weight=own_weight)


if __name__ == "__main__":
    main(sys.argv[1])
