"""Train a 4-layer MLP written with PopART's Builder, split over virtual graphs.

    python examples/popart/mlp_pipelining.py                     # 2 IPUs, pipelined
    python examples/popart/mlp_pipelining.py --no-pipelining     # sharded over the same IPUs
    python examples/popart/mlp_pipelining.py --recompute OFF --replication-factor 2

Every variant computes the same numbers: pipelining, sharding, recomputation and replication are
execution strategies, not changes to the maths.
"""
import argparse

import numpy as np

import popart


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="PopART MLP with pipelining")
    parser.add_argument("--no-pipelining", "--no_pipelining", dest="pipelining", action="store_false")
    parser.add_argument("--recompute", choices=["ON", "OFF", "AUTO"], default="AUTO")
    parser.add_argument("--ipus", type=int, default=2, help="virtual graphs per replica")
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--batches-per-step", type=int, default=4)
    parser.add_argument("--gradient-accumulation", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_model(args, rng):
    builder = popart.Builder()
    features, classes, layers = 16, 4, 4
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [args.micro_batch_size, features]), "x")
    labels = builder.addInputTensor(popart.TensorInfo("INT32", [args.micro_batch_size]), "labels")
    h, width = x, features
    for layer in range(layers):
        out = classes if layer == layers - 1 else args.hidden
        ipu = layer * args.ipus // layers
        with builder.virtualGraph(ipu), builder.pipelineStage(ipu), builder.nameScope(f"layer{layer}"):
            init = (rng.standard_normal((width, out)) / np.sqrt(width)).astype(np.float32)
            w = builder.addInitializedInputTensor(init, "weight")
            b = builder.addInitializedInputTensor(np.zeros(out, np.float32), "bias")
            h = builder.aiOnnx.add([builder.aiOnnx.matmul([h, w]), b])
            if layer < layers - 1:
                h = builder.aiOnnx.relu([h])
                if args.recompute == "ON" and not args.pipelining:
                    builder.recomputeOutputInBackwardPass(h)
            else:
                probs = builder.aiOnnx.softmax([h], axis=1)
                loss = builder.aiGraphcore.nllloss([probs, labels], reduction=popart.ReductionType.Mean)
        width = out
    return builder, x, labels, loss


def main(argv=None):
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    builder, x, labels, loss = build_model(args, rng)

    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enablePipelining = args.pipelining
    opts.enableGradientAccumulation = args.gradient_accumulation > 1
    opts.accumulationFactor = args.gradient_accumulation
    # ON: without pipelining the relu outputs are marked by hand, and PopART refuses automatic
    # recomputation on top of manual annotations.
    on = popart.RecomputationType.Standard if args.pipelining else popart.RecomputationType.NoRecompute
    opts.autoRecomputation = {"ON": on, "OFF": popart.RecomputationType.NoRecompute,
                              "AUTO": popart.RecomputationType.Pipeline}[args.recompute]
    if args.replication_factor > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = args.replication_factor

    device = popart.DeviceManager().acquireAvailableDevice(args.ipus * args.replication_factor)
    with device:
        session = popart.TrainingSession(
            fnModel=builder.getModelProto(), loss=loss, deviceInfo=device, userOptions=opts,
            dataFlow=popart.DataFlow(args.batches_per_step, {loss: popart.AnchorReturnType("All")}),
            optimizer=popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True)}))
        session.prepareDevice()
        session.weightsFromHost()
        anchors = session.initAnchorArrays()
        # One fixed synthetic problem: labels are a linear function of the inputs.
        teacher = rng.standard_normal((16, 4))
        samples = args.batches_per_step * args.gradient_accumulation * args.replication_factor * args.micro_batch_size
        losses = []
        for step in range(args.steps):
            data = rng.standard_normal((samples, 16)).astype(np.float32)
            target = np.argmax(data @ teacher, axis=1).astype(np.int32)
            session.run(popart.PyStepIO({x: data, labels: target}, anchors))
            losses.append(float(np.mean(anchors[loss])))
            print(f"step {step}: mean loss {losses[-1]:.4f} (anchor shape {list(anchors[loss].shape)})")
    return losses


if __name__ == "__main__":
    main()
