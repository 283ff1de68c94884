"""The smallest PopART program: add two tensors on an IPU model device (here: openpop's CPU)."""
import numpy as np

import popart


def main():
    builder = popart.Builder()
    info = popart.TensorInfo("FLOAT", [1])
    lhs = builder.addInputTensor(info)
    rhs = builder.addInputTensor(info)
    total = builder.aiOnnx.add([lhs, rhs])
    builder.addOutputTensor(total)

    flow = popart.DataFlow(1, {total: popart.AnchorReturnType("All")})
    session = popart.InferenceSession(fnModel=builder.getModelProto(), dataFlow=flow,
                                      deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    a, b = np.random.rand(1).astype(np.float32), np.random.rand(1).astype(np.float32)
    session.run(popart.PyStepIO({lhs: a, rhs: b}, anchors))
    print("Result is " + str(anchors[total]))
    return a, b, anchors[total]


if __name__ == "__main__":
    main()
