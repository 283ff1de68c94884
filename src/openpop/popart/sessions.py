"""``popart.InferenceSession`` / ``popart.TrainingSession`` on openpop's ``PoplarExecutor``.

A session turns the ONNX model into an ``OnnxGraphModule`` (``graph.py``), its placement into
openpop blocks (``placement.py``) and its ``SessionOptions`` into ``poptorch.Options``:

====================================================  =============================================
PopART                                                openpop
====================================================  =============================================
``DataFlow.batchesPerStep``                           ``deviceIterations``
``accumulationFactor`` (if enabled)                   ``Training.gradientAccumulation``
``replicatedGraphCount`` (if enabled)                 ``replicationFactor``
``accumulationAndReplicationReductionType`` (Sum)     ``Training.accumulationAndReplicationReductionType``
``meanAccumulationAndReplicationReductionStrategy``   ``setMeanAccumulationAndReplicationReductionStrategy``
virtual graphs / pipeline stages                      ``BeginBlock`` per segment, Sharded/Pipelined strategy
``autoRecomputation`` (pipelined)                     ``_Popart.set("autoRecomputation", ...)``
``autoRecomputation`` / annotations (not pipelined)   checkpointed regions (``recompute.py``)
``enableDistributedReplicatedGraphs``                 ``Distributed.configureProcessId`` (``distributed.py``)
``enableStochasticRounding``                          ``Precision.enableStochasticRounding``
====================================================  =============================================

Host buffers: every input ``x`` of declared shape ``S`` arrives as ``bps*accl*repl*nelms(S)``
elements (PopART's check) and is given to the executor as ``[bps*accl*repl, *S]``, which the
runtime splits in PopART's ``[bps, accl, repl]`` order. Anchors come back from the runtime in the
output mode of their common return type (``Final``, ``Sum``, ``EveryN``; ``All``, per micro-batch,
when they differ) and are reduced here to each anchor's return type, then
shaped as ``initAnchorArrays`` says.

Gradient anchors (``popart.reservedGradientPrefix() + id``) hold each micro-batch's gradient of
the loss (times the optimizer's loss scaling, as PopART's gradient tensors are scaled).
``UpdatedVar___<weight>`` anchors hold the weight after each step's update, repeated over the
step's micro-batches. With pipelining but no gradient accumulation PopART updated weights per
micro-batch with stale weights; openpop runs such a model sharded (same stages, no staleness).
"""
import copy
import logging
from typing import Optional

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .. import annotations, openpop_settings, strategies
from ..enums import MeanReductionStrategy as PoptorchMeanStrategy
from ..enums import OutputMode
from ..enums import ReductionType as PoptorchReduction
from ..models import inferenceModel, trainingModel
from ..options import Options
from ..runtime.compiled import backend_from_env
from . import distributed, external_data, graph_checks, loss_scaling, messages, placement, tensorinfo
from .builder import REPLICATED_STREAM_MODE_KEY, load_model
from .dataflow import DataFlow
from .devices import DeviceInfo
from .enums import AnchorReturnTypeId, RecomputationType, ReplicatedStreamMode, SyntheticDataMode
from .errors import popart_exception
from .graph import GraphProgram, OnnxGraphModule
from .optimizers import Optimizer
from .options import SessionOptions
from .shapes import ShapeInference, info_of, type_of
from .stepio import OUTPUT_SIZE_ERROR, PyStepIO, PyStepIOCallback, PyWeightsIO, check_input_size

GRADIENT_PREFIX = "Gradient___"
UPDATED_VAR_PREFIX = "UpdatedVar___"
NOT_PREPARED = "Devicex::prepare() must be called before Devicex::{what} is called."

logger = logging.getLogger("popart")


class InputShapeInfo:
    """Shapes for model inputs that the ONNX file leaves open."""

    def __init__(self):
        self._infos: dict[str, tensorinfo.TensorInfo] = {}

    def add(self, tensorId: str, info: tensorinfo.TensorInfo) -> None:
        self._infos[tensorId] = info

    def get(self, tensorId: str) -> tensorinfo.TensorInfo:
        return self._infos[tensorId]

    def has(self, tensorId: str) -> bool:
        return tensorId in self._infos

    def infos(self):
        return dict(self._infos)


class _Session:
    def __init__(self, fnModel, dataFlow: DataFlow, deviceInfo: DeviceInfo, inputShapeInfo=None, patterns=None,
                 userOptions: SessionOptions = None, name: str = "", *, training: bool, loss=None, optimizer=None):
        if not isinstance(dataFlow, DataFlow):
            raise popart_exception(messages.DATAFLOW_TYPE.format(
                dataFlow_type=type(dataFlow).__name__))
        if deviceInfo is None:
            raise popart_exception(messages.NO_DEVICE)
        if not isinstance(deviceInfo, DeviceInfo):
            raise popart_exception(messages.DEVICE_INFO_TYPE.format(
                deviceInfo_type=type(deviceInfo).__name__))
        options = userOptions if userOptions is not None else SessionOptions()
        if not isinstance(options, SessionOptions):
            raise popart_exception(messages.USER_OPTIONS_TYPE.format(
                options_type=type(options).__name__))
        self.name = name
        self._training = training
        self._device = deviceInfo
        self._options = copy.deepcopy(options)  # PopART copies them: later changes do not reach the session
        self.dataFlow = dataFlow
        self._patterns = patterns
        if patterns is not None and hasattr(patterns, "check_mandatory"):
            patterns.check_mandatory()
        model = load_model(fnModel)
        if inputShapeInfo is not None:
            _apply_input_shapes(model, inputShapeInfo)
        self._program = GraphProgram(model)
        self._program.check_supported()
        prefix = REPLICATED_STREAM_MODE_KEY + "/"  # inputs every replica reads (ReplicatedStreamMode.Broadcast)
        self._broadcast_inputs = {p.key[len(prefix):] for p in model.metadata_props
                                  if p.key.startswith(prefix) and p.value == str(int(ReplicatedStreamMode.Broadcast))}
        self._infos = _infer_all(self._program)
        for tensor_id in self._program.input_ids:
            if self._infos[tensor_id].nelms() == 0:
                raise popart_exception(messages.ZERO_SIZED_INPUT.format(
                    tensor_id=tensor_id, shape=self._infos[tensor_id].shape()))
        # ---- options
        if int(options.replicatedGraphCount) < 1:
            raise popart_exception(messages.REPLICATION_BELOW_ONE)
        self.accumulationFactor = options.getAccumulationFactor()
        self.replicationFactor = options.local_replicas()
        if not training and options.enableGradientAccumulation:
            raise popart_exception(messages.ACCUMULATION_IN_INFERENCE)
        dataFlow.validate()
        if not training and dataFlow.nAnchors() == 0:
            raise popart_exception(messages.INFERENCE_WITHOUT_ANCHORS)
        self._bps = dataFlow.batchesPerStep()
        self._instances = distributed.instances(options)
        # ---- loss and anchors
        self._loss = None
        if training:
            if not isinstance(loss, str):
                raise popart_exception(messages.LOSS_TYPE.format(loss_type=type(loss).__name__))
            if loss not in self._infos:
                raise popart_exception(messages.LOSS_NOT_IN_MODEL.format(loss=loss))
            if self._infos[loss].nelms() > 1:
                raise popart_exception(messages.LOSS_NOT_SCALAR.format(loss=loss))
            self._loss = loss
        self._trainable = self._program.trainable_initializers()
        self._check_anchors()
        graph_checks.check(self._program, options, training=training, anchors=dataFlow.anchors(), loss=self._loss)
        loss_scaling.check(options.automaticLossScalingSettings, training=training,
                           optimizer=optimizer if isinstance(optimizer, Optimizer) else None, options=options,
                           program=self._program, infos=self._infos)
        self._plan = placement.plan(self._program, options, training=training, batches_per_step=self._bps,
                                    accumulation=self.accumulationFactor, ipus_available=deviceInfo.numIpus)
        self._check_device()
        # ---- the torch module and the executor
        fetch = [a for a in dataFlow.anchors() if not a.startswith((GRADIENT_PREFIX, UPDATED_VAR_PREFIX))]
        tapped = {a[len(GRADIENT_PREFIX):] for a in dataFlow.anchors() if a.startswith(GRADIENT_PREFIX)}
        recomputation = RecomputationType(int(options.autoRecomputation))
        self._module = OnnxGraphModule(self._program, [s.nodes for s in self._plan.segments], fetch=fetch,
                                       loss=self._loss, tapped=tapped, constant_weights=False,
                                       recomputation=RecomputationType.NoRecompute if self._plan.pipelined
                                       else recomputation)
        self._module.state.replication_factor = self.replicationFactor
        self._fetch = fetch
        self._weights = self._module.weights()
        self._host_weights = {k: v.detach().cpu().numpy().copy() for k, v in self._weights.items()}
        self._annotate_blocks()
        self._optimizer_desc = None
        self._torch_optimizer = None
        self._updated: list[dict[str, torch.Tensor]] = []
        if training:
            if not isinstance(optimizer, Optimizer):
                raise popart_exception(messages.OPTIMIZER_TYPE.format(
                    optimizer_type=type(optimizer).__name__))
            self._optimizer_desc = optimizer
            params = {k: v for k, v in self._weights.items() if isinstance(v, torch.nn.Parameter)}
            self._torch_optimizer = optimizer.to_torch(params)
            if any(a.startswith(UPDATED_VAR_PREFIX) for a in dataFlow.anchors()):
                self._torch_optimizer.register_step_post_hook(self._record_updated)
        self._poptorch_options = self._make_options()
        self._module.train(training)
        if training:
            self._executor = trainingModel(self._module, self._poptorch_options, self._torch_optimizer)
        else:
            self._executor = inferenceModel(self._module, self._poptorch_options)
        self._prepared = False
        self._weights_from_host_called = False
        self._random_seed = None
        self._steps_run = 0

    # ------------------------------------------------------------------ construction checks
    def _check_anchors(self) -> None:
        known = self._infos
        for anchor in self.dataFlow.anchors():
            if anchor.startswith(GRADIENT_PREFIX):
                base = anchor[len(GRADIENT_PREFIX):]
                if not self._training:
                    raise popart_exception(messages.ANCHOR_GRADIENT_IN_INFERENCE.format(anchor=anchor))
                if base not in known:
                    raise popart_exception(messages.ANCHOR_GRADIENT_OF_UNKNOWN.format(anchor=anchor, base=base))
            elif anchor.startswith(UPDATED_VAR_PREFIX):
                base = anchor[len(UPDATED_VAR_PREFIX):]
                if not self._training or base not in self._trainable:
                    raise popart_exception(messages.ANCHOR_NOT_AN_UPDATED_WEIGHT.format(anchor=anchor, base=base))
            elif anchor not in known:
                raise popart_exception(messages.ANCHOR_UNKNOWN_ID.format(anchor=anchor))

    def _check_device(self) -> None:
        needed = self._plan.ipus_per_replica * self.replicationFactor
        if self._device.numIpus > 1 or self._device.type.name == "Ipu":
            if self._device.numIpus % self.replicationFactor != 0:
                raise popart_exception(messages.IPUS_NOT_A_MULTIPLE_OF_REPLICAS.format(
                    numIpus=self._device.numIpus, replicationFactor=self.replicationFactor))
            if needed > self._device.numIpus:
                raise popart_exception(messages.NOT_ENOUGH_IPUS_FOR_MODEL.format(
                    needed=needed, ipus_per_replica=self._plan.ipus_per_replica,
                    replicationFactor=self.replicationFactor, numIpus=self._device.numIpus))

    def _annotate_blocks(self) -> None:
        if all(s.ipu is None for s in self._plan.segments):
            return
        for k, (segment, module) in enumerate(zip(self._plan.segments, self._module.segments)):
            annotations.BeginBlock(module, f"segment{k}", ipu_id=segment.ipu)

    def _make_options(self) -> Options:
        o = self._options
        opts = Options()
        opts.deviceIterations(self._bps)
        if self.replicationFactor > 1:
            opts.replicationFactor(self.replicationFactor)
            opts.broadcastBuffers(False)  # PopART replicas keep their own BatchNorm statistics
        mode, period = self._output_mode()
        if mode == OutputMode.EveryN:
            opts.outputMode(mode, period)
        else:
            opts.outputMode(mode)
        opts.autoRoundNumIPUs(True)
        self._choose_backend(opts)
        if self._training:
            opts.Training.gradientAccumulation(self.accumulationFactor)
            opts.Training.accumulationAndReplicationReductionType(
                PoptorchReduction(int(o.accumulationAndReplicationReductionType)))
            strategy = int(o.meanAccumulationAndReplicationReductionStrategy)
            opts.Training.setMeanAccumulationAndReplicationReductionStrategy(
                PoptorchMeanStrategy(min(strategy, 1)))  # PostAndLoss: the same numbers as Post
        if o.enableStochasticRounding:
            opts.Precision.enableStochasticRounding(True)
        if o.enableEngineCaching:  # PopART's engine cache: the executable cache, in its cachePath
            opts.enableExecutableCaching(o.cachePath)
        if self._instances is not None:
            opts.Distributed.configureProcessId(*self._instances)
        else:  # under poprun, a session without enableDistributedReplicatedGraphs runs on its own
            opts.Distributed.disable()
        recompute = RecomputationType(int(o.autoRecomputation))
        opts._Popart.set("autoRecomputation", int(recompute))
        segments = self._plan.segments
        if any(s.ipu is not None for s in segments):
            stages = [strategies.Stage(f"segment{k}").ipu(s.ipu) for k, s in enumerate(segments)]
            pipelined = self._plan.pipelined and (not self._training or self.accumulationFactor > 1)
            opts.setExecutionStrategy(strategies.PipelinedExecution(*stages) if pipelined
                                      else strategies.ShardedExecution(*stages))
        return opts

    def _output_mode(self):
        """The runtime's output mode: the anchors' common return type (a compiled program then
        keeps only what the anchors return: ``Final`` carries one step's values, not
        ``batchesPerStep`` of them), else ``All`` and the session reduces each anchor."""
        arts = {(self.dataFlow.art(a).id(), self.dataFlow.art(a).rp()) for a in self._fetch}
        if len(arts) == 1:
            art, period = next(iter(arts))
            if art == AnchorReturnTypeId.Final:
                return OutputMode.Final, 1
            if art == AnchorReturnTypeId.Sum:
                return OutputMode.Sum, 1
            if art == AnchorReturnTypeId.EveryN and self._bps % period == 0:
                return OutputMode.EveryN, period
        return OutputMode.All, 1

    def _choose_backend(self, opts: Options) -> None:
        """Eager where the session records values on the host during the step (gradient anchors:
        autograd taps per micro-batch; ``UpdatedVar`` anchors: an optimizer step hook). Else,
        unless ``OPENPOP_BACKEND`` or ``OPENPOP_COMPILE_AFTER`` says otherwise, ``auto`` compiling
        at once: ``prepareDevice`` is PopART's compile, and builds the step's program then (a graph
        the compiled backend declines runs eagerly, as fast as before the attempt). Training a graph
        whose weights are all constants (a no-op update) is eager too: no gradient to compute."""
        anchors = self.dataFlow.anchors()
        nothing_trained = self._training and not any(isinstance(w, torch.nn.Parameter)
                                                     for w in self._weights.values())
        if nothing_trained or any(a.startswith((GRADIENT_PREFIX, UPDATED_VAR_PREFIX)) for a in anchors):
            opts.openpopBackend("eager")
        elif backend_from_env("auto") == "auto" and openpop_settings.raw("compile_after") is None:
            opts.openpopBackend("auto", compile_after=0)

    # ------------------------------------------------------------------ device
    def prepareDevice(self, loadEngine: bool = True) -> None:
        """Compile: one traced micro-batch on zeros (weights, RNG and data untouched)."""
        if self._device.type.name == "OfflineIpu":
            raise popart_exception(messages.RUN_OFFLINE_DEVICE)
        if not self._prepared:
            self._executor.compile(*self._example_inputs())
            self._prepared = True

    def loadEngineAndConnectStreams(self) -> None:
        self._require_prepared("loadEngineAndConnectStreams()")

    def compileAndExport(self, filename: str) -> None:
        """Compile, and save the model with its current weights (ONNX) to ``filename``."""
        self.prepareDevice()
        self.modelToHost(filename)

    def _example_inputs(self):
        n = self._micro_batches_per_run()
        inputs = tuple(torch.zeros([n] + info.shape(), dtype=tensorinfo.torch_dtype(info.data_type()))
                       for info in self._module.input_infos)
        return (torch.arange(n, dtype=torch.int64),) + inputs

    def _micro_batches_per_run(self) -> int:
        return self._bps * self.accumulationFactor * self.replicationFactor

    def _require_prepared(self, what: str) -> None:
        if not self._prepared:
            raise popart_exception(NOT_PREPARED.format(what=what))

    # ------------------------------------------------------------------ weights
    def weightsFromHost(self) -> None:
        self._require_prepared("weightsFromHost()")
        self._weights_from_host_called = True
        if self._instances is not None:  # one model for the whole job: instance 0's
            self.broadcastWeights(0)
        with torch.no_grad():
            for name, tensor in self._weights.items():
                tensor.copy_(torch.from_numpy(self._host_weights[name]).to(tensor.device))
        if not self._training:
            self._executor.copyWeightsToDevice()

    def weightsToHost(self) -> None:
        self._require_prepared("weightsToHost()")
        if self._training:
            self._executor.copyWeightsToHost()
        for name, tensor in self._weights.items():
            self._host_weights[name] = tensor.detach().cpu().numpy().copy()

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        for name, array in weightsIo.weights.items():
            if name not in self._host_weights:
                raise popart_exception(messages.READ_WEIGHTS_UNKNOWN.format(name=name))
            _copy_into(array, self._host_weights[name], name)

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        if not self._training and self._options.constantWeights:
            raise popart_exception(messages.WRITE_WEIGHTS_WITH_CONSTANT_WEIGHTS)
        for name, array in weightsIo.weights.items():
            if name not in self._host_weights:
                raise popart_exception(messages.WRITE_WEIGHTS_UNKNOWN.format(name=name))
            if np.asarray(array).size != self._host_weights[name].size:
                raise popart_exception(messages.WRITE_WEIGHTS_SIZE_MISMATCH.format(
                    name=name, size=self._host_weights[name].size, given=np.asarray(array).size))
        for name, array in weightsIo.weights.items():
            self._host_weights[name] = np.asarray(array, self._host_weights[name].dtype).reshape(
                self._host_weights[name].shape).copy()

    def modelToHost(self, fn: str) -> None:
        """Write the model with the device's current weights to the ONNX file ``fn``."""
        self._require_prepared("weightsToHost(const std::map<TensorId, MutableVoidData> &)")
        self.weightsToHost()
        proto = onnx.ModelProto()
        proto.CopyFrom(self._program.model)
        for init in proto.graph.initializer:
            if init.name in self._host_weights:
                if external_data.is_external(init):  # back into its file, the model keeps pointing there
                    external_data.write_back(init, self._host_weights[init.name])
                else:
                    init.CopyFrom(numpy_helper.from_array(self._host_weights[init.name], init.name))
        onnx.save(proto, fn)

    def updateExternallySavedTensorLocations(self, fromLocation: str, toLocation: str) -> None:
        """Copy the file of externally saved weights, and write them there from now on."""
        external_data.relocate(self._program.model, fromLocation, toLocation)

    def resetHostWeights(self, modelProtoOrFilename, ignoreWeightsInModelWithoutCorrespondingHostWeight=False):
        """Replace the host weights by the initializers of another copy of the model (then call
        ``weightsFromHost``)."""
        if not self._training and self._options.constantWeights:
            raise popart_exception(messages.RESET_HOST_WEIGHTS_WITH_CONSTANT_WEIGHTS)
        proto = load_model(modelProtoOrFilename)
        found = {i.name: external_data.to_array(i) for i in proto.graph.initializer}
        for name, value in found.items():
            if name not in self._host_weights:
                if ignoreWeightsInModelWithoutCorrespondingHostWeight:
                    continue
                raise popart_exception(messages.RESET_HOST_WEIGHTS_UNKNOWN.format(name=name))
            if value.shape != self._host_weights[name].shape:
                raise popart_exception(messages.RESET_HOST_WEIGHTS_SHAPE_MISMATCH.format(
                    name=name, shape=list(value.shape), expected=list(self._host_weights[name].shape)))
        for name, value in found.items():
            if name in self._host_weights:
                self._host_weights[name] = np.array(value, copy=True)

    # ------------------------------------------------------------------ run
    def initAnchorArrays(self) -> dict[str, np.ndarray]:
        return {anchor: np.zeros(self._anchor_shape(anchor), dtype=self._anchor_dtype(anchor))
                for anchor in self.dataFlow.anchors()}

    def _anchor_info(self, anchor: str) -> tensorinfo.TensorInfo:
        for prefix in (GRADIENT_PREFIX, UPDATED_VAR_PREFIX):
            if anchor.startswith(prefix):
                return self._infos[anchor[len(prefix):]]
        return self._infos[anchor]

    def _anchor_dtype(self, anchor):
        return tensorinfo.numpy_dtype(self._anchor_info(anchor).data_type())

    def _anchor_shape(self, anchor: str) -> list[int]:
        art = self.dataFlow.art(anchor)
        prefix = [self.replicationFactor]
        if art.id() == AnchorReturnTypeId.All:
            prefix = [self._bps, self.accumulationFactor] + prefix
        elif art.id() == AnchorReturnTypeId.EveryN:
            prefix = [self._bps // art.rp(), self.accumulationFactor] + prefix
        return [d for d in prefix if d != 1] + self._anchor_info(anchor).shape()

    def run(self, stepio, debugName: str = "") -> None:
        """One step: ``batchesPerStep`` batches (training: weight updates)."""
        if not isinstance(stepio, (PyStepIO, PyStepIOCallback)):
            if isinstance(stepio, str) and isinstance(debugName, (PyStepIO, PyStepIOCallback)):
                stepio = debugName  # run(programHandle, stepio)
            else:
                raise popart_exception(messages.STEPIO_TYPE.format(
                    stepio_type=type(stepio).__name__))
        self._require_prepared("run()")
        if self._training and self._host_weights and not self._weights_from_host_called:
            raise popart_exception(messages.WEIGHTS_FROM_HOST_BEFORE_RUN)
        inputs = self._gather_inputs(stepio)
        n = self._micro_batches_per_run()
        self._module.state.reset()
        self._updated = []
        result = self._executor(torch.arange(n, dtype=torch.int64), *inputs)
        self._steps_run += 1
        outputs = self._anchor_values(result)
        self._deliver(stepio, outputs)

    def _gather_inputs(self, stepio):
        o = self._options
        n = self._micro_batches_per_run()
        synthetic = SyntheticDataMode(int(o.syntheticDataMode))
        tensors = []
        for tensor_id, info in zip(self._module.input_ids, self._module.input_infos):
            dtype = tensorinfo.numpy_dtype(info.data_type())
            if synthetic != SyntheticDataMode.Off:
                tensors.append(_synthetic([n] + info.shape(), dtype, synthetic))
                continue
            if isinstance(stepio, PyStepIOCallback):
                chunks = []
                for _ in range(n):
                    chunk = np.asarray(stepio.input_callback(tensor_id, False))
                    if stepio.runtimeAssertsEnabled() and chunk.size != info.nelms():
                        raise popart_exception(messages.INPUT_ELEMENT_COUNT.format(
                            tensor_id=tensor_id, nelms=info.nelms(), size=chunk.size))
                    chunks.append(np.asarray(chunk, dtype).reshape(info.shape()))
                    stepio.input_complete_callback(tensor_id)
                tensors.append(torch.from_numpy(np.stack(chunks)))
                continue
            if tensor_id not in stepio.inputs:
                raise popart_exception(messages.STEPIO_INPUT_MISSING.format(
                    tensor_id=tensor_id, input_ids=', '.join(self._module.input_ids)))
            array = np.asarray(stepio.inputs[tensor_id])
            broadcast = tensor_id in self._broadcast_inputs
            if stepio.runtimeAssertsEnabled():
                check_input_size(tensor_id, array, info.nelms(), int(o.replicatedGraphCount),
                                 int(o.accumulationFactor), self._bps, broadcast)
            given = n // self.replicationFactor if broadcast else n
            if array.size != given * info.nelms():
                raise popart_exception(messages.INPUT_ELEMENT_COUNT.format(
                    tensor_id=tensor_id, nelms=given * info.nelms(), size=array.size))
            if broadcast:  # [bps * accl, *S] -> the same micro-batch for each replica: [bps * accl * repl, *S]
                array = np.repeat(array.reshape([given, 1] + info.shape()), self.replicationFactor, axis=1)
            if array.dtype != dtype:
                if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                    raise popart_exception(messages.INPUT_DATA_TYPE_MISMATCH.format(
                        tensor_id=tensor_id, dtype=array.dtype, data_type=info.data_type()))
                array = array.astype(dtype)
            tensors.append(torch.from_numpy(np.ascontiguousarray(array).reshape([n] + info.shape()).copy()))
        return tuple(tensors)

    def _per_micro_batch(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, *S]`` in run order -> ``[bps, accl, repl, *S]``."""
        return values.reshape(self._bps, self.accumulationFactor, self.replicationFactor, *values.shape[1:])

    def _anchor_values(self, result) -> dict[str, torch.Tensor]:
        if result is None:
            result = ()
        if isinstance(result, torch.Tensor):
            result = (result,)
        offset = 1 if self._training else 0
        values = {}
        mode, period = self._output_mode()
        for k, anchor in enumerate(self._fetch):
            raw = result[offset + k]
            if mode == OutputMode.All:
                values[anchor] = self._per_micro_batch(raw)
            elif mode == OutputMode.EveryN:  # every period-th step's micro-batches
                shape = self._infos[anchor].shape()
                values[anchor] = raw.reshape(self._bps // period, self.accumulationFactor, self.replicationFactor,
                                             *shape)
            else:  # Final: the last micro-batch's, Sum: the sum over steps and accumulation; per replica
                values[anchor] = raw.reshape(1, 1, self.replicationFactor, *self._infos[anchor].shape())
        state = self._module.state
        n = self._micro_batches_per_run()
        scaling = self._optimizer_desc.getLossScalingVal() if self._optimizer_desc is not None else 1.0
        for anchor in self.dataFlow.anchors():
            if anchor.startswith(GRADIENT_PREFIX):
                base = anchor[len(GRADIENT_PREFIX):]
                recorded = state.gradients.get(base, {})
                shape = self._infos[base].shape()
                rows = []
                for i in range(n):
                    grad = recorded.get(i)
                    seed = state.seeds.get(i)
                    if grad is None or seed is None:
                        rows.append(torch.zeros(shape))
                    else:
                        rows.append(grad.float() / seed.float() * scaling)
                values[anchor] = self._per_micro_batch(torch.stack(rows).reshape([n] + shape))
            elif anchor.startswith(UPDATED_VAR_PREFIX):
                base = anchor[len(UPDATED_VAR_PREFIX):]
                steps = [u[base] for u in self._updated]
                if len(steps) < self._bps:  # a skipped update (non-finite gradients): the weight is unchanged
                    steps += [self._weights[base].detach().cpu().clone()] * (self._bps - len(steps))
                stacked = torch.stack(steps)
                values[anchor] = stacked.reshape(self._bps, 1, 1, *stacked.shape[1:]).expand(
                    self._bps, self.accumulationFactor, self.replicationFactor, *stacked.shape[1:])
        reduced = {}
        for anchor, value in values.items():
            art = self.dataFlow.art(anchor)
            if art.id() == AnchorReturnTypeId.All:
                out = value
            elif mode != OutputMode.All and anchor in self._fetch:  # reduced by the runtime
                out = value if mode == OutputMode.EveryN else value[-1, -1]
            elif art.id() == AnchorReturnTypeId.EveryN:
                out = value[art.rp() - 1::art.rp()]
            elif art.id() == AnchorReturnTypeId.Final:
                out = value[-1, -1]
            else:
                out = value.sum(dim=(0, 1))
            reduced[anchor] = out
        return reduced

    def _deliver(self, stepio, outputs: dict[str, torch.Tensor]) -> None:
        for anchor, value in outputs.items():
            dtype = self._anchor_dtype(anchor)
            array = value.detach().cpu().numpy().astype(dtype, copy=False)
            if isinstance(stepio, PyStepIOCallback):
                per = self._anchor_info(anchor).nelms()
                rows = array.reshape(-1, per) if per else array.reshape(-1, 0)
                for row in rows:
                    target = stepio.output_callback(anchor)
                    _copy_into(target, row, anchor)
                    stepio.output_complete_callback(anchor)
                continue
            if anchor not in stepio.outputs:
                continue
            target = stepio.outputs[anchor]
            if stepio.runtimeAssertsEnabled() and np.asarray(target).size != array.size:
                raise popart_exception(OUTPUT_SIZE_ERROR.format(id=anchor, expected=array.size,
                                                                got=np.asarray(target).size))
            _copy_into(target, array, anchor)

    def _record_updated(self, optimizer, args, kwargs) -> None:
        self._updated.append({name: p.detach().cpu().clone() for name, p in self._weights.items()
                              if isinstance(p, torch.nn.Parameter)})

    # ------------------------------------------------------------------ misc
    def setRandomSeed(self, seedValue: int) -> None:
        """Seeds the random number generator used by dropout and random ops."""
        self._random_seed = int(seedValue)
        torch.manual_seed(int(seedValue))

    def getRandomSeed(self) -> Optional[int]:
        return self._random_seed

    def getInfo(self, id: str) -> tensorinfo.TensorInfo:
        if id not in self._infos:
            raise popart_exception(messages.NO_SUCH_TENSOR.format(id=id))
        return self._infos[id]

    def hasInfo(self, id: str) -> bool:
        return id in self._infos

    def getAllTensorIds(self):
        return set(self._infos)

    def getCycleCount(self, id: str = "") -> int:
        return 0

    def getSummaryReport(self, resetProfile: bool = True) -> str:
        lines = [f"openpop PopART session '{self.name}': {len(self._program.nodes)} ops, "
                 f"{len(self._plan.segments)} segment(s), pipelined={self._plan.pipelined}"]
        return "\n".join(lines)

    def getReport(self) -> str:
        return self.getSummaryReport()

    def getSerializedGraph(self) -> bytes:
        return self._program.model.SerializeToString()

    def broadcastWeights(self, rootRank: int = 0) -> None:
        """Make every poprun instance's host copy of the weights equal instance ``rootRank``'s, as
        PopART's (it broadcasts the weights' host data; ``weightsFromHost`` then writes them to the
        device). Works before ``prepareDevice``; a no-op outside a distributed job."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        nccl = dist.get_backend() == "nccl"
        for name in sorted(self._host_weights):
            buffer = torch.from_numpy(np.ascontiguousarray(self._host_weights[name])).clone()
            if nccl:
                buffer = buffer.to(self._weights[name].device)
            dist.broadcast(buffer, src=int(rootRank))
            self._host_weights[name] = buffer.cpu().numpy()

    def updateEngineCache(self) -> None:
        pass

    def getExecutionReport(self, *args, **kwargs) -> str:
        return self.getSummaryReport()

    @property
    def executor(self):
        """The openpop ``PoplarExecutor`` running this session (openpop extension)."""
        return self._executor


class InferenceSession(_Session):
    def __init__(self, fnModel, dataFlow, deviceInfo, inputShapeInfo=None, patterns=None, userOptions=None,
                 name: str = "inference"):
        super().__init__(fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name, training=False)


class TrainingSession(_Session):
    def __init__(self, fnModel, dataFlow, loss, optimizer, deviceInfo, inputShapeInfo=None, patterns=None,
                 userOptions=None, name: str = "training"):
        super().__init__(fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name, training=True,
                         loss=loss, optimizer=optimizer)

    def updateOptimizerFromHost(self, optimizer: Optimizer) -> None:
        self._optimizer_desc.check_update(optimizer)
        params = {k: v for k, v in self._weights.items() if isinstance(v, torch.nn.Parameter)}
        new = optimizer.to_torch(params)
        self._executor.setOptimizer(new)
        self._optimizer_desc = optimizer

    def connectStreamToCallback(self, *args, **kwargs):
        raise popart_exception(messages.CONNECT_STREAM_TO_CALLBACK_UNSUPPORTED)


def _copy_into(target, values: np.ndarray, name: str) -> None:
    target_array = np.asarray(target)
    if target_array.size != np.asarray(values).size:
        raise popart_exception(messages.BUFFER_SIZE_MISMATCH.format(
            name=name, size=target_array.size, expected=np.asarray(values).size))
    np.copyto(target_array, np.asarray(values).reshape(target_array.shape), casting="unsafe")


def _synthetic(shape, dtype, mode):
    if mode == SyntheticDataMode.Zeros:
        return torch.zeros(shape, dtype=tensorinfo.torch_dtype(tensorinfo.popart_name(dtype)))
    generator = np.random.default_rng(0)
    if mode == SyntheticDataMode.RandomNormal:
        data = generator.standard_normal(shape)
    else:
        data = generator.uniform(-1, 1, shape)
    return torch.from_numpy(np.asarray(data).astype(dtype))


def _apply_input_shapes(model, shape_info: InputShapeInfo) -> None:
    for value in model.graph.input:
        if shape_info.has(value.name):
            info = shape_info.get(value.name)
            value.type.CopyFrom(type_of(info.data_type(), info.shape()))


def _infer_all(program: GraphProgram) -> dict[str, tensorinfo.TensorInfo]:
    """Type every tensor of the model, naming the node on failure (PopART checks shapes when it
    builds its IR)."""
    inference = ShapeInference(dict(program.opsets, **{"": program.opsets["ai.onnx"]}))
    for name, value in program.initializers.items():
        inference.add_value(name, type_of(tensorinfo.popart_name(value.dtype), value.shape),
                            numpy_helper.from_array(value, name))
    for name in program.input_ids:
        type_proto = program.input_types[name]
        if info_of(type_proto) is None:
            raise popart_exception(messages.INPUT_TENSOR_HAS_NO_COMPLETE_SHAPE.format(tensor_id=name))
        inference.add_value(name, type_proto)
    graph = onnx.GraphProto()
    graph.node.extend(program.nodes)
    inference.run(graph)
    infos = {}
    for name, type_proto in inference.types.items():
        info = info_of(type_proto)
        if info is not None:
            infos[name] = info
    return infos
