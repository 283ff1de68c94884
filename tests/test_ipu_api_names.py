"""The IPU-stack names Graphcore's code uses: PopART's enumerations with PopART's values, the
``torch.ops.poptorch`` operators, PopART's option structs, and the census tool that lists what
real code reaches (examples/graphcore/census.py)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import popart
import poptorch

# Every enumeration of PopART's Python bindings (popart_core), members and values as PopART
# numbers them (its C++ enums).
POPART_ENUMS = {
    "AccumulateOuterFragmentSchedule": {
        "Scheduler": 0, "Serial": 1, "OverlapCycleOptimized": 2, "OverlapMemoryOptimized": 3,
    },
    "AdamMode": {"Adam": 0, "AdamNoBias": 1, "Lamb": 3, "LambNoBias": 4, "AdaMax": 2},
    "AdaptiveMode": {"AdaGrad": 0, "RMSProp": 1, "CenteredRMSProp": 2, "AdaDelta": 3},
    "AnchorReturnTypeId": {"Final": 0, "EveryN": 1, "All": 2, "Sum": 3},
    "AutodiffStitchStrategy": {
        "RecomputeMinimal": 0, "RecomputeAllNonInputs": 1, "AddFwdOutputs": 2, "SafeAddFwdOutputs": 3,
    },
    "BatchSerializationBatchSchedule": {"Scheduler": 0, "Isomorphic": 1, "OverlapOnIo": 2, "OverlapOnCompute": 3},
    "BatchSerializationMethod": {"UnrollDynamic": 0, "UnrollStatic": 1, "Loop": 2},
    "BatchSerializationTransformContext": {"Forward": 0, "Backward": 1, "Fwd": 0, "Bwd": 1},
    "CollectiveOperator": {
        "Add": 0, "Mean": 1, "Mul": 2, "Min": 3, "Max": 4, "LogicalAnd": 5, "LogicalOr": 6, "SquareAdd": 7,
        "Local": 8,
    },
    "CommGroupType": {"All": 0, "Consecutive": 1, "Orthogonal": 2, "Ungrouped": 3},
    "DeviceConnectionType": {"Always": 0, "OnDemand": 1, "Never": 2},
    "DeviceSelectionCriterion": {"First": 0, "Random": 1},
    "DeviceType": {"IpuModel": 0, "Cpu": 1, "Ipu": 2, "OfflineIpu": 3, "Sim": 4},
    "ExchangeStrategy": {"JustInTime": 0, "OverlapInnerLoop": 1, "OverlapLoops": 2, "OverlapStep": 3},
    "ExecutionPhaseIOSchedule": {"Preload": 0, "OnDemand": 1},
    "ExecutionPhaseSchedule": {"Interleaving": 0, "Batch": 1, "BatchClusteredIO": 2},
    "GradientTensorTrackingMethod": {
        "ConvAndMatmulGradients": 1, "AllNonViewChangingGradientTensors": 0, "GradientsOfUserSpecifiedTensors": 2,
    },
    "InitType": {"NoInit": 0, "Zero": 1},
    "Instrumentation": {"Outer": 0, "Inner": 1},
    "IrSerializationFormat": {"JSON": 0},
    "MeanReductionStrategy": {"Running": 0, "Post": 1},
    "MergeVarUpdateType": {"Off": 0, "All": 1, "AutoTight": 3, "AutoLoose": 2},
    "PatternsLevel": {"All": 3, "Default": 2, "Minimal": 1, "NoPatterns": 0},
    "RecomputationType": {"NoRecompute": 0, "Standard": 1, "NormOnly": 2, "RecomputeAll": 4, "Pipeline": 3},
    "RecomputeType": {"Undefined": 0, "Checkpoint": 1, "Recompute": 2, "Recomputed": 3},
    "RecoveryAction": {"IPU_RESET": 0, "LINK_RESET": 1, "PARTITION_RESET": 2, "FULL_RESET": 3},
    "ReductionType": {"Mean": 1, "NoReduction": 2, "Sum": 0},
    "ReplicatedStreamMode": {"Replicate": 1, "Broadcast": 0},
    "ReplicatedTensorSharding": {"Off": 0, "On": 1},
    "SGDAccumulatorAndMomentum": {"Combined": 0, "Separate": 1},
    "ScatterReduction": {"Sum": 0, "Max": 1, "Min": 2, "Mul": 3, "NoReduction": 4},
    "SubgraphCopyingStrategy": {"OnEnterAndExit": 0, "JustInTime": 1},
    "SyncPattern": {"Full": 0, "SinglePipeline": 1, "ReplicaAndLadder": 2},
    "SyntheticDataMode": {"Off": 0, "Zeros": 1, "RandomNormal": 2, "RandomUniform": 3},
    "TensorRemapType": {"FwdBwdReverse": 0, "FwdBwd": 1, "Fwd": 2},
    "TensorStorage": {"OnChip": 0, "OffChip": 1},
    "TileSet": {"Compute": 0, "IO": 1},
    "VariableRetrievalMode": {"OnePerGroup": 0, "AllReduceReplicas": 1, "AllReplicas": 2},
    "VirtualGraphMode": {"Off": 0, "Manual": 1, "Auto": 2, "ExecutionPhases": 3},
    "WeightDecayMode": {"Decay": 0, "L2Regularization": 1},
}


@pytest.mark.parametrize("name", sorted(POPART_ENUMS))
def test_popart_enumerations_have_popart_members_and_values(name):
    enumeration = getattr(popart, name)
    assert {member: int(getattr(enumeration, member)) for member in POPART_ENUMS[name]} == POPART_ENUMS[name]


@pytest.mark.parametrize("key, dtype", [("FLOAT", torch.float32), ("FLOAT16", torch.float16),
                                        ("float16", torch.float16), ("INT32", torch.int32),
                                        ("BFLOAT16", torch.bfloat16)])
def test_internal_cast_casts_to_the_named_popart_type(key, dtype):
    x = torch.randn(4, dtype=torch.float64)
    assert torch.ops.poptorch.internal_cast(x, key).dtype == dtype


def test_internal_cast_is_differentiable_and_compiles():
    x = torch.randn(5, requires_grad=True)

    def gelu_in_float(t):  # the pattern of Graphcore's DINO: a float32 GELU inside a half model
        out = torch.nn.functional.gelu(torch.ops.poptorch.internal_cast(t.half(), "FLOAT"))
        return torch.ops.poptorch.internal_cast(out, "FLOAT16")

    eager = gelu_in_float(x)
    eager.float().sum().backward()
    grad = x.grad.clone()
    x.grad = None
    compiled = torch.compile(gelu_in_float, fullgraph=True, backend="aot_eager")(x)
    compiled.float().sum().backward()
    assert eager.dtype == compiled.dtype == torch.float16
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(x.grad, grad)


def test_internal_cast_names_the_known_types_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown type 'FLOAT8'.*FLOAT16"):
        torch.ops.poptorch.internal_cast(torch.ones(1), "FLOAT8")


def test_name_scope_operators_push_and_pop_poptorch_name_scopes():
    torch.ops.poptorch.push_name_scope("encoder")
    torch.ops.poptorch.push_name_scope("layer0")
    assert poptorch.NameScope.current() == "encoder/layer0"
    torch.ops.poptorch.pop_name_scope()
    torch.ops.poptorch.pop_name_scope()
    assert poptorch.NameScope.current() == ""
    torch.ops.poptorch.pop_name_scope()  # an unmatched pop is harmless, as on the IPU


@pytest.mark.parametrize("code, reduction", [(0, "sum"), (1, "mean"), (2, "none")])
def test_identity_loss_operator_takes_poptorch_reduction_codes(code, reduction):
    x = torch.arange(6.0).reshape(2, 3)
    expected = {"sum": x.sum(), "mean": x.mean(), "none": x}[reduction]
    torch.testing.assert_close(torch.ops.poptorch.identity_loss(x, code), expected)
    with pytest.raises(ValueError, match="reduction 7"):
        torch.ops.poptorch.identity_loss(x, 7)


def test_identity_like_operators_return_their_input_values():
    x = torch.randn(3, requires_grad=True)
    for out in (torch.ops.poptorch.nop(x), torch.ops.poptorch.set_available_memory(x, 0.3),
                torch.ops.poptorch.set_matmul_serialization(x, "output_channels", 2, False),
                torch.ops.poptorch.set_overlap_for_input(x, "OverlapAccumulationLoop"),
                torch.ops.poptorch.recomputation_checkpoint(x)):
        torch.testing.assert_close(out, x)
    start = torch.tensor([1])
    torch.testing.assert_close(torch.ops.poptorch.dynamic_slice(x, 0, start, 2, 1), x[1:3])


def test_tensor_location_constructors_follow_popart():
    plain = popart.TensorLocation(popart.TensorStorage.OffChip)
    assert plain.storage == popart.TensorStorage.OffChip
    assert plain.replicatedTensorSharding == popart.ReplicatedTensorSharding.Off
    sharded = popart.TensorLocation(popart.TensorStorage.OnChip, popart.ReplicatedTensorSharding.On)
    assert sharded.replicatedTensorSharding == popart.ReplicatedTensorSharding.On
    tiles = popart.TensorLocation(popart.TensorStorage.OffChip, popart.TileSet.IO, popart.TileSet.Compute,
                                  popart.ReplicatedTensorSharding.On, popart.CommGroup(popart.CommGroupType.All, 0))
    assert (tiles.loadTileSet, tiles.storageTileSet) == (popart.TileSet.IO, popart.TileSet.Compute)
    assert tiles.shardingDomain.type == popart.CommGroupType.All


def test_session_options_underscored_fields_share_the_value():
    options = popart.SessionOptions()
    options._engineOptions = {"debug.allowOutOfMemory": "true"}
    assert options.engineOptions == {"debug.allowOutOfMemory": "true"}
    assert options.experimentalSettings.createHostTransferableTensorWithOffset is False
    assert (options.defaultBufferingDepth, options.groupNormStridedChannelGrouping) == (1, False)


def test_poptorch_accepts_the_popart_keys_graphcores_applications_set():
    opts = poptorch.Options()
    opts._Popart.set("accumulateOuterFragmentSettings.schedule",
                     int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized))
    opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
    opts._Popart.set("defaultBufferingDepth", 2)
    assert opts._Popart.options["subgraphCopyingStrategy"] == 1


# -- the census tool
def _census():
    path = Path(__file__).resolve().parents[1] / "examples" / "graphcore" / "census.py"
    spec = importlib.util.spec_from_file_location("openpop_census", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


APPLICATION = '''
import poptorch as pt
import popart
from poptorch.optim import AdamW
import torch

def options(config):
    opts = pt.Options()
    opts.deviceIterations(4)
    opts.Training.gradientAccumulation(8)
    opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
    opts._Popart.set("noSuchSessionOption", 1)
    opts.notAnOptionsMethod()
    config.options.get("x")          # a dict called "options": not an Options method
    torch.ops.poptorch.push_name_scope("a")
    return pt.NotInPopTorch
'''


def test_census_finds_names_options_and_keys_and_flags_what_is_missing(tmp_path):
    census = _census()
    app = tmp_path / "vision" / "net" / "pytorch"
    app.mkdir(parents=True)
    (app / "train.py").write_text(APPLICATION)
    (tmp_path / "vision" / "net" / "tensorflow2").mkdir()
    (tmp_path / "vision" / "net" / "tensorflow2" / "train.py").write_text("import popart\npopart.Missing\n")
    rows, unresolved = census.report(census.collect([tmp_path]))
    found = {(kind, name): ok for kind, name, _apps, _uses, ok, _where in rows}
    assert found[("name", "poptorch.optim.AdamW")] and found[("name", "poptorch.Options")]
    assert found[("name", "popart.SubgraphCopyingStrategy.JustInTime")]
    assert found[("name", "torch.ops.poptorch.push_name_scope")]
    assert found[("Options method", "deviceIterations")] and found[("Options method", "Training.gradientAccumulation")]
    assert found[("_Popart key", "subgraphCopyingStrategy")]
    assert not found[("_Popart key", "noSuchSessionOption")]
    assert not found[("Options method", "notAnOptionsMethod")]
    assert not found[("name", "poptorch.NotInPopTorch")]
    assert ("Options method", "get") not in found
    assert ("name", "popart.Missing") not in found  # other frameworks' folders are skipped
    assert unresolved == 3


@pytest.mark.slow
def test_horovod_resolves_to_the_compatibility_layer_in_one_process_once_poptorch_is_imported():
    """Graphcore's BERT imports ``horovod.torch`` at the top of a module it uses without poprun."""
    import subprocess
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec('horovod') is not None\n"
            "import poptorch\n"
            "import horovod.torch as hvd\n"
            "hvd.init()\n"
            "print(real or (hvd.rank(), hvd.size()) == (0, 1))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
