"""``popart.GraphTransformer``: PopART's rewrites of an ONNX model before it is built into a session —
data-type conversions of initializers, tensor attributes and value infos, initializers made
constants, unused inputs removed, BatchNormalization given its training outputs, initializers saved
externally."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import external_data, messages
from .builder import load_model
from .errors import popart_exception

T = onnx.TensorProto
_FIXED_POINT = (T.UINT8, T.INT8, T.UINT16, T.INT16, T.INT32, T.INT64, T.UINT32, T.UINT64, T.BOOL)


class GraphTransformer:
    """``GraphTransformer(modelProtoOrFilename)``; ``getModelProto()`` returns the rewritten model."""

    def __init__(self, modelProtoOrFilename):
        self._model = onnx.ModelProto()
        self._model.CopyFrom(load_model(modelProtoOrFilename))
        self._bn_counter = 0

    def getModelProto(self) -> bytes:
        return self._model.SerializeToString()

    # ------------------------------------------------------------------ data types
    def _convert(self, source: int, target: int, convert) -> None:
        """Retype every ``source`` tensor: node tensor attributes, initializers and value infos."""
        def retype(tp: T) -> None:
            if tp.data_type != source:
                return
            value = np.asarray(convert(external_data.to_array(tp)), helper.tensor_dtype_to_np_dtype(target))
            if target == T.FLOAT16:  # PopART: half data as raw bytes, others in the typed fields
                tp.CopyFrom(numpy_helper.from_array(value, tp.name))
            else:
                tp.CopyFrom(helper.make_tensor(tp.name, target, list(value.shape), value.reshape(-1).tolist()))

        def visit(graph: onnx.GraphProto) -> None:
            for node in graph.node:
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.TENSOR:
                        retype(attr.t)
                    elif attr.type == onnx.AttributeProto.GRAPH:
                        visit(attr.g)
            for tp in graph.initializer:
                retype(tp)
            for value in list(graph.input) + list(graph.output) + list(graph.value_info):
                tensor = value.type.tensor_type
                if value.type.HasField("tensor_type") and tensor.elem_type == source:
                    tensor.elem_type = target
        visit(self._model.graph)

    def convertFloatsToHalfs(self) -> None:
        self._convert(T.FLOAT, T.FLOAT16, lambda a: a.astype(np.float16))

    def convertDoublesToHalfs(self) -> None:
        self._convert(T.DOUBLE, T.FLOAT16, lambda a: a.astype(np.float16))

    def convertDoublesToFloats(self) -> None:
        self._convert(T.DOUBLE, T.FLOAT, lambda a: a.astype(np.float32))

    def convertBFloats16ToFloat32(self) -> None:
        self._convert(T.BFLOAT16, T.FLOAT, lambda a: np.asarray(a, np.float32))

    def convertUINT8ToINT32(self) -> None:
        self._convert(T.UINT8, T.INT32, lambda a: a.astype(np.int32))

    def convertUINT16ToINT32(self) -> None:
        self._convert(T.UINT16, T.INT32, lambda a: a.astype(np.int32))

    def convertINT8ToINT32(self) -> None:
        self._convert(T.INT8, T.INT32, lambda a: a.astype(np.int32))

    def convertINT16ToINT32(self) -> None:
        self._convert(T.INT16, T.INT32, lambda a: a.astype(np.int32))

    def convertINT64ToINT32(self, clip: bool = False) -> None:
        info = np.iinfo(np.int32)

        def narrow(a):
            if clip:
                return np.clip(a, info.min, info.max).astype(np.int32)
            if a.size and (a.max() > info.max or a.min() < info.min):
                raise popart_exception(messages.INT64_TOO_LARGE)
            return a.astype(np.int32)
        self._convert(T.INT64, T.INT32, narrow)

    # ------------------------------------------------------------------ structure
    def convertInitializersToConstants(self, ids) -> None:
        graph = self._model.graph
        initializers = {tp.name: tp for tp in graph.initializer}
        for tensor_id in ids:
            if tensor_id not in initializers:
                raise popart_exception(messages.NOT_IN_INITIALIZERS.format(id=tensor_id))
        constants = []
        for tensor_id in ids:
            value = numpy_helper.from_array(external_data.to_array(initializers[tensor_id]), tensor_id)
            constants.append(helper.make_node("Constant", [], [tensor_id], name=tensor_id, value=value))
        nodes = constants + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        drop = set(ids)
        kept_init = [tp for tp in graph.initializer if tp.name not in drop]
        kept_inputs = [v for v in graph.input if v.name not in drop]
        del graph.initializer[:]
        graph.initializer.extend(kept_init)
        del graph.input[:]
        graph.input.extend(kept_inputs)
        onnx.checker.check_model(self._model)

    def convertAllFixedPointInitializersToConstants(self) -> None:
        self.convertInitializersToConstants([tp.name for tp in self._model.graph.initializer
                                             if tp.data_type in _FIXED_POINT])

    def removeUnusedInputs(self) -> None:
        graph = self._model.graph
        consumed = {i for node in graph.node for i in node.input}
        kept_inputs = [v for v in graph.input if v.name in consumed]
        kept_init = [tp for tp in graph.initializer if tp.name in consumed]
        del graph.input[:]
        graph.input.extend(kept_inputs)
        del graph.initializer[:]
        graph.initializer.extend(kept_init)

    def prepareNodesForTraining(self) -> None:
        """BatchNormalization nodes get their five training outputs."""
        for node in self._model.graph.node:
            if node.op_type == "BatchNormalization":
                for index in range(len(node.output), 5):
                    node.output.append(f"{node.op_type}_{node.name}_oi{index}_{self._bn_counter}")
                    self._bn_counter += 1

    def saveInitializersExternally(self, ids, filename: str) -> None:
        external_data.save_externally(self._model, list(ids), filename)
