"""``popart.Builder``: builds a real ONNX ``ModelProto`` with PopART's tensor ids and annotations.

Tensor ids follow PopART's scheme: an op's output is named after its ``debugContext`` if given
(``name:i`` when the op has several outputs), else ``<OpType>:<i>``; a repeated id gets ``/1``,
``/2``, ...; ``nameScope("s")`` prefixes ``s/``. Unnamed inputs are ``input``, initializers
``init_input``. Placement and recomputation annotations are node attributes with PopART's
names (``__ipu_number``, ``__pipeline_stage``, ...), set either on the node producing a tensor
(``builder.virtualGraph(t, 1)``) or on every node built inside a context manager
(``with builder.virtualGraph(1):``).
"""
import contextlib
import itertools
from collections.abc import Iterable
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import messages, tensorinfo
from .enums import DataType, RecomputeType
from .errors import popart_exception
from .model_checks import check_text_fields
from .ops import registry
from .shapes import ShapeInference, info_of
from .variables import VariableSettings

DEFAULT_AI_ONNX_OPSET = 10
DEFAULT_AI_GRAPHCORE_OPSET = 1
MAX_AI_ONNX_OPSET = 13  # highest aiOnnxOpsetN attribute offered

VIRTUAL_GRAPH_ATTR = "__ipu_number"
PIPELINE_STAGE_ATTR = "__pipeline_stage"
EXECUTION_PHASE_ATTR = "__execution_phase"
RECOMPUTE_ATTR = "__recompute_output_in_backward_pass"
SCHEDULE_PRIORITY_ATTR = "__schedule_priority"
AVAILABLE_MEMORY_ATTR = "__available_memory_proportion"
PARTIALS_TYPE_ATTR = "__partials_type"
SERIALIZE_MATMUL_ATTR = "__serialize_matmul_mode"
OUTLINE_ATTR_PREFIX = "__outline_"
PARTIALS_TYPE_OPS = ("Conv", "MatMul")
EXCLUDE_PATTERNS_ATTR = "__exclude_patterns"
CONV_DITHERING_ATTR = "__enable_conv_dithering"
# PopART gives each node its builder makes a debug-info id, an attribute its attribute getters see. openpop
# keeps it beside the node (a ``__debug_info_id`` in the ModelProto would reach onnx.reference, whose If,
# Sum, Conv... take every attribute as an argument).
DEBUG_INFO_ID_ATTR = "__debug_info_id"
_DEBUG_INFO_IDS = itertools.count(1)


def _debug_name(debugContext) -> str:
    if debugContext is None:
        return ""
    if isinstance(debugContext, str):
        return debugContext
    return str(getattr(debugContext, "name", "") or "")


class DebugContext:
    """``popart.DebugContext(name)``: only its name is used (for tensor ids)."""

    def __init__(self, name: str = "", parent=None):
        self.name = name
        self.parent = parent


class InputSettings:
    """``InputSettings(tileSet=Compute, exchangeStrategy=JustInTime)`` or
    ``InputSettings(ReplicatedStreamMode)``. The replicated stream mode has its meaning: a
    ``Broadcast`` input is given once per micro-batch and every replica reads it (PopART's stepio
    then expects no replication dimension); tile set and exchange strategy (IPU memory and I/O
    scheduling) are recorded in the model as PopART records them and change nothing off-IPU."""

    def __init__(self, *args, **kwargs):
        from .enums import ExchangeStrategy, ReplicatedStreamMode, TileSet
        self._tile_set, self._exchange = TileSet.Compute, ExchangeStrategy.JustInTime
        self._mode = ReplicatedStreamMode.Replicate
        mode = kwargs.pop("relicatedStreamMode", kwargs.pop("replicatedStreamMode", None))
        if mode is None and args and isinstance(args[0], ReplicatedStreamMode):
            mode, args = args[0], args[1:]
        if mode is not None:
            if args or kwargs:
                raise TypeError(messages.INPUT_SETTINGS_ARGUMENTS)
            self._mode = ReplicatedStreamMode(int(mode))
            return
        names = ["tileSet", "exchangeStrategy"]
        if len(args) > 2 or set(kwargs) - set(names) or any(n in kwargs for n in names[:len(args)]):
            raise TypeError(messages.INPUT_SETTINGS_ARGUMENTS)
        values = dict(zip(names, args), **kwargs)
        self._tile_set = TileSet(int(values.get("tileSet", TileSet.Compute)))
        self._exchange = ExchangeStrategy(int(values.get("exchangeStrategy", ExchangeStrategy.JustInTime)))

    def tileSet(self):
        return self._tile_set

    def exchangeStrategy(self):
        return self._exchange

    def replicatedStreamMode(self):
        return self._mode

    def metadata(self, tensor_id: str) -> dict:
        """The model metadata PopART's builder writes for an input with these settings."""
        return {f"{TILE_SET_KEY}/{tensor_id}": str(int(self._tile_set)),
                f"{EXCHANGE_STRATEGY_KEY}/{tensor_id}": str(int(self._exchange)),
                f"{REPLICATED_STREAM_MODE_KEY}/{tensor_id}": str(int(self._mode))}


# Model metadata keys (PopART's names.hpp), each followed by "/<input id>".
TILE_SET_KEY = "__tile_set"
EXCHANGE_STRATEGY_KEY = "__exchange_strategy"
REPLICATED_STREAM_MODE_KEY = "__replicated_stream_mode"


class _ScopedAnnotation:
    """What ``builder.virtualGraph(1)`` returns: a context manager pushing one attribute."""

    def __init__(self, builder: "Builder", attr: str, value):
        self._builder = builder
        self._attr = attr
        self._value = value

    def __enter__(self):
        self._builder._scopes.append((self._attr, self._value))
        return self

    def __exit__(self, *exc):
        self._builder._scopes.pop()
        return False


class Builder:
    """``popart.Builder(modelProtoOrFilename=None, opsets=None, builderCore=None)``."""

    def __init__(self, modelProtoOrFilename=None, opsets: Optional[dict[str, int]] = None, builderCore=None,
                 _parent: "Builder" = None):
        self._parent = _parent
        self._graph = onnx.GraphProto(name="BuilderGraph")
        self._used_ids = set() if _parent is None else _parent._used_ids
        self._debug_ids: dict[str, int] = {} if _parent is None else _parent._debug_ids
        self._parent_inputs: list[tuple[int, str]] = []  # (position among the inputs, id) of parent tensors
        self._ids_counter: dict[str, int] = {}
        self._scopes: list = []          # (attribute, value) from context managers, outer first
        self._name_scopes: list[str] = []
        self._initializers: dict[str, onnx.TensorProto] = {}
        self._producers: dict[str, onnx.NodeProto] = {}
        self._opsets: dict[str, int] = {}
        self._requested = dict(opsets or {})
        self._subgraphs: list[Builder] = []
        self._outer = set()  # enclosing graphs' tensors this subgraph reads
        self._replication_factor = 1
        self._metadata: dict[str, str] = {}  # the model's metadata_props (input settings)
        self._loaded = modelProtoOrFilename is not None
        if modelProtoOrFilename is not None:
            self._load(modelProtoOrFilename)
        self._inference = ShapeInference(self._effective_opsets())
        self._prime_inference()

    # ------------------------------------------------------------------ loading
    def _load(self, model) -> None:
        proto = load_model(model)
        from .external_data import check_locations  # PopART checks the model (ONNX's checker) as it loads it
        check_locations(proto)
        self._graph.CopyFrom(proto.graph)
        self._metadata.update((p.key, p.value) for p in proto.metadata_props)
        for opset in proto.opset_import:
            self._opsets[registry._canon(opset.domain)] = opset.version
        for init in self._graph.initializer:
            self._initializers[init.name] = init
        for node in self._graph.node:
            for out in node.output:
                self._producers[out] = node
        self._used_ids.update(v.name for v in self._graph.input)
        self._used_ids.update(self._producers)
        self._used_ids.update(self._initializers)

    def _effective_opsets(self) -> dict[str, int]:
        opsets = {registry.ONNX_DOMAIN: DEFAULT_AI_ONNX_OPSET, registry.GRAPHCORE_DOMAIN: DEFAULT_AI_GRAPHCORE_OPSET}
        for domain, version in self._requested.items():
            opsets[registry._canon(domain)] = version
        opsets.update(self._root()._opsets)
        return opsets

    def _prime_inference(self) -> None:
        self._inference = ShapeInference(self._effective_opsets())
        self._inference.opsets[""] = self._inference.opsets[registry.ONNX_DOMAIN]
        for value in self._graph.input:
            if value.name in self._initializers:
                init = self._initializers[value.name]
                self._inference.add_value(value.name, _type_of_initializer(init), init)
            elif value.type.tensor_type.elem_type:
                self._inference.add_value(value.name, value.type)
        for init in self._graph.initializer:
            if init.name not in self._inference.types:
                self._inference.add_value(init.name, _type_of_initializer(init), init)

    def _root(self) -> "Builder":
        return self if self._parent is None else self._parent._root()

    # ------------------------------------------------------------------ opsets
    def _select_opset(self, domain: str, version: int):
        root = self._root()
        current = root._opsets.get(domain)
        if current is None and domain == registry.ONNX_DOMAIN:
            # PopART fixes the ai.onnx opset given to the constructor at once.
            current = registry_version(root._requested, domain, None)
        if current is not None and current != version:
            label = "aiOnnxOpset" if domain == registry.ONNX_DOMAIN else "aiGraphcoreOpset"
            raise popart_exception(messages.OPSET_ALREADY_DEFINED.format(
                label=label, version=version, domain=domain, current=current))
        if current is None:
            root._opsets[domain] = version
            self._inference.opsets[domain] = version
            if domain == registry.ONNX_DOMAIN:
                self._inference.opsets[""] = version
        from .opsets import Opset  # late: it builds nodes through this module
        return Opset(self, domain, version)

    @property
    def aiOnnx(self):
        root = self._root()
        version = root._opsets.get(registry.ONNX_DOMAIN,
                                   registry_version(root._requested, registry.ONNX_DOMAIN, DEFAULT_AI_ONNX_OPSET))
        return self._select_opset(registry.ONNX_DOMAIN, version)

    @property
    def aiGraphcore(self):
        return self._select_opset(registry.GRAPHCORE_DOMAIN, DEFAULT_AI_GRAPHCORE_OPSET)

    @property
    def aiGraphcoreOpset1(self):
        return self._select_opset(registry.GRAPHCORE_DOMAIN, 1)

    def __getattr__(self, name: str):
        if name.startswith("aiOnnxOpset"):
            try:
                version = int(name[len("aiOnnxOpset"):])
            except ValueError:
                raise AttributeError(name) from None
            if 6 <= version <= MAX_AI_ONNX_OPSET:
                return self._select_opset(registry.ONNX_DOMAIN, version)
        raise AttributeError(messages.BUILDER_NO_ATTRIBUTE.format(name=name))

    # ------------------------------------------------------------------ ids
    def _unique_id(self, base: str) -> str:
        if base not in self._used_ids:
            self._used_ids.add(base)
            return base
        n = self._ids_counter.get(base, 0)
        while True:
            n += 1
            candidate = f"{base}/{n}"
            if candidate not in self._used_ids:
                self._ids_counter[base] = n
                self._used_ids.add(candidate)
                return candidate

    def _scoped(self, name: str) -> str:
        return "".join(s + "/" for s in self._name_scopes) + name

    # ------------------------------------------------------------------ tensors
    def addInputTensor(self, *args, debugContext="", **kwargs) -> str:
        """``addInputTensor(TensorInfo[, InputSettings], debugContext="")`` or
        ``addInputTensor(dtype, shape[, InputSettings], debugContext="")``."""
        args = list(args)
        settings = kwargs.pop("settings", None)
        if "tensorInfo" in kwargs:
            args.insert(0, kwargs.pop("tensorInfo"))
        if kwargs:
            raise TypeError(messages.ADD_INPUT_UNEXPECTED_ARGUMENTS.format(kwargs=sorted(kwargs)))
        if not args:
            raise TypeError(messages.ADD_INPUT_NEEDS_INFO_OR_TYPE_AND_SHAPE)
        if isinstance(args[0], tensorinfo.TensorInfo):
            info, rest = args[0], args[1:]
        else:
            if len(args) < 2:
                raise TypeError(messages.ADD_INPUT_SHAPE_MISSING)
            info, rest = tensorinfo.TensorInfo(args[0], args[1]), args[2:]
        for extra in rest:
            if isinstance(extra, (str, DebugContext)):
                debugContext = extra
            elif isinstance(extra, InputSettings):
                settings = extra
            else:
                raise TypeError(messages.ADD_INPUT_UNEXPECTED_ARGUMENT.format(extra=extra))
        name = _debug_name(debugContext)
        tensor_id = self._unique_id(self._scoped(name or "input"))
        if isinstance(args[0], tensorinfo.TensorInfo) and self._parent is None:
            # (PopART's addInputTensor(dataType, shape, settings) drops the settings; so does this)
            self._metadata.update((settings or InputSettings()).metadata(tensor_id))
        value = helper.make_tensor_value_info(tensor_id, tensorinfo.onnx_type(info.data_type()), info.shape())
        self._graph.input.append(value)
        self._inference.add_value(tensor_id, value.type)
        return tensor_id

    def addUntypedInputTensor(self, debugContext="") -> str:
        """A subgraph input whose type comes from the caller (``aiGraphcore.call``)."""
        if self._parent is None:
            raise popart_exception(messages.UNTYPED_INPUT_ON_TOP_LEVEL)
        tensor_id = self._unique_id(self._scoped(_debug_name(debugContext) or "input"))
        self._graph.input.append(onnx.ValueInfoProto(name=tensor_id))
        return tensor_id

    def addInitializedInputTensor(self, initVal, *args, debugContext="") -> str:
        """A variable (trainable weight) initialised to ``initVal``."""
        for extra in args:
            if isinstance(extra, (str, DebugContext)):
                debugContext = extra
            elif not isinstance(extra, VariableSettings):
                raise TypeError(messages.ADD_INITIALIZED_INPUT_UNEXPECTED_ARGUMENT.format(extra=extra))
        array = np.asarray(initVal)
        tensorinfo.popart_name(array.dtype)  # rejects dtypes PopART has no name for
        tensor_id = self._unique_id(self._scoped(_debug_name(debugContext) or "init_input"))
        init = numpy_helper.from_array(np.ascontiguousarray(array), tensor_id)
        self._graph.initializer.append(init)
        self._initializers[tensor_id] = init
        self._graph.input.append(helper.make_tensor_value_info(tensor_id, init.data_type, list(array.shape)))
        self._inference.add_value(tensor_id, _type_of_initializer(init), init)
        return tensor_id

    def addOutputTensor(self, outputName: str) -> None:
        self._require(outputName)
        if any(o.name == outputName for o in self._graph.output):
            return
        self._graph.output.append(onnx.ValueInfoProto(name=outputName))

    def _require(self, tensor_id: str) -> None:
        if tensor_id not in self._inference.types and tensor_id not in self._producers \
                and tensor_id not in self._outer and not any(v.name == tensor_id for v in self._graph.input):
            if self._parent is not None and self._parent._knows(tensor_id):
                self._read_from_parent(tensor_id)  # ONNX's outer-scope reference
                return
            raise popart_exception(messages.TENSOR_UNKNOWN_TO_BUILDER.format(tensor_id=tensor_id))

    def _knows(self, tensor_id: str) -> bool:
        try:
            self._require(tensor_id)
            return True
        except popart_exception:
            return False

    def addInputTensorFromParentGraph(self, tensorId: str) -> None:
        """Let this subgraph read the enclosing graph's tensor ``tensorId`` by its name. PopART makes it an
        input of the subgraph: a callee (``aiGraphcore.call``) takes it in this place among its inputs."""
        self._read_from_parent(tensorId)
        self._parent_inputs.append((len(self._graph.input), tensorId))

    def _read_from_parent(self, tensorId: str) -> None:
        if self._parent is None:
            raise popart_exception(messages.NOT_A_SUBGRAPH_BUILDER)
        if not self._parent._knows(tensorId):
            raise popart_exception(messages.TENSOR_UNKNOWN_TO_PARENT.format(tensorId=tensorId))
        parent = self._parent
        parent.getTensorShapesKnown()
        type_proto = parent._inference.types.get(tensorId)
        if type_proto is not None:
            self._inference.add_value(tensorId, type_proto, parent._inference.constants.get(tensorId))
        self._outer.add(tensorId)

    addInputTensorFromHigherScope = addInputTensorFromParentGraph

    # ------------------------------------------------------------------ nodes
    def _add_node(self, op_type: str, domain: str, inputs: list[str], attributes: dict, num_outputs: int,
                  debugContext, node_attributes: Iterable = ()) -> list[str]:
        inputs = list(inputs)
        for name in inputs:
            if name:
                self._require(name)
        name = _debug_name(debugContext)
        outputs = []
        for i in range(num_outputs):
            if name:
                base = name if num_outputs == 1 else f"{name}:{i}"
            else:
                base = f"{op_type}:{i}"
            outputs.append(self._unique_id(self._scoped(base)))
        node = helper.make_node(op_type, inputs, outputs, name=self._scoped(name or op_type),
                                domain="" if domain == registry.ONNX_DOMAIN else domain)
        for key, value in attributes.items():
            if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
                continue  # PopART's "not set": ONNX's default applies
            node.attribute.append(_make_attribute(key, value))
        node.attribute.extend(node_attributes)
        for attr, value in self._effective_scopes().items():
            node.attribute.append(_make_attribute(attr, value))
        self._debug_ids[outputs[0] if outputs else node.name] = next(_DEBUG_INFO_IDS)
        self._graph.node.append(node)
        node = self._graph.node[-1]  # protobuf appends a copy: annotate the stored node
        for out in outputs:
            self._producers[out] = node
        return outputs

    def _effective_scopes(self) -> dict:
        scopes = {}
        builder = self
        chain = []
        while builder is not None:
            chain.append(builder)
            builder = builder._parent
        for b in reversed(chain):
            for attr, value in b._scopes:
                scopes[attr] = value
        return scopes

    def customOp(self, opName: str, opVersion: int, domain: str, inputs: list[str], attributes: dict,
                 numOutputs: int = 1, name: str = ""):
        outs = self._add_node(opName, domain, inputs, attributes, numOutputs, name)
        return outs[0] if numOutputs == 1 else outs

    def reshape_const(self, aiOnnx, args: list[str], shape: list[int], debugContext="") -> str:
        shape_id = aiOnnx.constant(np.asarray(shape, dtype=np.int64), _debug_name(debugContext) + "_const"
                                   if _debug_name(debugContext) else "")
        return aiOnnx.reshape([args[0], shape_id], debugContext=debugContext)

    def createSubgraphBuilder(self) -> "Builder":
        sub = Builder(_parent=self)
        self._subgraphs.append(sub)
        return sub

    def setGraphName(self, name: str) -> None:
        self._graph.name = name

    def embedReplicationFactor(self, replicationFactor: int) -> None:
        self._replication_factor = int(replicationFactor)

    # ------------------------------------------------------------------ model
    def _model(self) -> onnx.ModelProto:
        try:
            self.getTensorShapesKnown()
        except popart_exception:
            if self._parent is not None or not self._loaded:
                raise
            # A loaded model ONNX's inference refuses (PopART's own non-standard uses of ops): kept as it is.
        graph = onnx.GraphProto()
        graph.CopyFrom(self._graph)
        del graph.value_info[:]
        outputs = {o.name for o in graph.output}
        del graph.output[:]
        for o in self._graph.output:  # typed by inference, else as given (a loaded model's)
            graph.output.append(self._value_info(o.name) if o.name in self._inference.types else o)
        for node in graph.node:
            for out in node.output:
                if out not in outputs and out in self._inference.types:
                    graph.value_info.append(self._value_info(out))
        opsets = self._effective_opsets()
        used_graphcore = any(n.domain == registry.GRAPHCORE_DOMAIN for n in _all_nodes(graph))
        imports = [helper.make_opsetid("", opsets[registry.ONNX_DOMAIN])]
        if used_graphcore:
            imports.append(helper.make_opsetid(registry.GRAPHCORE_DOMAIN, opsets[registry.GRAPHCORE_DOMAIN]))
        model = helper.make_model(graph, opset_imports=imports, producer_name="popart (openpop)")
        model.ir_version = 8
        props = dict(self._metadata)
        if self._replication_factor > 1:
            props["replicationFactor"] = str(self._replication_factor)
        if props:
            helper.set_model_props(model, props)
        return model

    def _value_info(self, name: str) -> onnx.ValueInfoProto:
        type_proto = self._inference.types.get(name)
        value = onnx.ValueInfoProto(name=name)
        if type_proto is not None:
            value.type.CopyFrom(type_proto)
        return value

    def getModelProto(self, human_readable: bool = False):
        model = self._model()
        if human_readable:
            return str(model)
        return model.SerializeToString()

    def saveInitializersExternally(self, ids, filename: str) -> None:
        """Move the data of initializers ``ids`` to the file ``filename`` (the model points at it)."""
        from . import external_data

        class _Model:  # the builder's graph, as external_data reads a model
            graph = self._graph
        external_data.save_externally(_Model, list(ids), filename)
        self._initializers = {tp.name: tp for tp in self._graph.initializer}

    def saveModelProto(self, filename: str) -> None:
        with open(filename, "wb") as f:
            f.write(self.getModelProto())

    def _subgraph(self) -> onnx.GraphProto:
        """This (subgraph) builder's graph, typed as far as its inputs' types are known."""
        try:
            self._inference.run(self._graph)
        except popart_exception:
            pass  # untyped inputs: the caller's tensors type them at run time
        graph = onnx.GraphProto()
        graph.CopyFrom(self._graph)
        for value in graph.output:  # typed outputs: ONNX infers If/Loop/Scan outputs from them
            if not value.type.tensor_type.elem_type and value.name in self._inference.types:
                value.type.CopyFrom(self._inference.types[value.name])
        return graph

    def _callee_graph(self) -> onnx.GraphProto:
        """This subgraph as ``aiGraphcore.call`` runs it: the parent tensors added with
        ``addInputTensorFromParentGraph`` are inputs, where they were added."""
        graph = self._subgraph()
        if not self._parent_inputs:
            return graph
        inputs = list(graph.input)
        for position, tensor_id in sorted(self._parent_inputs, key=lambda p: p[0], reverse=True):
            inputs.insert(position, self._value_info(tensor_id))
        del graph.input[:]
        graph.input.extend(inputs)
        return graph

    def getTensorShapesKnown(self) -> None:
        self._inference.run(self._graph)

    def _info(self, tensor_id: str) -> tensorinfo.TensorInfo:
        self._require(tensor_id)
        self.getTensorShapesKnown()
        type_proto = self._inference.types.get(tensor_id)
        info = info_of(type_proto) if type_proto is not None else None
        if info is None:
            raise popart_exception(messages.SHAPE_NOT_INFERRED.format(tensor_id=tensor_id))
        return info

    def getTensorShape(self, tensorId: str) -> list[int]:
        return self._info(tensorId).shape()

    def getTensorDtypeString(self, tensorId: str) -> str:
        return self._info(tensorId).data_type_lcase()

    def getTensorInfo(self, tensorId: str) -> tensorinfo.TensorInfo:
        return self._info(tensorId)

    def isInitializer(self, tensorId: str) -> bool:
        return tensorId in self._initializers

    def getInputTensorIds(self) -> list[str]:
        return [v.name for v in self._graph.input]

    def getOutputTensorIds(self) -> list[str]:
        return [v.name for v in self._graph.output]

    def getValueTensorIds(self) -> list[str]:
        return [out for node in self._graph.node for out in node.output]

    def getTrainableTensorIds(self) -> list[str]:
        return [name for name, init in self._initializers.items()
                if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]

    def hasValueInfo(self, tensorId: str) -> bool:
        return tensorId in self._inference.types

    # ------------------------------------------------------------------ annotations
    def _annotate(self, tensor_ids, attr: str, value) -> None:
        if isinstance(tensor_ids, str):
            tensor_ids = [tensor_ids]
        for tensor_id in tensor_ids:
            node = self._producers.get(tensor_id)
            if node is None:
                raise popart_exception(messages.NO_PRODUCER_TO_ANNOTATE.format(tensor_id=tensor_id, attr=attr))
            _set_attribute(node, attr, value)

    def _setter_or_scope(self, attr: str, arg, value, convert=int):
        if isinstance(arg, (str, list, set, tuple)):
            self._annotate(arg, attr, convert(value))
            return None
        return _ScopedAnnotation(self, attr, convert(arg))

    def virtualGraph(self, arg, value: int = 0):
        """``virtualGraph(tensorId(s), value)`` sets it; ``with virtualGraph(value):`` scopes it."""
        return self._setter_or_scope(VIRTUAL_GRAPH_ATTR, arg, value)

    def pipelineStage(self, arg, value: int = 0):
        return self._setter_or_scope(PIPELINE_STAGE_ATTR, arg, value)

    def executionPhase(self, arg, value: int = 0):
        return self._setter_or_scope(EXECUTION_PHASE_ATTR, arg, value)

    def schedulePriority(self, priority: float):
        return _ScopedAnnotation(self, SCHEDULE_PRIORITY_ATTR, float(priority))

    def recomputeOutputInBackwardPass(self, arg, value=RecomputeType.Recompute):
        """Ask for the node(s) producing ``arg`` to be recomputed in the backward pass."""
        if isinstance(arg, (RecomputeType, int)) and not isinstance(arg, bool):
            return _ScopedAnnotation(self, RECOMPUTE_ATTR, int(arg))
        return self._setter_or_scope(RECOMPUTE_ATTR, arg, value)

    def checkpointOutput(self, nodeOutputNames: list[str]) -> list[str]:
        """Mark outputs as checkpoints (stashed, never recomputed): returns identity outputs."""
        outs = []
        for name in nodeOutputNames:
            out = self._add_node("Identity", registry.ONNX_DOMAIN, [name], {}, 1, "",
                                 [_make_attribute(RECOMPUTE_ATTR, int(RecomputeType.Checkpoint))])[0]
            outs.append(out)
        return outs

    def getRecomputeOutputInBackwardPass(self, tensorId) -> bool:
        return self._node_attribute(tensorId, RECOMPUTE_ATTR, 0) == int(RecomputeType.Recompute)

    def outlineAttributes(self, attributes: dict[str, str]):
        builder = self

        @contextlib.contextmanager
        def scope():
            for key, value in attributes.items():
                builder._scopes.append((OUTLINE_ATTR_PREFIX + key, str(value)))
            try:
                yield
            finally:
                for _ in attributes:
                    builder._scopes.pop()
        return scope()

    def nameScope(self, name: str):
        builder = self

        @contextlib.contextmanager
        def scope():
            builder._name_scopes.append(name)
            try:
                yield
            finally:
                builder._name_scopes.pop()
        return scope()

    def getNameScope(self, name: str = "") -> str:
        return self._scoped(name)

    def setAvailableMemoryProportion(self, nodeOutputNames, availableMemoryProportion: float) -> None:
        self._annotate(nodeOutputNames, AVAILABLE_MEMORY_ATTR, float(availableMemoryProportion))

    def setSerializeMatMul(self, nodeOutputNames, mode, factor: int = 0, keep_precision: bool = False) -> None:
        self._annotate(list(nodeOutputNames), SERIALIZE_MATMUL_ATTR, str(getattr(mode, "value", mode)))

    def setPartialsType(self, nodeOutputName: str, partialsType: str) -> None:
        node = self._find_node(nodeOutputName)
        if node.op_type not in PARTIALS_TYPE_OPS:
            raise popart_exception(messages.PARTIALS_TYPE_UNSUPPORTED_OP.format(op_type=node.op_type))
        self._annotate(nodeOutputName, PARTIALS_TYPE_ATTR, str(partialsType))

    def setInplacePreferences(self, nodeOutputName: str, prefs: dict) -> None:
        self._require(nodeOutputName)  # an IPU memory hint: nothing to do on CPUs/GPUs

    def _node_attribute(self, tensor_id, attr: str, default=None):
        node = self._producers.get(tensor_id) if isinstance(tensor_id, str) else self._find_node(tensor_id)
        if node is None:
            raise popart_exception(messages.NO_PRODUCER.format(tensor_id=tensor_id))
        for a in node.attribute:
            if a.name == attr:
                return helper.get_attribute_value(a)
        return default

    def _annotation(self, tensorId, attr: str, not_set: str):
        """The annotation ``attr`` of the node producing ``tensorId`` (or, with None, of the current scope)."""
        if tensorId is None:
            value = self._current_scope(attr)
            if value is None:
                raise popart_exception(not_set)
            return value
        value = self._node_attribute(tensorId, attr)
        if value is None:
            raise popart_exception(messages.NODE_HAS_NO_ATTRIBUTE.format(attributeName=attr))
        return value

    def _current_scope(self, attr: str):
        return self._effective_scopes().get(attr)

    def getVirtualGraph(self, tensorId=None) -> int:
        return self._annotation(tensorId, VIRTUAL_GRAPH_ATTR, messages.VIRTUAL_GRAPH_NOT_SET)

    def hasVirtualGraph(self, tensorId: Optional[str] = None) -> bool:
        if tensorId is None:
            return self._current_scope(VIRTUAL_GRAPH_ATTR) is not None
        return self._node_attribute(tensorId, VIRTUAL_GRAPH_ATTR) is not None

    def getPipelineStage(self, tensorId=None) -> int:
        return self._annotation(tensorId, PIPELINE_STAGE_ATTR, messages.PIPELINE_STAGE_NOT_SET)

    def hasPipelineStage(self, tensorId: Optional[str] = None) -> bool:
        if tensorId is None:
            return self._current_scope(PIPELINE_STAGE_ATTR) is not None
        return self._node_attribute(tensorId, PIPELINE_STAGE_ATTR) is not None

    def getExecutionPhase(self, tensorId=None) -> int:
        return self._annotation(tensorId, EXECUTION_PHASE_ATTR, messages.EXECUTION_PHASE_NOT_SET)

    def hasExecutionPhase(self, tensorId=None) -> bool:
        if tensorId is None:
            return self._current_scope(EXECUTION_PHASE_ATTR) is not None
        return self._node_attribute(tensorId, EXECUTION_PHASE_ATTR) is not None

    def _find_node(self, nodeOutputNames) -> onnx.NodeProto:
        """The node whose outputs are exactly ``nodeOutputNames`` (PopART asks for all of them)."""
        names = {nodeOutputNames} if isinstance(nodeOutputNames, str) else set(nodeOutputNames)
        for name in names:
            node = self._producers.get(name)
            if node is not None and set(node.output) == names and len(node.output) == len(names):
                return node
            break
        raise popart_exception(messages.NODE_NOT_FOUND.format(outputs=" ,".join(sorted(names))))

    def _attributes(self, node) -> list:
        """The node's attributes as PopART's getters see them: with its debug-info id."""
        attrs = list(node.attribute)
        debug_id = self._debug_ids.get(node.output[0] if node.output else node.name)
        if debug_id is not None:
            attrs.append(helper.make_attribute(DEBUG_INFO_ID_ATTR, debug_id))
        return attrs

    def addNodeAttribute(self, attributeName: str, attributeValue, nodeOutputNames) -> None:
        """Add a new attribute to the node producing exactly ``nodeOutputNames``; PopART's types: an int
        (or bool), a float, a string, or a list of one of them."""
        node = self._find_node(nodeOutputNames)
        if any(a.name == attributeName for a in self._attributes(node)):
            raise popart_exception(messages.NODE_ALREADY_HAS_ATTRIBUTE.format(attributeName=attributeName))
        node.attribute.append(_node_attribute_proto(attributeName, attributeValue))

    def nodeHasAttribute(self, attributeName: str, nodeOutputNames) -> bool:
        return any(a.name == attributeName for a in self._attributes(self._find_node(nodeOutputNames)))

    def _typed_attribute(self, attributeName: str, nodeOutputNames, attr_type, kind: str):
        for a in self._attributes(self._find_node(nodeOutputNames)):
            if a.name == attributeName:
                if a.type != attr_type:
                    raise popart_exception(messages.ATTRIBUTE_WRONG_TYPE.format(attributeName=attributeName,
                                                                                 kind=kind))
                return helper.get_attribute_value(a)
        raise popart_exception(messages.NODE_HAS_NO_ATTRIBUTE.format(attributeName=attributeName))

    def getInt64NodeAttribute(self, attributeName: str, nodeOutputNames) -> int:
        return int(self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.INT, "an integer"))

    def getInt64VectorNodeAttribute(self, attributeName: str, nodeOutputNames) -> list[int]:
        return [int(v) for v in self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.INTS,
                                                      "an integer vector")]

    def getFloatNodeAttribute(self, attributeName: str, nodeOutputNames) -> float:
        return float(self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.FLOAT, "a float"))

    def getFloatVectorNodeAttribute(self, attributeName: str, nodeOutputNames) -> list[float]:
        return [float(v) for v in self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.FLOATS,
                                                        "a float vector")]

    def getStringNodeAttribute(self, attributeName: str, nodeOutputNames) -> str:
        return self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.STRING,
                                     "a string").decode()

    def getStringVectorNodeAttribute(self, attributeName: str, nodeOutputNames) -> list[str]:
        return [v.decode() for v in self._typed_attribute(attributeName, nodeOutputNames,
                                                          onnx.AttributeProto.STRINGS, "a string vector")]

    def getBoolNodeAttribute(self, attributeName: str, nodeOutputNames) -> bool:
        return bool(self._typed_attribute(attributeName, nodeOutputNames, onnx.AttributeProto.INT, "a int"))

    def getNodeAttribute(self, attributeName: str, nodeOutputNames):
        """The attribute's value whatever its type (openpop's addition; PopART has one getter per type)."""
        for a in self._attributes(self._find_node(nodeOutputNames)):
            if a.name == attributeName:
                value = helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        raise popart_exception(messages.NODE_HAS_NO_ATTRIBUTE.format(attributeName=attributeName))

    def getAllNodeAttributeNames(self, nodeOutputNames) -> list[str]:
        return [a.name for a in self._attributes(self._find_node(nodeOutputNames))]

    def removeNodeAttribute(self, attributeName: str, nodeOutputNames) -> None:
        node = self._find_node(nodeOutputNames)
        key = node.output[0] if node.output else node.name
        if attributeName == DEBUG_INFO_ID_ATTR and key in self._debug_ids:
            del self._debug_ids[key]
            return
        kept = [a for a in node.attribute if a.name != attributeName]
        if len(kept) == len(node.attribute):
            raise popart_exception(messages.CANNOT_REMOVE_ATTRIBUTE.format(attributeName=attributeName))
        del node.attribute[:]
        node.attribute.extend(kept)

    def excludePatterns(self, nodeOutputName, patternNames: list[str]) -> None:
        """Patterns not to apply to this node: recorded (openpop applies none of PopART's IR patterns)."""
        self.addNodeAttribute(EXCLUDE_PATTERNS_ATTR, [str(p) for p in patternNames], nodeOutputName)

    def getPartialsType(self, nodeOutputName: str) -> str:
        value = self._node_attribute(nodeOutputName, PARTIALS_TYPE_ATTR)
        if value is None:
            return "FLOAT"  # Poplar's default
        return value.decode() if isinstance(value, bytes) else value

    def setEnableConvDithering(self, nodeOutputName: str, enableConvDithering: int) -> None:
        """An IPU convolution-planning hint: recorded, no effect off-IPU."""
        if enableConvDithering not in (0, 1):
            raise popart_exception(messages.CONV_DITHERING_NOT_BOOL)
        node = self._find_node(nodeOutputName)
        if node.op_type != "Conv":
            raise popart_exception(messages.CONV_DITHERING_NOT_CONV.format(op_type=node.op_type))
        self.addNodeAttribute(CONV_DITHERING_ATTR, int(enableConvDithering), nodeOutputName)

def registry_version(requested: dict, domain: str, default):
    for key, value in requested.items():
        if registry._canon(key) == domain:
            return int(value)
    return default


def _first(nodeOutputNames) -> str:
    """The node's first output name (``nodeOutputNames`` may be any iterable of names)."""
    names = list(nodeOutputNames)
    return names[0]


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


def _type_of_initializer(init: onnx.TensorProto) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(init.data_type, list(init.dims))


def _make_attribute(key: str, value):
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, Builder):
        return helper.make_attribute(key, value._subgraph())
    if isinstance(value, DataType):  # PopART's enum: ONNX's number in the model
        return helper.make_attribute(key, tensorinfo.onnx_type(value.name))
    if hasattr(value, "value") and isinstance(value.value, int):  # enums
        return helper.make_attribute(key, int(value))
    if isinstance(value, (list, tuple)) and value and hasattr(value[0], "value") and not isinstance(value[0], str):
        value = [int(v) for v in value]
    return helper.make_attribute(key, value)


def _node_attribute_proto(name: str, value) -> onnx.AttributeProto:
    """``addNodeAttribute``'s value as PopART's overloads type it (int before float, as pybind11 tries them)."""
    if isinstance(value, (bool, int, np.integer)):
        return helper.make_attribute(name, int(value))
    if isinstance(value, (float, np.floating)):
        return helper.make_attribute(name, float(value))
    if isinstance(value, str):
        return helper.make_attribute(name, value)
    if isinstance(value, (list, tuple, set, np.ndarray)):
        items = list(value)
        if all(isinstance(v, (bool, int, np.integer)) for v in items):
            return helper.make_attribute(name, [int(v) for v in items], attr_type=onnx.AttributeProto.INTS)
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in items):
            return helper.make_attribute(name, [float(v) for v in items])
        if all(isinstance(v, str) for v in items):
            return helper.make_attribute(name, items)
    raise popart_exception(messages.UNSUPPORTED_ATTRIBUTE_VALUE.format(value_type=type(value).__name__))


def _set_attribute(node, attr: str, value) -> None:
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(_make_attribute(attr, value))


def load_model(model) -> onnx.ModelProto:
    """A ``ModelProto`` from serialized bytes, a file name or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as exc:
            raise popart_exception(messages.MODEL_PARSE_FAILED.format(exc=exc)) from None
        check_text_fields(proto, "model")
        return proto
    if isinstance(model, str):
        try:
            proto = onnx.load(model, load_external_data=False)  # PopART reads external data itself
        except FileNotFoundError:
            # PopART: a string that names no file is a serialized ModelProto, or its error
            raise popart_exception(messages.MODEL_FILE_MISSING.format(model=model[:100])) from None
        except Exception as exc:
            raise popart_exception(messages.MODEL_LOAD_FAILED.format(model=model, exc=exc)) from None
        check_text_fields(proto, "model")
        return proto
    raise popart_exception(messages.NOT_AN_ONNX_MODEL.format(model_type=type(model).__name__))
