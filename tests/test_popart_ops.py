"""The op table: each op's forward against ONNX's reference implementation (numpy) across FLOAT,
FLOAT16 and INT32 and broadcasting shapes; backward against numerical derivatives (float64
gradcheck); PopART's own ops against torch."""
import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import popart
from openpop.popart.graph import GraphProgram, OnnxGraphModule

RNG = np.random.default_rng(0)


def _build(op, shapes, dtype, attrs=None, pos=(), opset=13, consts=None):
    b = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    ids = [b.addInputTensor(popart.TensorInfo(dtype, s)) for s in shapes]
    for value in (consts or []):
        ids.append(b.aiOnnx.constant(np.asarray(value)))
    domain = b.aiGraphcore if op.startswith("gc.") else b.aiOnnx
    out = getattr(domain, op.replace("gc.", ""))(ids, *pos, **(attrs or {}))
    outs = out if isinstance(out, list) else [out]
    for o in outs:
        b.addOutputTensor(o)
    return b, ids[:len(shapes)], outs


def _module(builder, outs, training=False):
    program = GraphProgram(onnx.load_from_string(builder.getModelProto()))
    module = OnnxGraphModule(program, [list(range(len(program.nodes)))], fetch=outs, loss=None, tapped=set())
    return module.train(training)


def _run(module, arrays):
    inputs = tuple(torch.from_numpy(a).unsqueeze(0) for a in arrays)
    return [t.squeeze(0) for t in module(torch.zeros(1, dtype=torch.int64), *inputs)]


def _data(shape, dtype, positive=False):
    if dtype == "INT32":
        return RNG.integers(1 if positive else -5, 6, shape).astype(np.int32)
    x = RNG.uniform(0.2 if positive else -2, 2, shape)
    return x.astype(np.float16 if dtype == "FLOAT16" else np.float32)


# op, input shapes, attributes, dtypes, positive inputs, differentiable, builder positional args
ELEMENTWISE = [
    ("add", [(2, 3), (3,)]), ("sub", [(2, 1, 3), (4, 1)]), ("mul", [(1,), (2, 3)]), ("div", [(2, 3), (2, 3)]),
    ("max", [(2, 3), (1, 3)]), ("min", [(3,), (2, 3)]), ("sum", [(2, 3), (3,), (2, 1)]), ("equal", [(2, 3), (3,)]),
    ("less", [(2, 3), (2, 1)]), ("greater", [(3,), (2, 3)]),
]
UNARY_FLOAT = ["neg", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "floor", "ceil", "erf", "softsign",
               "atan", "sign"]
POSITIVE_FLOAT = ["sqrt", "log", "reciprocal"]


@pytest.mark.parametrize("dtype", ["FLOAT", "FLOAT16", "INT32"])
@pytest.mark.parametrize("op,shapes", ELEMENTWISE, ids=[e[0] for e in ELEMENTWISE])
def test_broadcasting_binary_ops_match_onnx_reference(op, shapes, dtype):
    if op == "sum" and dtype == "INT32":
        # ONNX's Sum has no integer types; PopART's non-strict inference still gives the shape.
        builder, ids, outs = _build(op, shapes, dtype)
        arrays = [_data(s, dtype, False) for s in shapes]
        assert builder.getTensorShape(outs[0]) == [2, 3] and builder.getTensorDtypeString(outs[0]) == "int32"
        np.testing.assert_array_equal(_run(_module(builder, outs), arrays)[0].numpy(), sum(arrays))
        return
    positive = op == "div"
    builder, ids, outs = _build(op, shapes, dtype)
    arrays = [_data(s, dtype, positive) for s in shapes]
    got = _run(_module(builder, outs), arrays)[0].numpy()
    want = ReferenceEvaluator(onnx.load_from_string(builder.getModelProto())).run(None, dict(zip(ids, arrays)))[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 2e-3 if dtype == "FLOAT16" else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["FLOAT", "FLOAT16"])
@pytest.mark.parametrize("op", UNARY_FLOAT + POSITIVE_FLOAT)
def test_unary_ops_match_onnx_reference(op, dtype):
    builder, ids, outs = _build(op, [(3, 4)], dtype)
    arrays = [_data((3, 4), dtype, op in POSITIVE_FLOAT)]
    got = _run(_module(builder, outs), arrays)[0].numpy()
    want = ReferenceEvaluator(onnx.load_from_string(builder.getModelProto())).run(None, dict(zip(ids, arrays)))[0]
    tol = 3e-3 if dtype == "FLOAT16" else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


# (op, shapes, attrs, positional, constants) for ops with attributes or shape inputs
STRUCTURED = [
    ("matmul", [(2, 3, 4), (4, 5)], {}, (), None),
    ("gemm", [(3, 4), (5, 4), (5,)], {"alpha": 0.5, "beta": 2.0, "transB": 1}, (), None),
    ("conv", [(1, 2, 5, 5), (3, 2, 3, 3), (3,)], {"pads": [1, 0, 1, 2], "strides": [2, 1]}, (), None),
    ("conv", [(1, 4, 5, 5), (4, 2, 3, 3)], {"group": 2, "dilations": [2, 1]}, (), None),
    ("averagepool", [(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, (), None),
    ("maxpool", [(1, 2, 5, 5)], {"kernel_shape": [2, 2], "strides": [2, 2]}, (1,), None),
    ("globalaveragepool", [(2, 3, 4, 4)], {}, (), None),
    ("softmax", [(2, 3, 4)], {"axis": 2}, (), None),  # axis < rank-1: see test_popart_builder (opset < 13)
    ("logsoftmax", [(2, 3, 4)], {"axis": 2}, (), None),
    ("transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}, (), None),
    ("reshape", [(2, 3, 4)], {}, (), [np.array([4, -1], np.int64)]),
    ("slice", [(4, 5, 6)], {}, (), [np.array([1, -1], np.int64), np.array([3, -6], np.int64),
                                   np.array([0, 2], np.int64), np.array([1, -2], np.int64)]),
    ("gather", [(5, 3)], {"axis": 0}, (), [np.array([[0, 4], [-1, 2]], np.int64)]),
    ("concat", [(2, 3), (2, 1)], {"axis": 1}, (), None),
    ("squeeze", [(2, 1, 3, 1)], {"axes": [1, 3]}, (), None),
    ("unsqueeze", [(2, 3)], {"axes": [0, 3]}, (), None),
    ("expand", [(3, 1)], {}, (), [np.array([2, 3, 4], np.int64)]),
    ("tile", [(2, 3)], {}, (), [np.array([2, 1], np.int64)]),
    ("pad", [(2, 3)], {"mode": "constant"}, (), [np.array([1, 0, 0, 2], np.int64), np.array(1.5, np.float32)]),
    ("flatten", [(2, 3, 4)], {"axis": 2}, (), None),
    ("reducesum", [(2, 3, 4)], {"axes": [0, 2], "keepdims": 0}, (), None),
    ("reducemean", [(2, 3, 4)], {"axes": [1]}, (), None),
    ("reducemax", [(2, 3, 4)], {}, (), None),
    ("reducel2", [(2, 3, 4)], {"axes": [2]}, (), None),
    ("reducelogsumexp", [(2, 3, 4)], {"axes": [1]}, (), None),
    ("argmax", [(3, 4)], {"axis": 1, "keepdims": 0}, (), None),
    ("argmin", [(3, 4)], {"axis": 0}, (), None),
    ("cumsum", [(3, 4)], {"exclusive": 1, "reverse": 1}, (), [np.array(1, np.int64)]),
    ("topk", [(3, 6)], {"axis": 1}, (), [np.array([2], np.int64)]),
    ("where", [(2, 3), (3,)], {}, (), None),
    ("clip", [(3, 4)], {}, (), [np.array(-0.5, np.float32), np.array(0.7, np.float32)]),
    ("leakyrelu", [(3, 4)], {"alpha": 0.2}, (), None),
    ("elu", [(3, 4)], {"alpha": 0.7}, (), None),
    ("hardsigmoid", [(3, 4)], {}, (), None),
    ("split", [(6, 2)], {"axis": 0, "split": [2, 4]}, (2,), None),
    ("instancenormalization", [(2, 3, 4), (3,), (3,)], {}, (), None),
    ("lstm", [(5, 2, 3), (1, 16, 3), (1, 16, 4), (1, 32)], {"hidden_size": 4}, (3,), None),
    ("gru", [(5, 2, 3), (2, 12, 3), (2, 12, 4), (2, 24)], {"hidden_size": 4, "direction": "bidirectional"},
     (2,), None),
    ("rnn", [(5, 2, 3), (1, 4, 3), (1, 4, 4)], {"hidden_size": 4, "direction": "reverse"}, (2,), None),
    ("resize", [(1, 1, 2, 3)], {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                "nearest_mode": "floor"}, (),
     [np.zeros(0, np.float32), np.array([1, 1, 2, 3], np.float32)]),  # roi, scales
    ("onehot", [], {"axis": -1}, (), [np.array([0, 3, -1], np.int64), np.array(4, np.int64),
                                     np.array([0.0, 2.0], np.float32)]),
]


def _structured_inputs(op, shapes):
    arrays = []
    for k, s in enumerate(shapes):
        if op == "where" and k == 0:
            arrays.append(RNG.integers(0, 2, s).astype(bool))
            continue
        positive = op in ("batchnormalization",) and k == 4
        arrays.append(_data(s, "FLOAT", positive))
    return arrays


@pytest.mark.parametrize("op,shapes,attrs,pos,consts", STRUCTURED, ids=[f"{s[0]}{i}" for i, s in enumerate(STRUCTURED)])
def test_structured_ops_forward_match_onnx_reference(op, shapes, attrs, pos, consts):
    dtypes = ["BOOL" if op == "where" and k == 0 else "FLOAT" for k in range(len(shapes))]
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    ids = [b.addInputTensor(popart.TensorInfo(d, s)) for d, s in zip(dtypes, shapes)]
    for value in consts or []:
        ids.append(b.aiOnnx.constant(value))
    if op == "where":
        ids = [ids[0], ids[1], b.addInputTensor(popart.TensorInfo("FLOAT", [1]))]
        shapes = shapes + [(1,)]
    out = getattr(b.aiOnnx, op)(ids, *pos, **attrs)
    outs = out if isinstance(out, list) else [out]
    for o in outs:
        b.addOutputTensor(o)
    arrays = _structured_inputs(op, shapes)
    feeds = dict(zip(ids, arrays))
    got = _run(_module(b, outs), arrays)
    want = ReferenceEvaluator(onnx.load_from_string(b.getModelProto())).run(None, feeds)
    for g, w, o in zip(got, want, outs):
        assert list(g.shape) == list(w.shape) == b.getTensorShape(o)
        np.testing.assert_allclose(g.numpy().astype(np.float64), np.asarray(w).astype(np.float64), rtol=1e-5,
                                   atol=1e-5)


GRADCHECK = [("matmul", [(2, 3), (3, 2)], {}), ("conv", [(1, 1, 3, 3), (1, 1, 2, 2)], {"pads": [1, 0, 1, 0]}),
             ("softmax", [(2, 5)], {"axis": 1}), ("div", [(2, 3), (3,)], {}), ("gather", [(4, 3)], {}),
             ("reducemean", [(2, 3, 4)], {"axes": [1]}), ("averagepool", [(1, 1, 4, 4)], {"kernel_shape": [2, 2]}),
             ("sigmoid", [(3,)], {}), ("transpose", [(2, 3)], {}), ("lstm", [(3, 1, 2), (1, 8, 2), (1, 8, 2)],
                                                                      {"hidden_size": 2})]


@pytest.mark.parametrize("op,shapes,attrs", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_backward_matches_numerical_gradients(op, shapes, attrs):
    b = popart.Builder()
    ids = [b.addInputTensor(popart.TensorInfo("DOUBLE", s)) for s in shapes]
    if op == "gather":
        ids.append(b.aiOnnx.constant(np.array([3, 0, 3], np.int64)))
    if op == "div":
        pass
    out = getattr(b.aiOnnx, op)(ids, *((1,) if op == "lstm" else ()), **attrs)
    out = out[0] if isinstance(out, list) else out
    module = _module(b, [out])
    inputs = [torch.from_numpy(RNG.uniform(0.5, 1.5, s)).requires_grad_(True) for s in shapes]

    def fn(*xs):
        return module(torch.zeros(1, dtype=torch.int64), *(x.unsqueeze(0) for x in xs))[0]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5)


def test_graphcore_losses_match_torch():
    probs = torch.softmax(torch.randn(6, 5), 1)
    labels = torch.tensor([0, 4, 2, 2, 1, 3], dtype=torch.int32)
    for reduction, torch_reduction in ((popart.ReductionType.Mean, "mean"), (popart.ReductionType.Sum, "sum"),
                                       (popart.ReductionType.NoReduction, "none")):
        b = popart.Builder()
        p = b.addInputTensor(popart.TensorInfo("FLOAT", [6, 5]))
        lab = b.addInputTensor(popart.TensorInfo("INT32", [6]))
        nll = b.aiGraphcore.nllloss([p, lab], reduction=reduction, ignoreIndex=2)
        l1 = b.aiGraphcore.l1loss([p], 0.3, reduction=reduction)
        got = _run(_module(b, [nll, l1]), [probs.numpy(), labels.numpy()])
        want_nll = torch.nn.functional.nll_loss(torch.log(probs), labels.long(), ignore_index=2,
                                                reduction=torch_reduction)
        np.testing.assert_allclose(got[0].numpy(), want_nll.numpy(), rtol=1e-6)
        want_l1 = {"mean": lambda t: t.mean(), "sum": lambda t: t.sum(), "none": lambda t: t}[torch_reduction](
            0.3 * probs.abs())
        np.testing.assert_allclose(got[1].numpy(), want_l1.numpy(), rtol=1e-6)


def test_graphcore_misc_ops():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 6]))
    offset = b.aiOnnx.constant(np.array([1], np.uint32))
    outs = [b.aiGraphcore.gelu([x]), b.aiGraphcore.subsample([x], [2, 3]), b.aiGraphcore.detach([x]),
            b.aiGraphcore.dynamicslice([x, offset], [0], [2]), b.aiGraphcore.reverse([x], [1]),
            b.aiGraphcore.nop([x]), b.aiGraphcore.atan2([x, x])]
    data = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    got = _run(_module(b, outs), [data])
    t = torch.from_numpy(data)
    expect = [torch.nn.functional.gelu(t, approximate="tanh"), t[::2, ::3], t, t[1:3], torch.flip(t, [1]), t,
              torch.atan2(t, t)]
    for g, w in zip(got, expect):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)


def test_supported_operations_lists_the_table():
    """As PopART's: an OperatorIdentifier per operator version; ai.onnx operators of an opset that are
    not run are getUnsupportedOperations(opset), and no operator is in both lists."""
    ops = popart.getSupportedOperations(False)
    assert all(isinstance(o, popart.OperatorIdentifier) for o in ops)
    onnx_ops = {o.type for o in ops if o.domain == "ai.onnx"}
    assert {"Conv", "MatMul", "LSTM", "Softmax", "Gather", "Constant", "Shape", "ConstantOfShape"} <= onnx_ops
    assert {"Nll", "L1", "IdentityLoss", "Call"} <= {o.type for o in ops if o.domain == "ai.graphcore"}
    assert popart.OperatorIdentifier("", "Softmax", 11) in ops and popart.OperatorIdentifier("", "Softmax", 1) in ops
    unsupported = popart.getUnsupportedOperations(10)
    assert unsupported and not {(o.type, o.version) for o in unsupported} & {(o.type, o.version) for o in ops}
    assert all(o.domain == "ai.onnx" and o.type not in onnx_ops for o in unsupported)
    with pytest.raises(popart.popart_exception, match="Could not find opset 3"):
        popart.getUnsupportedOperations(3)


def test_batchnorm_inference_and_training_statistics():
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    scale, bias = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    mean, var = RNG.standard_normal(3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
    b = popart.Builder()
    xi = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 3, 5]))
    ids = [b.addInitializedInputTensor(a) for a in (scale, bias, mean, var)]
    y, _m, _v, _sm, _sv = b.aiOnnx.batchnormalization([xi] + ids, 5, epsilon=1e-3, momentum=0.8)
    module = _module(b, [y])
    want = torch.nn.functional.batch_norm(torch.from_numpy(x), torch.from_numpy(mean), torch.from_numpy(var),
                                          torch.from_numpy(scale), torch.from_numpy(bias), False, 0.0, 1e-3)
    np.testing.assert_allclose(_run(module, [x])[0].detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    module.train(True)
    got = _run(module, [x])[0]
    want = torch.nn.functional.batch_norm(torch.from_numpy(x), None, None, torch.from_numpy(scale),
                                          torch.from_numpy(bias), True, 0.0, 1e-3)
    np.testing.assert_allclose(got.detach().numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    weights = module.weights()
    batch_mean = x.mean(axis=(0, 2))
    np.testing.assert_allclose(weights[ids[2]].numpy(), 0.8 * mean + 0.2 * batch_mean, rtol=1e-5, atol=1e-6)
    assert not isinstance(weights[ids[2]], torch.nn.Parameter) and isinstance(weights[ids[0]], torch.nn.Parameter)
