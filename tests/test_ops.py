"""openpop.ops: every op's values and gradients against plain PyTorch, and its errors."""
import itertools
import math
import re

import pytest
import torch

from openpop import enums, ops
from openpop.errors import COND_TRAINING, FOR_LOOP_TRAINING, Error
from openpop.runtime import context


def leaf(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape, requires_grad=True)


def grads_match(op, reference, *shapes):
    """``op`` and ``reference`` give equal outputs and equal input gradients."""
    inputs = [leaf(*s, seed=i) for i, s in enumerate(shapes)]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    out, expected = op(*inputs), reference(*twins)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for a, b in zip(inputs, twins):
        torch.testing.assert_close(a.grad, b.grad)


# --- ipu_print_tensor -------------------------------------------------------------

def test_print_tensor_is_identity_and_prints_value_and_gradient(capsys):
    grads_match(lambda x: ops.ipu_print_tensor(x, "act") * 3, lambda x: x * 3, (2, 3))
    out = capsys.readouterr().out
    assert out.startswith("act: ((")
    assert "act_gradient: ((" in out


def test_print_tensor_formatting_arguments(capsys):
    ops.ipu_print_tensor(torch.tensor([[1.5, 2.25], [3.0, 4.0]]), "m", separator="; ",
                         open_bracket="<", close_bracket=">", digits=2, float_format="fixed")
    assert capsys.readouterr().out == "m: <<1.50; 2.25>;\n <3.00; 4.00>>\n"
    ops.ipu_print_tensor(torch.arange(20.0), summarise_threshold=10, edge_items=2,
                         float_format="scientific")
    text = capsys.readouterr().out
    assert "..." in text and text.count("e+") == 4


def test_print_tensor_restores_torch_print_options(capsys):
    before = dict(torch._tensor_str.get_printoptions())
    ops.ipu_print_tensor(torch.ones(3), digits=7, summarise_threshold=0, max_line_width=0)
    assert torch._tensor_str.get_printoptions() == before


def test_print_tensor_without_gradient_printing(capsys):
    x = leaf(3)
    ops.ipu_print_tensor(x, "x", print_gradient=False).sum().backward()
    assert "gradient" not in capsys.readouterr().out
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_print_tensor_prints_when_run_not_while_traced(capsys):
    x = leaf(2)
    with context.running(training=True, tracing=True):
        ops.ipu_print_tensor(x, "x").sum().backward()
    assert capsys.readouterr().out == ""
    with context.running(training=True):
        ops.ipu_print_tensor(x, "x").sum().backward()
    out = capsys.readouterr().out
    assert out.startswith("x: (") and "x_gradient: (1., 1.)" in out


def test_print_tensor_errors():
    with pytest.raises(Error, match="ipu print tensor must take a torch.tensor argument"):
        ops.ipu_print_tensor([1.0])
    with pytest.raises(ValueError, match="float_format"):
        ops.ipu_print_tensor(torch.ones(1), float_format="engineering")


# --- identity-like hints ----------------------------------------------------------

def test_identity_hints_keep_values_and_gradients():
    grads_match(lambda x: ops.nop(x) * 2, lambda x: x * 2, (4,))
    grads_match(lambda x: ops.set_available_memory(x, 0.3).exp(), torch.exp, (4,))
    mode = enums.OverlapMode.OverlapAccumulationLoop
    grads_match(lambda x: ops.set_overlap_for_input(x, mode).sin(), torch.sin, (4,))
    grads_match(lambda x: ops.set_overlap_for_output(x, mode).cos(), torch.cos, (4,))


def test_identity_hint_errors():
    with pytest.raises(Error, match="nop must take a torch.tensor argument"):
        ops.nop(3)
    with pytest.raises(Error, match="You may only set available memory for torch.tensor values"):
        ops.set_available_memory(3, 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        ops.set_available_memory(torch.ones(1), 1.5)


def test_overlap_keeps_nested_structures_and_validates():
    a, b = torch.ones(1), torch.zeros(2)
    mode = enums.OverlapMode.NoOverlap
    out = ops.set_overlap_for_input({"x": [a, (b,)]}, mode)
    assert out["x"][0] is a and out["x"][1][0] is b
    with pytest.raises(Error, match="torch.tensor inputs"):
        ops.set_overlap_for_input([a, 3], mode)
    with pytest.raises(Error, match="torch.tensor outputs"):
        ops.set_overlap_for_output("y", mode)
    with pytest.raises(Error, match="OverlapMode"):
        ops.set_overlap_for_output(a, "no_overlap")


def test_recomputation_checkpoint_shapes_of_results():
    a, b = torch.ones(1), torch.zeros(1)
    assert ops.recomputationCheckpoint(a) is a
    assert ops.recomputationCheckpoint(a, b) == (a, b)
    single_list = ops.recomputationCheckpoint([a])
    assert isinstance(single_list, list) and single_list[0] is a
    assert ops.recomputationCheckpoint((a, b)) == (a, b)
    with pytest.raises(ValueError, match="All inputs must be tensors"):
        ops.recomputationCheckpoint(a, 2)
    grads_match(lambda x: ops.recomputationCheckpoint(x) * x, lambda x: x * x, (3,))


def test_recomputation_checkpoint_records_in_a_run_that_collects_them():
    a, b = torch.ones(1), torch.zeros(1)
    ops.recomputationCheckpoint(a)  # outside a run: nothing to record into
    with context.running(training=True) as run:
        ops.recomputationCheckpoint(a)  # a run without a `checkpoints` list
        run.checkpoints = []
        ops.recomputationCheckpoint([a, b])
        assert run.checkpoints == [a, b]


def test_serialized_matmul_is_matmul():
    for mode in enums.MatMulSerializationMode:
        grads_match(lambda x, y, mode=mode: ops.serializedMatMul(x, y, mode, 2), torch.matmul,
                    (4, 6), (6, 2))
    with pytest.raises(AssertionError, match="MatMulSerializationMode"):
        ops.serializedMatMul(torch.ones(2, 2), torch.ones(2, 2), "input_channels")
    with pytest.raises(AssertionError, match="factor"):
        ops.serializedMatMul(torch.ones(2, 2), torch.ones(2, 2),
                             enums.MatMulSerializationMode.Disabled, 2.0)
    with pytest.raises(AssertionError, match="keep_precision"):
        ops.serializedMatMul(torch.ones(2, 2), torch.ones(2, 2),
                             enums.MatMulSerializationMode.Disabled, 0, 1)


# --- dynamic slices ---------------------------------------------------------------

@pytest.mark.parametrize("dim,start,size,step", [(0, 1, 4, 1), (0, 1, 4, 2), (1, 2, 3, 3),
                                                 (-1, 1, 2, 1), (2, 1, 1, 1)])
def test_dynamic_slice_matches_slicing(dim, start, size, step):
    def reference(x):
        index = [slice(None)] * x.dim()
        index[dim] = slice(start, start + size, step)
        return x[tuple(index)]

    start_tensor = torch.tensor([start], dtype=torch.int32)
    grads_match(lambda x: ops.dynamic_slice(x, dim, start_tensor, size, step), reference,
                (6, 5, 3))


@pytest.mark.parametrize("dim,start,size", [(0, 1, 2), (1, 3, 2), (2, 0, 3), (-2, 4, 1)])
def test_dynamic_update_matches_slice_scatter(dim, start, size):
    src_shape = [5, 6, 3]
    src_shape[dim] = size
    start_tensor = torch.tensor(start)
    grads_match(lambda x, s: ops.dynamic_update(x, s, dim, start_tensor, size),
                lambda x, s: torch.slice_scatter(x, s, dim % 3, start, start + size),
                (5, 6, 3), src_shape)


def test_dynamic_slice_errors():
    x, start = torch.arange(8.0), torch.tensor([1])
    cases = [
        (lambda: ops.dynamic_slice([1], 0, start, 1, 1), "dynamic_slice must take a torch.tensor"),
        (lambda: ops.dynamic_slice(x, 0.0, start, 1, 1), "Dimension must be an integer"),
        (lambda: ops.dynamic_slice(x, 0, 1, 1, 1), "Slice start argument to dynamic_slice"),
        (lambda: ops.dynamic_slice(x, 0, start, 1.0, 1), "Size must be an integer"),
        (lambda: ops.dynamic_slice(x, 0, start, 1, 1.0), "Step must be an integer"),
        (lambda: ops.dynamic_slice(x, 0, start, 0, 1), "The start and end of a slice must be different"),
        (lambda: ops.dynamic_slice(x, 0, start, -2, 1), "end less than the start is not supported"),
        (lambda: ops.dynamic_slice(x, 1, start, 1, 1), "out of range"),
        (lambda: ops.dynamic_slice(x, 0, torch.tensor(1.0), 1, 1), "must hold one integer"),
        (lambda: ops.dynamic_slice(x, 0, torch.tensor(6), 4, 1), r"outside dimension 0 of size 8"),
    ]
    for call, message in cases:
        with pytest.raises(Error, match=message):
            call()


def test_dynamic_update_errors():
    x, start = torch.zeros(2, 8), torch.tensor([0])
    with pytest.raises(Error, match=re.escape("input and src tensors must have same dimensionality. (2) vs (1)")):
        ops.dynamic_update(x, torch.zeros(8), 0, start, 1)
    with pytest.raises(Error, match=re.escape(
            "input and src tensor must have same dtype. (torch.float32 vs torch.int64)")):
        ops.dynamic_update(x, torch.zeros(1, 8, dtype=torch.long), 0, start, 1)
    with pytest.raises(Error, match="Src argument to dynamic_update must be a torch.tensor"):
        ops.dynamic_update(x, 1.0, 0, start, 1)
    with pytest.raises(Error, match=re.escape("src must have shape [1, 8]")):
        ops.dynamic_update(x, torch.zeros(1, 4), 0, start, 1)


# --- control flow -----------------------------------------------------------------

def test_for_loop_really_loops():
    x, y = torch.tensor([1.0]), torch.tensor([2.0])
    out = ops.for_loop(3, lambda a, b: (a + b, b * 2), [x, y])
    assert isinstance(out, list)
    torch.testing.assert_close(out, [torch.tensor([1.0 + 2 + 4 + 8]), torch.tensor([16.0])])
    assert x.item() == 1.0 and y.item() == 2.0
    with context.running(training=False):
        torch.testing.assert_close(ops.for_loop(4, lambda a: a * 2, [x]), [torch.tensor([16.0])])


def test_for_loop_body_does_not_modify_the_callers_tensors():
    x = torch.zeros(2)
    ops.for_loop(2, lambda a: a.add_(1), [x])
    assert x.tolist() == [0.0, 0.0]


def test_for_loop_errors():
    with pytest.raises(ValueError, match=re.escape("(Object is not list)")):
        ops.for_loop(2, lambda a: a, (torch.ones(1),))
    with pytest.raises(ValueError, match="at index 1 is not torch.tensor"):
        ops.for_loop(2, lambda a, b: (a, b), [torch.ones(1), 2])
    with pytest.raises(Error, match="must return as many tensors as it takes"):
        ops.for_loop(2, lambda a, b: a, [torch.ones(1), torch.ones(1)])
    with context.running(training=True):
        with pytest.raises(Error, match=re.escape(FOR_LOOP_TRAINING)):
            ops.for_loop(2, lambda a: a, [torch.ones(1)])


def test_cond_takes_the_right_branch():
    x, y = torch.tensor([3.0]), torch.tensor([5.0])
    then_body, else_body = (lambda a: a * 2), (lambda a, b: (a + b, a - b))
    assert ops.cond(torch.tensor(True), then_body, [x], else_body, [x, y]) == [torch.tensor([6.0])]
    with context.running(training=False):
        torch.testing.assert_close(ops.cond(torch.tensor([False]), then_body, [x], else_body, [x, y]),
                                   [torch.tensor([8.0]), torch.tensor([-2.0])])


def test_cond_errors():
    with pytest.raises(ValueError, match="then_inps and else_inps"):
        ops.cond(True, lambda a: a, torch.ones(1), lambda a: a, [torch.ones(1)])
    with context.running(training=True):
        with pytest.raises(Error, match=re.escape(COND_TRAINING)):
            ops.cond(True, lambda a: a, [torch.ones(1)], lambda a: a, [torch.ones(1)])


# --- host callback ----------------------------------------------------------------

def test_cpu_callback_runs_the_layer_on_cpu_tensors():
    seen = []

    def layer(x, y):
        seen.append((x.device.type, y.device.type))
        return x * y, x + y

    callback = ops.CPU(layer, "MyCPUOp")
    assert callback.ID == "MyCPUOp"
    x, y = torch.randn(5, 2), torch.tensor([2.0])
    product, total = callback(x, y)
    torch.testing.assert_close(product, x * 2)
    torch.testing.assert_close(total, x + 2)
    assert seen == [("cpu", "cpu")]


def test_cpu_callback_with_a_module_freezes_its_parameters():
    linear = torch.nn.Linear(3, 2)
    out = ops.CPU(linear, "Linear")(torch.ones(4, 3))
    assert not any(p.requires_grad for p in linear.parameters())
    torch.testing.assert_close(out, linear(torch.ones(4, 3)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_callback_returns_results_to_the_inputs_device():
    callback = ops.CPU(lambda x: x * 2 if x.device.type == "cpu" else None, "Double")
    out = callback(torch.ones(3, device="cuda"))
    assert out.device.type == "cuda"


# --- configuration scopes ---------------------------------------------------------

def test_multiconv_is_numerically_identity_and_validates():
    conv_a, conv_b = torch.nn.Conv2d(2, 3, 3), torch.nn.Conv2d(2, 3, 1)
    x = torch.randn(1, 2, 5, 5)
    expected = conv_a(x), conv_b(x)
    multi = (ops.MultiConv().availableMemoryProportions([0.5, 0.2])
             .partialsTypes([torch.float, torch.half]).enableConvDithering(True)
             .planType(enums.MultiConvPlanType.Serial).perConvReservedTiles(50)
             .cycleBackOff(0.3))
    with multi:
        got = conv_a(x), conv_b(x)
    torch.testing.assert_close(got, expected)
    with pytest.raises(AssertionError, match="Invalid available memory proportion!"):
        ops.MultiConv().availableMemoryProportions([0.5, 1])
    with pytest.raises(ValueError, match="Expecting torch.float or torch.half"):
        ops.MultiConv().partialsTypes(torch.int32)
    with pytest.raises(ValueError, match="value must be bool or list of bools"):
        ops.MultiConv().enableConvDithering([True, 1])
    with pytest.raises(AssertionError, match="Invalid plan type!"):
        ops.MultiConv().planType(1)
    with pytest.raises(AssertionError):
        ops.MultiConv().perConvReservedTiles(1.5)
    with pytest.raises(AssertionError):
        ops.MultiConv().cycleBackOff(1)


def test_name_scope_and_attribute_scopes():
    with ops.NameScope("encoder"):
        with ops.NameScope("layer0"):
            assert ops.NameScope.current() == "encoder/layer0"
            with ops.Attribute(__outline={"layer": "embedding"}) as attribute:
                assert attribute.attributes == {"__outline": {"layer": "embedding"}}
                assert torch.ones(2).mul(2).tolist() == [2.0, 2.0]
    assert ops.NameScope.current() == ""
    with pytest.raises(AssertionError, match="Parameter to NameScope must be a string"):
        ops.NameScope(3)


def test_custom_op_explains_the_fix():
    x = torch.ones(2)
    with pytest.raises(Error, match=re.escape("Register one before the model runs: "
                                              "openpop.register_custom_op('Cube', 'com.acme', fn)")):
        ops.custom_op([x, x], "Cube", "com.acme", 1, example_outputs=[x, x])


# --- CTC beam search --------------------------------------------------------------

def brute_force_ctc(probs, blank):
    """Exact probability of every decoded label sequence, by enumerating all alignments."""
    totals = {}
    for alignment in itertools.product(range(len(probs[0])), repeat=len(probs)):
        p = math.prod(probs[t][c] for t, c in enumerate(alignment))
        labels = tuple(c for i, c in enumerate(alignment)
                       if c != blank and (i == 0 or alignment[i - 1] != c))
        totals[labels] = totals.get(labels, 0.0) + p
    return sorted(totals.items(), key=lambda item: -item[1])


def test_ctc_decoder_hand_checked_example():
    # Two steps, P(blank)=0.6, P(a)=0.4 each. Best single alignment is "blank blank" (0.36),
    # but the label "a" gathers a-a, a-blank, blank-a: 0.16 + 0.24 + 0.24 = 0.64.
    log_probs = torch.tensor([[0.6, 0.4], [0.6, 0.4]]).log().unsqueeze(1)
    probabilities, lengths, paths = ops.ctc_beam_search_decoder(log_probs, torch.tensor([2]),
                                                                top_paths=2)
    torch.testing.assert_close(probabilities.exp(), torch.tensor([[0.64, 0.36]]))
    assert lengths.tolist() == [[1, 0]]
    assert paths.tolist() == [[[1, 0], [0, 0]]]


def test_ctc_decoder_matches_exhaustive_search_and_respects_lengths():
    torch.manual_seed(1)
    steps, batch, classes = 4, 3, 3
    log_probs = torch.randn(steps, batch, classes).log_softmax(-1)
    lengths = torch.tensor([4, 3, 1])
    probabilities, path_lengths, paths = ops.ctc_beam_search_decoder(
        log_probs, lengths, blank=2, beam_width=50, top_paths=3)
    assert probabilities.shape == (batch, 3) and path_lengths.shape == (batch, 3)
    assert paths.shape == (batch, 3, steps)
    for b in range(batch):
        n = int(lengths[b])
        expected = brute_force_ctc(log_probs[:n, b].exp().tolist(), blank=2)[:3]
        for k, (labels, p) in enumerate(expected):
            assert math.isclose(probabilities[b, k].exp().item(), p, rel_tol=1e-5)
            assert paths[b, k, :path_lengths[b, k]].tolist() == list(labels)


def test_ctc_decoder_default_arguments_and_errors():
    probabilities, lengths, paths = ops.ctc_beam_search_decoder(
        torch.randn(9, 3, 10), torch.randint(5, 9, (3,), dtype=torch.int))
    assert probabilities.shape == (3, 1) and lengths.shape == (3, 1) and paths.shape == (3, 1, 9)
    with pytest.raises(Error, match="probs must be a torch.tensor argument"):
        ops.ctc_beam_search_decoder([[0.0]], torch.tensor([1]))
    with pytest.raises(Error, match="lengths must be a torch.tensor argument"):
        ops.ctc_beam_search_decoder(torch.zeros(1, 1, 2), [1])


# --- fps / nearest ----------------------------------------------------------------

def test_fps_picks_the_farthest_points_per_example():
    src = torch.tensor([[0.0], [1.0], [10.0], [4.0],  # example 0
                        [0.0], [0.0], [5.0]])  # example 1
    # Example 0 (4 points, ratio 0.5 -> 2): start at 0, farthest is 10.0 (index 2).
    # Example 1 (3 points -> 2): start at row 4, farthest is row 6.
    assert ops.fps(src, [0, 4, 7], 0.5).tolist() == [0, 2, 4, 6]
    assert ops.fps(src, [0, 4], 1.0).tolist() == [0, 2, 3, 1]
    assert len(ops.fps(src, [0, 7], 0.5, random_start=True)) == 4
    with pytest.raises(Error, match="`ptr` must be a list of integers"):
        ops.fps(src, (0, 7))
    with pytest.raises(Error, match="`ratio` must be of float type"):
        ops.fps(src, [0, 7], 1)


def test_nearest_assigns_each_point_to_the_closest_in_its_example():
    x = torch.tensor([[0.0, 0.0], [4.0, 4.0], [0.9, 1.0], [5.0, 5.0]])
    y = torch.tensor([[1.0, 1.0], [5.0, 4.0], [0.0, 0.0]])
    assert ops.nearest(x, y).tolist() == [2, 1, 0, 1]
    # Same points, but x[0:2] / y[0:1] form example 0 and the rest example 1.
    assert ops.nearest(x, y, [0, 0, 1, 1], torch.tensor([0, 1, 1])).tolist() == [0, 0, 2, 1]
    with pytest.raises(Error, match="must take a torch.tensor `y` input"):
        ops.nearest(x, [1.0])
