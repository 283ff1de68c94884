"""Bad input at every door, fuzzed (issue 29 item 4): the files, strings and command lines users
give openpop either work or raise openpop's / PopTorch's / PopART's documented error type with a
message naming the fix; never a raw exception from deep inside (a bare KeyError, an
AttributeError on a built-in type, a UnicodeDecodeError, protobuf's DecodeError, a YAML error),
never a hang, never a partly changed state.

The Hypothesis profile of tests/conftest.py makes every run draw the same examples (derandomize,
no database, no deadline); each test keeps its max_examples small (``OPENPOP_FUZZ_SCALE=20``
multiplies them, to fuzz harder by hand). Examples fuzzing once found a raw exception with are kept
as ``@example``s.
"""
import contextlib
import copy
import io
import json
import os
import re
import signal
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import poptorch
from openpop.errors import ConfigFileError

# The fuzzed Options lines call deprecated setters too: their warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Python's own words for a type or lookup error deep inside a parser: a clear error never reads so.
RAW_WORDS = re.compile(
    r"object has no attribute|object is not (iterable|subscriptable|callable)|invalid literal for|"
    r"Overflow when|codec can't (de|en)code|unsupported operand|not supported between instances|"
    r"index out of range|unhashable type|embedded null (byte|character)|argument must be|"
    r"object cannot be interpreted|maximum recursion depth|not JSON serializable")
# Exceptions that always mean a parser let something through.
RAW_TYPES = (KeyError, IndexError, UnicodeError, RecursionError, ZeroDivisionError, OverflowError)



def examples(count):
    """``count`` examples, times ``OPENPOP_FUZZ_SCALE`` (e.g. 20 to fuzz harder by hand)."""
    return max(1, round(count * float(os.environ.get("OPENPOP_FUZZ_SCALE", "1"))))


class Hang(BaseException):
    """Raised into a parser that ran past its time (BaseException: no ``except Exception`` swallows it)."""


@contextlib.contextmanager
def no_hang(seconds=20):
    """Fail, instead of waiting forever, when the code inside runs past ``seconds`` (main thread only)."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s: a hang")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def working_directory(path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(previous)


def assert_clear(error, allowed):
    """``error`` is one of the ``allowed`` types and reads as a message, not as Python's complaint."""
    assert isinstance(error, allowed), f"{type(error).__module__}.{type(error).__name__}: {error}"
    assert not isinstance(error, RAW_TYPES), f"{type(error).__name__}: {error}"
    assert not RAW_WORDS.search(str(error)), f"{type(error).__name__}: {error}"


# =========================================================================== Options.loadFromFile
def _holders(options):
    return [options, options._training, options._precision, options._distributed, options._tensor_locations,
            options._jit]


def options_state(options):
    """Everything a file of setter calls can change: each group's class, values and explicitly set
    names, the PopART options, the execution strategy, and torch's random generator (randomSeed)."""
    import torch
    return ([(type(h), repr(h._values), sorted(h._explicit)) for h in _holders(options)],
            repr(options._Popart.options), id(options._execution_strategy), torch.get_rng_state())


def assert_same_state(before, after):
    assert before[:3] == after[:3]
    assert bool((before[3] == after[3]).all()), "loading a file that failed reseeded torch"


_ARGUMENTS = st.sampled_from([
    "0", "1", "2", "-1", "3", "True", "False", "None", "1.5", "-0.5", "float('nan')", "float('inf')", "2**70",
    "-2**70", "'a'", "''", "'IPU0'", "'/tmp'", "'cpu'", "'eager'", "'compiled'", "'float16'", "[]", "['cpu']",
    "[1]", "{}", "{'IPU0': 0.5}", "{'IPU0': 'x'}", "{'IPU1': -1}", "{'GPU': 1}", "{1: 2}",
    "torch.float16", "torch.float32", "torch.int8", "poptorch.OutputMode.All", "poptorch.OutputMode.EveryN",
    "OutputMode.Sum", "ReductionType.Sum", "ReductionType.NoReduction", "CommGroupType.All",
    "CommGroupType.Orthogonal", "poptorch.MeanReductionStrategy.Running", "poptorch.ShardedExecution()",
    "poptorch.PipelinedExecution('a', 'b')", "poptorch.AutoStage.AutoIncrement",
    "poptorch.TensorLocationSettings()", "SyncPattern.Full", "ConnectionType.Never", "'HOME'", "'PATH'",
    "'NO_SUCH_VARIABLE'"])


def _setters():
    """Every public method of Options and its groups, as a file line names it."""
    options = poptorch.Options()
    names = []
    for prefix, holder in [("", options), ("Training.", options.Training), ("Precision.", options.Precision),
                           ("Distributed.", options.Distributed), ("TensorLocations.", options.TensorLocations),
                           ("Jit.", options.Jit), ("_Popart.", options._Popart)]:
        for name in dir(type(holder)):
            if not name.startswith("_") and callable(getattr(holder, name)) and name != "loadFromFile":
                names.append(prefix + name)
    return sorted(names)


_CALL = st.builds(lambda setter, args: f"{setter}({', '.join(args)})",
                  st.sampled_from(_setters()), st.lists(_ARGUMENTS, max_size=3))
_ASSIGNMENT = st.builds(lambda name, value: f"{name} = {value}",
                        st.sampled_from(["device_iterations", "replication_factor", "Training.gradient_accumulation",
                                         "log_dir", "no_such_option", "Distributed.__class__"]), _ARGUMENTS)
_LINE = st.one_of(_CALL, _CALL, _CALL, _ASSIGNMENT, st.sampled_from(["", "# a comment", "deviceIterations(",
                                                                      "import os", "x"]),
                  st.text(st.characters(blacklist_categories=["Cs"]), max_size=12))


def _load(options, content):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "options.cfg")
        with open(path, "wb") as stream:
            stream.write(content)
        before = options_state(options)
        try:
            with no_hang():
                options.loadFromFile(path)
        except Exception as error:
            assert_same_state(before, options_state(options))
            return error
    return None


LOAD_ERRORS = (ConfigFileError, poptorch.Error, AssertionError, ValueError, TypeError, AttributeError, NameError)


@settings(max_examples=examples(120))
@given(lines=st.lists(_LINE, min_size=1, max_size=4))
@example(lines=["randomSeed(2**70)"])
@example(lines=["randomSeed(7)", "deviceIterations(0)"])
@example(lines=["setAvailableMemoryProportion(3)"])
@example(lines=["deviceMap(5)"])
@example(lines=["Distributed.setEnvVarNames('HOME', 'PATH')"])
def test_options_files_of_setter_calls(lines):
    """A file of setter calls either applies, or raises and leaves the options as they were."""
    options = poptorch.Options()
    error = _load(options, "\n".join(lines).encode())
    if error is None:
        return
    assert_clear(error, LOAD_ERRORS)
    if not isinstance(error, ConfigFileError):
        assert any(re.match(r"\(applying line \d+ of ", note) for note in getattr(error, "__notes__", [])), error


@settings(max_examples=examples(40))
@given(content=st.binary(max_size=40))
@example(content=b"deviceIterations(2)\n\xff\xfe\n")
@example(content=b"deviceIterations(\x00)")
def test_options_files_of_any_bytes(content):
    options = poptorch.Options()
    error = _load(options, content)
    if error is not None:
        assert_clear(error, LOAD_ERRORS)


def test_an_options_file_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "options.cfg"
    path.write_bytes(b"deviceIterations(2)\nlogDir('caf\xe9')\n")
    options = poptorch.Options()
    with pytest.raises(ConfigFileError, match=r"line 2 of .*options.cfg is not UTF-8 text \(byte 31 of the file\)"):
        options.loadFromFile(str(path))
    assert options.device_iterations == 1


# ================================================================ Options.from_json, POPTORCH_DEFAULT_OPTIONS
_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.integers(2**62, 2**70),
                          st.floats(allow_nan=False), st.text(max_size=6),
                          st.sampled_from(["OutputMode.All", "poptorch.OutputMode.EveryN", "ReductionType.Sum",
                                           "CommGroupType.All", "IPU0", "cpu", "eager", "bf16"]))
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=4), inner, max_size=2), max_leaves=5)
_JSON_PATHS = st.one_of(st.sampled_from([name for name in _setters() if "." not in name or name.count(".") == 1]),
                        st.sampled_from(["device_iterations", "Training.gradient_accumulation", "log_dir",
                                         "Training.nothing", "Nothing.deviceIterations", "", ".", "a..b",
                                         "_popart_x"]),
                        st.text(max_size=8))
_OPTIONS_JSON = st.one_of(
    st.dictionaries(_JSON_PATHS, _JSON_VALUES, max_size=3).map(json.dumps),
    _JSON_VALUES.map(json.dumps),
    st.text(max_size=20))
JSON_ERRORS = (poptorch.Error, AssertionError, ValueError, TypeError, AttributeError)


@settings(max_examples=examples(60))
@given(text=_OPTIONS_JSON)
@example(text='{"deviceIterations": 4, "replicationFactor": 0}')
@example(text='{"randomSeed": 3, "deviceIterations": "x"}')
@example(text="[" * 5000)
@example(text="[1, 2]")
@example(text='{"modelName": 5}')
@example(text='{"exists": {}}')
@example(text='{"Distributed.deleteIfExists": {}}')
def test_options_from_json(text):
    options = poptorch.Options()
    before = options_state(options)
    try:
        options.from_json(text)
    except Exception as error:
        assert_clear(error, JSON_ERRORS)
        assert_same_state(before, options_state(options))


@settings(max_examples=examples(30))
@given(text=_OPTIONS_JSON.map(lambda text: text.replace("\0", "")),  # an environment holds no NUL
       size=st.sampled_from(["", "2", "x", "1.5", " 3 ", "99999999999999999999"]))
@example(text="{", size="")
@example(text="{}", size="two")
def test_options_from_the_environment(text, size):
    """POPTORCH_DEFAULT_OPTIONS and the MPI process count are read by every ``Options()``."""
    saved = {name: os.environ.get(name) for name in ("POPTORCH_DEFAULT_OPTIONS", "OMPI_COMM_WORLD_SIZE")}
    os.environ["POPTORCH_DEFAULT_OPTIONS"] = text
    if size:
        os.environ["OMPI_COMM_WORLD_SIZE"] = size
    else:
        os.environ.pop("OMPI_COMM_WORLD_SIZE", None)
    try:
        poptorch.Options()
    except Exception as error:
        assert_clear(error, JSON_ERRORS)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_default_options_that_are_not_json_name_the_variable(monkeypatch):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", "deviceIterations=4")
    with pytest.raises(ValueError, match=r"POPTORCH_DEFAULT_OPTIONS is not valid JSON \(Expecting value"):
        poptorch.Options()
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", "{}")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "first")
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK='first' is not an integer"):
        poptorch.Options()


# =========================================================================== POPLAR_ENGINE_OPTIONS
_ENGINE_KEYS = st.sampled_from(["autoReport.all", "autoReport.directory", "autoReport.outputExecutionProfile",
                                "autoReport.executionProfileProgramRunCount", "openpop.firstProfiledRun",
                                "autoReport.everything", "openpop.nothing", "debug.allowOutOfMemory", ""])
_ENGINE_VALUES = st.one_of(
    _JSON_VALUES, st.sampled_from(["true", "false", "1", "0", "yes", True, 1e300, -1, 2.5, 3]),
    # directory names: relative (the test runs in a temporary directory), NUL characters included
    st.text(st.characters(blacklist_characters="/.\\", blacklist_categories=["Cs"]), min_size=1, max_size=8))
_ENGINE_TEXT = st.one_of(
    st.dictionaries(_ENGINE_KEYS, _ENGINE_VALUES, max_size=4).map(json.dumps),
    _JSON_VALUES.map(json.dumps),
    st.text(max_size=30))


@settings(max_examples=examples(100))
@given(text=_ENGINE_TEXT, instance=st.sampled_from([None, 0, 3]))
@example(text='{"autoReport.all": "true", "autoReport.directory": 5}', instance=None)
@example(text='{"autoReport.all": "true", "autoReport.directory": "a\\u0000b"}', instance=None)
@example(text='{"autoReport.all": "true", "autoReport.executionProfileProgramRunCount": Infinity}', instance=None)
@example(text="[" * 5000, instance=None)
def test_engine_options(text, instance):
    """``POPLAR_ENGINE_OPTIONS``, read on a model's first host call: a session or ``poptorch.Error``."""
    from openpop.runtime import engine_options, trace
    with tempfile.TemporaryDirectory() as directory, working_directory(directory):
        try:
            options = engine_options.parse_engine_options(text)
            trace.session_from_engine_options(options, instance=instance, model="training")
        except Exception as error:
            assert_clear(error, poptorch.Error)


def test_engine_options_with_a_bad_directory_fail_before_the_run(monkeypatch, no_environment_session):
    import torch
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"autoReport.all": "true", "autoReport.directory": 5}')

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

        def forward(self, x):
            return poptorch.identity_loss(self.linear(x).sum(), reduction="sum")

    model = Model()
    before = [p.detach().clone() for p in model.parameters()]
    training = poptorch.trainingModel(model, poptorch.Options(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="autoReport.directory must be a directory path"):
        training(torch.ones(1, 2))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    training.destroy()


# =========================================================================== openpop-k8s manifests
K8S_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "k8s")
_K8S_SEEDS = {name: open(os.path.join(K8S_DATA, name), encoding="utf-8").read()
              for name in ("seed_single_worker.ipujob.yaml", "poprun_two_instances.ipujob.yaml",
                           "all_fields.ipujob.yaml")}


def run_k8s(*argv):
    """``openpop-k8s argv...`` in-process: (exit code, stdout, stderr); no exception may escape."""
    from openpop.k8s.cli import main
    out, err = io.StringIO(), io.StringIO()
    with no_hang(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


def assert_k8s_outcome(code, out, err):
    assert code in (0, 2), (code, err)
    if code == 2:
        assert out == ""
        assert err.startswith("openpop-k8s: error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err and not RAW_WORDS.search(err), err


def _paths(node, path=()):
    """Every path to a value inside ``node`` (mapping keys and list indices)."""
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*path, key))


_YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 5), st.integers(2**31, 2**70),
                          st.floats(), st.text(max_size=8),
                          st.sampled_from(["4", "0", "-1", "x", "poprun", "--num-instances", "IPC_LOCK", "Never",
                                           "ExitCode", "1-", "graphcore/pytorch:3.3.0", "32", "200Gi"]))
_YAML_VALUES = st.recursive(_YAML_SCALARS, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3)), inner, max_size=3),
                            max_leaves=6)


@st.composite
def mutated_manifests(draw):
    """A seed IPUJob with a few fields deleted, replaced or added: what a hand-edited manifest looks like."""
    import yaml
    document = yaml.safe_load(_K8S_SEEDS[draw(st.sampled_from(sorted(_K8S_SEEDS)))])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(document))[1:]))
        *parents, last = path
        parent = document
        for key in parents:
            parent = parent[key]
        action = draw(st.sampled_from(["delete", "replace", "replace", "add"]))
        if action == "delete":
            del parent[last]
        elif action == "replace":
            parent[last] = draw(_YAML_VALUES)
        elif isinstance(parent, dict):
            parent[draw(st.one_of(st.text(max_size=6), st.integers(0, 3)))] = draw(_YAML_VALUES)
        else:
            parent.append(draw(_YAML_VALUES))
        if not isinstance(document, dict):
            break
    return yaml.safe_dump(document, sort_keys=False)


_SEED = _K8S_SEEDS["seed_single_worker.ipujob.yaml"]


@settings(max_examples=examples(35))
@given(manifest=mutated_manifests(), target=st.sampled_from(["pytorchjob", "trainjob"]))
@example(manifest=_SEED.replace("generateName: bert-training-multi-ipu-", "name: 1"), target="pytorchjob")
@example(manifest=_SEED.replace("apiVersion: graphcore.ai/v1alpha1", "apiVersion: [graphcore.ai/v1alpha1]"),
         target="trainjob")
def test_k8s_convert_of_hand_edited_manifests(manifest, target):
    """convert: exit 0 with a job that validate accepts, or exit 2 naming the field; validate agrees
    that the input is bad."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "job.yaml")
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(manifest)
        code, out, err = run_k8s("convert", path, "--to", target)
        assert_k8s_outcome(code, out, err)
        checked = run_k8s("validate", path)
        assert_k8s_outcome(*checked)
        if code == 0:
            converted = os.path.join(directory, "converted.yaml")
            with open(converted, "w", encoding="utf-8") as stream:
                stream.write(out)
            again = run_k8s("validate", converted)
            assert again[0] == 0, again[2]


@settings(max_examples=examples(40))
@given(content=st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode),
                         st.sampled_from(list(_K8S_SEEDS.values())).flatmap(
                             lambda seed: st.integers(0, len(seed)).map(lambda n: seed[:n].encode()))))
@example(content=b"apiVersion: graphcore.ai/v1alpha1\nkind: IPUJob\nmetadata: {name: caf\xe9}\n")
@example(content=b"\x1f")
@example(content=b"? [a, b]\n: c\n")
@example(content=b"&a [*a]")
def test_k8s_manifest_files_of_any_bytes(content):
    """Truncated seeds, text and bytes: convert and validate end in exit 0 or 2, never a traceback."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "job.yaml")
        with open(path, "wb") as stream:
            stream.write(content)
        for command in ("convert", "validate"):
            assert_k8s_outcome(*run_k8s(command, path))


# =========================================================================== ONNX models for PopART
def _onnx_model(*, opset=13, op_type="MatMul", domain="", weight_shape=(3, 4), weight_type=1, weight_raw=None,
                input_shape=(2, 3), input_type=1, extra_domain=None):
    """X[2, 3] @ W[3, 4] + B[4] -> Relu -> Y, with each part open to being wrong."""
    import numpy as np
    import onnx
    from onnx import helper
    weight = onnx.TensorProto(name="W", data_type=weight_type, dims=list(weight_shape))
    if weight_raw is None and weight_type == onnx.TensorProto.FLOAT:
        weight.float_data.extend([1.0] * int(np.prod(weight_shape)))
    else:  # bytes that may not fit the type and shape
        weight.raw_data = weight_raw if weight_raw is not None else b"\0" * 4 * int(np.prod(weight_shape))
    bias = helper.make_tensor("B", onnx.TensorProto.FLOAT, [4], [0.5] * 4)
    nodes = [helper.make_node(op_type, ["X", "W"], ["H"], domain=domain, name="first"),
             helper.make_node("Add", ["H", "B"], ["S"]),
             helper.make_node("Relu", ["S"], ["Y"])]
    graph = helper.make_graph(nodes, "fuzzed", [helper.make_tensor_value_info("X", input_type, list(input_shape))],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], [weight, bias])
    opsets = [helper.make_opsetid("", opset)]
    if extra_domain is not None:
        opsets.append(helper.make_opsetid(*extra_domain))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _run_session(model_or_bytes, anchors=("Y",)):
    """An InferenceSession on the model, prepared and run once on zeros of the inputs' shapes."""
    import numpy as np

    import popart
    flow = popart.DataFlow(1, {a: popart.AnchorReturnType("All") for a in anchors})
    session = popart.InferenceSession(model_or_bytes, flow, popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    inputs = {}
    for name in session._program.input_ids:
        info = session._program.input_info(name)
        dtype = {"bool": np.bool_, "bfloat16": np.float32}.get(info.data_type_lcase(), info.data_type_lcase())
        inputs[name] = np.zeros(info.shape(), dtype)
    session.run(popart.PyStepIO(inputs, session.initAnchorArrays()))


def _popart_attempt(step):
    import popart
    try:
        step()
    except Exception as error:  # the step may fail, but only with PopART's error
        assert_clear(error, popart.popart_exception)


_VALID_ONNX = None


def _valid_onnx_bytes():
    global _VALID_ONNX
    if _VALID_ONNX is None:
        _VALID_ONNX = _onnx_model().SerializeToString()
    return _VALID_ONNX


@st.composite
def damaged_onnx_bytes(draw):
    valid = _valid_onnx_bytes()
    kind = draw(st.sampled_from(["truncated", "flipped", "random"]))
    if kind == "truncated":
        return valid[:draw(st.integers(0, len(valid) - 1))]
    if kind == "random":
        return draw(st.binary(max_size=80))
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=examples(60))
@given(data=damaged_onnx_bytes(), as_file=st.booleans())
@example(data=b"\x08", as_file=False)
# found by fuzzing: a node output name that is not UTF-8, an initializer of data type 29, a node without outputs
@example(data=_valid_onnx_bytes().replace(b'\x12\x01S"\x03Add', b'\x12\x01\x80"\x03Add'), as_file=False)
@example(data=_valid_onnx_bytes().replace(b'\x08\x03\x08\x04\x10\x01', b'\x08\x03\x08\x04\x10\x1d'), as_file=False)
@example(data=_valid_onnx_bytes().replace(b'\x12\x01Y"\x04Relu', b'\x11\x01Y"\x04Relu'), as_file=True)
@example(data=b"\xff\xff", as_file=True)
def test_onnx_bytes_truncated_or_damaged(data, as_file):
    """popart.Builder and InferenceSession on broken serialized models: PopART's error or a model."""
    import popart
    with tempfile.TemporaryDirectory() as directory:
        model = data
        if as_file:
            model = os.path.join(directory, "model.onnx")
            with open(model, "wb") as stream:
                stream.write(data)
        _popart_attempt(lambda: popart.Builder(model).getModelProto())
        _popart_attempt(lambda: _run_session(model))


@settings(max_examples=examples(60))
@given(opset=st.sampled_from([-1, 0, 1, 6, 9, 11, 13, 18, 21, 22, 25, 10**6]),
       op_type=st.sampled_from(["MatMul", "MatMul", "Add", "Gemm", "Conv", "Det", "NoSuchOp", "", "matmul"]),
       domain=st.sampled_from(["", "", "ai.onnx", "ai.graphcore", "com.example"]),
       weight_shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
       weight_type=st.sampled_from([1, 1, 7, 10, 11, 16, 0]),
       weight_raw=st.one_of(st.none(), st.binary(max_size=20)),
       input_shape=st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple),
       input_type=st.sampled_from([1, 1, 6, 7, 9, 10, 0]),
       extra_domain=st.sampled_from([None, ("ai.graphcore", 1), ("ai.graphcore", 99), ("com.example", 1)]))
@example(opset=13, op_type="MatMul", domain="", weight_shape=(4, 4), weight_type=1, weight_raw=None,
         input_shape=(2, 3), input_type=1, extra_domain=None)
@example(opset=13, op_type="MatMul", domain="", weight_shape=(3, 4), weight_type=1, weight_raw=b"\x01\x02\x03",
         input_shape=(2, 3), input_type=1, extra_domain=None)
@example(opset=13, op_type="MatMul", domain="", weight_shape=(3, 4), weight_type=1, weight_raw=None,
         input_shape=(0, 3), input_type=1, extra_domain=None)
def test_onnx_models_with_wrong_opsets_ops_and_shapes(opset, op_type, domain, weight_shape, weight_type, weight_raw,
                                                      input_shape, input_type, extra_domain):
    """A model's opset, op, shapes and types wrong in any way: the session is built and runs, or PopART
    raises its error (naming the node), never an error from inside the interpreter."""
    import popart
    model = _onnx_model(opset=opset, op_type=op_type, domain=domain, weight_shape=weight_shape,
                        weight_type=weight_type, weight_raw=weight_raw, input_shape=input_shape,
                        input_type=input_type, extra_domain=extra_domain)
    _popart_attempt(lambda: popart.Builder(model.SerializeToString()).getTensorShape("Y"))
    _popart_attempt(lambda: _run_session(model.SerializeToString()))


# =========================================================================== poprun's command line
_POPRUN_VALUES = ["1", "2", "4", "0", "-1", "3", "x", "", "yes", "no", "on", "nan", "inf", "-inf", "1e9",
                  "1000000000000", "1" + "0" * 30, "0.5", "--tag-output", "-x A=1", "-x", "-x =1", "'", "--", "-"]
_POPRUN_HOSTS = ["localhost", "localhost,localhost", "h[0-2]", "h[a-b]", "h[1-]", "h[3-1]", "[", ",", "h[01-03]",
                 "localhost[]", "h[-1]", "h[0-99999999999]", "unknown-host"]


@st.composite
def poprun_command_lines(draw, directory):
    """poprun's options in any order, with values good and bad, then maybe a program."""
    from openpop.distributed import poprun
    options = sorted({name for action in poprun.build_parser()._actions for name in action.option_strings})
    files = {"--import-config": "config.json", "--export-config": "exported.json", "--hostfile": "hosts",
             "--host-file": "hosts"}
    argv = []
    for _ in range(draw(st.integers(0, 5))):
        option = draw(st.sampled_from(options))
        if option in ("-h", "--help", "--version"):
            continue
        if option in files:
            value = os.path.join(directory, files[option])
        elif option in ("-H", "--host"):
            value = draw(st.sampled_from(_POPRUN_HOSTS))
        else:
            value = draw(st.sampled_from(_POPRUN_VALUES))
        argv += draw(st.sampled_from([[option, value], [f"{option}={value}"], [option]]))
    return argv + draw(st.sampled_from([[], ["python3", "-c", "pass"], ["train.py", "--num-replicas", "2"]]))


_POPRUN_CONFIG = st.one_of(
    st.dictionaries(st.sampled_from(["num_replicas", "num_instances", "ipus_per_replica", "host", "print_topology",
                                     "mpi_global_args", "collective_timeout", "only_output_from_instance",
                                     "no_such_option", "program"]),
                    st.one_of(st.integers(-2, 4), st.sampled_from(["2", "x", "yes", None, True, [1], {}, 1.5])),
                    max_size=3).map(json.dumps),
    st.sampled_from(["[]", "[1, 2]", "\"text\"", "{", "null", "", "\xff"]))


def run_poprun_in_process(argv):
    """``poprun argv...`` in-process with the launch replaced: (exit code, stdout, stderr). Hosts are
    this machine only when named localhost, and none is probed on the network. It runs in a
    temporary directory: a fuzzed ``--export-config`` followed by the program's name writes a file
    of that name."""
    from unittest import mock

    from openpop.distributed import launch, poprun
    out, err = io.StringIO(), io.StringIO()
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PET_", "OMPI_", "POPDIST_", "TORCHELASTIC_", "MASTER_"))}
    with contextlib.ExitStack() as stack:
        stack.enter_context(working_directory(stack.enter_context(tempfile.TemporaryDirectory())))
        stack.enter_context(mock.patch.dict(os.environ, clean, clear=True))
        stack.enter_context(mock.patch.object(launch, "launch", lambda plan, log: 0))
        stack.enter_context(mock.patch.object(poprun, "is_this_machine", lambda host: host == "localhost"))
        stack.enter_context(mock.patch.object(poprun, "check_resolvable", lambda host: None))
        if hasattr(poprun, "_hosts_answer"):
            stack.enter_context(mock.patch.object(poprun, "_hosts_answer", lambda plan, log: True))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(no_hang())
        code = poprun.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=examples(150))
@given(data=st.data(), config=_POPRUN_CONFIG, hosts=st.lists(st.sampled_from(["localhost", "# c", "", "h1"]),
                                                               max_size=3))
@example(data=None, config="[1, 2]", hosts=[])  # --import-config of a JSON list: set_defaults(**list)
def test_poprun_command_lines(data, config, hosts):
    """Launch (here: replaced) or exit 2 with one ``poprun: error:`` line; never a traceback, never a hang."""
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8", errors="surrogateescape") as stream:
            stream.write(config)
        with open(os.path.join(directory, "hosts"), "w", encoding="utf-8") as stream:
            stream.write("\n".join(hosts))
        argv = data.draw(poprun_command_lines(directory)) if data is not None else \
            ["--import-config", os.path.join(directory, "config.json"), "python3"]
        code, _out, err = run_poprun_in_process(argv)
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            assert err.startswith("poprun: error: ") and err.count("\n") == 1, (argv, err)
            assert not RAW_WORDS.search(err), (argv, err)


@pytest.mark.parametrize("argv, message", [
    (["--host", "node[a-b]", "python3"], "the range 'a-b' is not FIRST-LAST in whole numbers"),
    (["--host", "node[3-]", "python3"], "the range '3-' is not FIRST-LAST in whole numbers"),
    (["--host", "node[3-1]", "python3"], "the range '3-1' counts down"),
    (["--host", "node[0-99999999999]", "python3"], "names more than 4096 hosts"),  # was: a list of 10**11 names
    (["--only-output-from-instance", "--", "python3"], "expected one argument, got '--'"),  # was: a list, a TypeError
    (["--num-replicas=--", "python3"], "expected one argument, got '--'"),
    (["--collective-timeout", "nan", "python3"], "expected a finite number of seconds, got 'nan'"),
    (["--rendezvous-timeout", "inf", "python3"], "expected a finite number of seconds, got 'inf'"),
    (["--rendezvous-port", "70000", "python3"], "expected a port number from 1 to 65535"),
])
def test_poprun_bad_command_lines_found_by_fuzzing(argv, message):
    code, out, err = run_poprun_in_process(argv)
    assert (code, out) == (2, "") and err.startswith("poprun: error: ") and message in err, err


@pytest.mark.parametrize("config, message", [
    ("[1, 2]", "must be a JSON object of options (as --export-config writes it), not a list"),  # was: TypeError
    ('{"num_instances": 0}', "--num-instances 0: expected a positive integer"),  # was: ZeroDivisionError
    ('{"num_replicas": [2]}', "--num-replicas [2]: expected a single value"),
    ('{"version_format": "xml"}', "--version-format 'xml': expected one of text, full-json, full-text"),
    ('{"verbose": "yes"}', "--verbose 'yes': expected true or false"),
])
def test_poprun_import_config_values_are_checked_like_the_command_line(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(config)
    code, _out, err = run_poprun_in_process(["--import-config", str(path), "python3"])
    assert code == 2 and message in err, err


def test_poprun_exported_config_imports_again(tmp_path):
    exported = tmp_path / "exported.json"
    assert run_poprun_in_process(["--num-instances", "2", "--num-replicas", "4", "--print-topology", "yes",
                                  "--collective-timeout", "30", "--export-config", str(exported)])[0] == 0
    code, out, err = run_poprun_in_process(["--import-config", str(exported), "python3"])
    assert code == 0, err
    assert "| instances |" in out  # print_topology came back as a yes


def test_poprun_topology_of_a_huge_system_is_one_line():
    code, out, _err = run_poprun_in_process(["--num-replicas", "1" + "0" * 30, "--print-topology", "yes", "python3"])
    assert code == 0 and out.count("\n") == 1 and "more than 1024 to draw" in out  # was: a hang


# =========================================================================== openpop-bert's data and checkpoints
def _bert_config(**overrides):
    from openpop.bert.config import make_config
    settings_ = dict(dataset="pretraining", device_iterations=1, gradient_accumulation=2, ipus_per_replica=1,
                     layers_per_ipu=[3], sequence_length=32, mask_tokens=5, disable_progress_bar=True)
    settings_.update(overrides)
    return make_config("unit_test", **settings_)


_SENTENCES = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(["", "The cat sat on the mat.",
                                                                         "A second sentence follows here.",
                                                                         "\t", "\u00e9t\u00e9 \u4e2d\u6587 ok"])),
                      max_size=40).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))


@settings(max_examples=examples(12))
@given(content=st.one_of(_SENTENCES, st.binary(max_size=200)), vocab=st.booleans())
@example(content=b"caf\xe9\n", vocab=False)
@example(content=b"[PAD]\n[UNK]\n", vocab=True)
@example(content=b"[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\n", vocab=True)
def test_bert_input_and_vocab_files(content, vocab):
    """An input text file (or a vocab file) of any content: a dataset, or DataError naming the file."""
    from openpop.bert import data
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "vocab.txt" if vocab else "corpus.txt")
        with open(path, "wb") as stream:
            stream.write(content)
        corpus = os.path.join(directory, "text.txt")
        with open(corpus, "w", encoding="utf-8") as stream:
            stream.write("A first sentence of text.\nAnd a second one.\n\nAnother document here.\nIt ends.\n" * 4)
        config = _bert_config(input_files=[corpus if vocab else path], vocab_file=path if vocab else None,
                              data_cache_dir=os.path.join(directory, "cache"))
        try:
            with no_hang(60):
                data.get_dataset(config)
        except Exception as error:
            assert_clear(error, data.DataError)


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory):
    """A checkpoint of the unit_test model, and a function giving the run that resumes it."""
    import torch

    from openpop.bert import checkpoint
    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_lr_scheduler, get_optimizer
    directory = tmp_path_factory.mktemp("checkpoint")
    config = _bert_config(dataset="generated", checkpoint_output_dir=str(directory),
                          resume_training_from_checkpoint=True)

    def fresh():
        model = PipelinedBertForPretraining(config)
        optimizer = get_optimizer(config, model)
        return model, optimizer, get_lr_scheduler(optimizer, config)

    model, optimizer, scheduler = fresh()
    path = checkpoint.save_checkpoint(str(directory), 1, config, model, optimizer, scheduler)
    with open(path, "rb") as stream:
        return Saved((config, torch.load(path, weights_only=True), stream.read(), fresh))


class Saved(tuple):
    def __repr__(self):  # Hypothesis prints its arguments: not the whole checkpoint
        return "<the unit_test checkpoint>"


def _restore(config, path, fresh):
    """What openpop-bert does with a checkpoint before its first step. Each step either applies or
    raises CheckpointError leaving what it loads into (weights; optimizer and schedule) as it was."""
    import torch

    from openpop.bert import checkpoint
    model, optimizer, scheduler = fresh()
    rng = torch.get_rng_state()
    try:
        with no_hang(60):
            state = checkpoint.load_checkpoint(path, config)
            weights = copy.deepcopy(model.state_dict())
            try:
                checkpoint.load_weights(model, state, path)
            except checkpoint.CheckpointError:
                assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items()), "weights half loaded"
                raise
            training = copy.deepcopy((optimizer.state_dict(), scheduler.state_dict()))
            try:
                checkpoint.restore_training_state(state, optimizer, scheduler, path)
            except checkpoint.CheckpointError:
                assert repr(training) == repr((optimizer.state_dict(), scheduler.state_dict())), "half restored"
                raise
            torch.set_rng_state(state["rng_state"])
    except Exception as error:
        assert_clear(error, checkpoint.CheckpointError)
        assert torch.equal(rng, torch.get_rng_state())
        return error
    finally:
        torch.set_rng_state(rng)
    return None


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch.load of a damaged file
@settings(max_examples=examples(25))
@given(cut=st.one_of(st.none(), st.integers(0, 10**6)), flips=st.lists(st.tuples(st.integers(0, 10**6),
                                                                                    st.integers(0, 255)), max_size=3))
def test_bert_checkpoint_files_truncated_or_damaged(bert_checkpoint, cut, flips):
    config, _state, content, fresh = bert_checkpoint
    data_ = bytearray(content if cut is None else content[:cut % len(content)])
    for offset, value in flips:
        if data_:
            data_[offset % len(data_)] = value
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "step_1.pt")
        with open(path, "wb") as stream:
            stream.write(bytes(data_))
        _restore(config, path, fresh)


_ENTRY_VALUES = st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=4), st.sampled_from(
    ["tensor", "bytes", "list", "dict", "float"]))


@settings(max_examples=examples(25))
@given(changes=st.lists(st.tuples(st.sampled_from(["format", "step", "config_name", "config", "model_config", "model",
                                                   "optimizer", "scheduler", "rng_state", "model.key",
                                                   "model.shape", "optimizer.state", "optimizer.param_groups",
                                                   "scheduler.last_epoch", "config.micro_batch_size",
                                                   "model_config.hidden_size"]),
                                  st.booleans(), _ENTRY_VALUES), min_size=1, max_size=3))
@example(changes=[("model_config", False, None)])                  # was: KeyError 'model_config'
@example(changes=[("model_config", True, "list")])                 # was: AttributeError 'list'.get
@example(changes=[("model.shape", True, None)])                    # was: RuntimeError from load_state_dict
@example(changes=[("rng_state", True, "bytes")])                   # was: TypeError from set_rng_state
@example(changes=[("scheduler", True, 3)])                          # was: TypeError in restore_training_state
@example(changes=[("step", True, "x")])                             # was: ValueError from int()
def test_bert_checkpoints_with_missing_or_wrong_entries(bert_checkpoint, changes):
    """A checkpoint written by something else, or edited: resumed, or CheckpointError before anything changes."""
    import torch
    config, state, _content, fresh = bert_checkpoint
    state = copy_state(state)
    for key, replace, value in changes:
        value = {"tensor": torch.zeros(3), "bytes": b"\x00\x01", "list": [1, 2], "dict": {"a": 1},
                 "float": 1.5}.get(value, value) if isinstance(value, str) else value
        holder, _, inner = key.partition(".")
        if inner and isinstance(state.get(holder), dict):
            target = state[holder]
            name = next(iter(target)) if inner in ("key", "shape") else inner
            if inner == "shape" and isinstance(target.get(name), torch.Tensor):
                target[name] = torch.zeros(2, 2)
            elif inner == "key" or not replace:
                target.pop(name, None)
            else:
                target[name] = value
        elif replace:
            state[holder] = value
        else:
            state.pop(holder, None)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "step_1.pt")
        torch.save(state, path)
        _restore(config, path, fresh)


def copy_state(state):
    return copy.deepcopy(state)


def test_openpop_bert_resuming_a_checkpoint_with_other_shapes_is_one_error_line(bert_checkpoint, tmp_path, capsys):
    """Through the command line: the weights are checked before any is loaded (was: load_state_dict's
    RuntimeError with every mismatch, after the data was built)."""
    import torch

    from openpop.bert import train
    _config, state, _content, _fresh = bert_checkpoint
    state = copy_state(state)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(2, 2)
    torch.save(state, tmp_path / "step_1.pt")
    argv = ["--config", "unit_test", "--dataset", "generated", "--device-iterations", "1", "--gradient-accumulation",
            "2", "--ipus-per-replica", "1", "--layers-per-ipu", "3", "--sequence-length", "32", "--mask-tokens", "5",
            "--training-steps", "2", "--disable-progress-bar", "--checkpoint-input-dir", str(tmp_path),
            "--resume-training-from-checkpoint"]
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert f"does not hold this model's weights (other shapes: {name})" in err and "Traceback" not in err, err
