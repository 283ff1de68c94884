"""Inference fed by ``PyStepIOCallback``: PopART asks for one micro-batch at a time and hands each
anchored result back, instead of reading and writing whole-step numpy buffers.

    python examples/popart/stepio_callbacks.py
"""
import numpy as np

import popart


def main(batches_per_step=3, micro_batch=2):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [micro_batch, 3]), "x")
    w = builder.addInitializedInputTensor(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    y = builder.aiOnnx.relu([builder.aiOnnx.matmul([x, w])], "y")
    session = popart.InferenceSession(builder.getModelProto(),
                                      popart.DataFlow(batches_per_step, {y: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()

    batches = [np.full((micro_batch, 3), k - 1, np.float32) for k in range(batches_per_step)]
    fed, results = [], []

    def input_callback(tensor_id, prefetch):
        fed.append(tensor_id)
        return batches[len(fed) - 1]

    def input_complete_callback(tensor_id):
        pass

    def output_callback(tensor_id):
        results.append(np.zeros((micro_batch, 2), np.float32))
        return results[-1]

    def output_complete_callback(tensor_id):
        print(f"{tensor_id} batch {len(results) - 1}: {results[-1].tolist()}")

    session.run(popart.PyStepIOCallback(input_callback, input_complete_callback, output_callback,
                                        output_complete_callback))
    return batches, results


if __name__ == "__main__":
    main()
