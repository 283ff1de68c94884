"""poptorch.custom_op: the registry of PyTorch implementations and the ops Graphcore's
applications call, each checked against a plain-PyTorch reference."""
import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F

import openpop
import poptorch
from openpop.custom_ops import registered_custom_op, unregister_custom_op

from helpers.oracle import train_loop


@pytest.fixture
def scratch_op():
    """A name free for the test to register; unregistered afterwards."""
    yield "Scratch", "test.domain"
    if registered_custom_op("Scratch", "test.domain") is not None:
        unregister_custom_op("Scratch", "test.domain")


def call(name, domain, inputs, examples, attributes=None):
    return poptorch.custom_op(inputs, name, domain, 1, example_outputs=examples, attributes=attributes)


# --- the registry and custom_op's contract ------------------------------------------

def test_an_unregistered_op_names_itself_and_the_registration_call():
    x = torch.ones(2)
    with pytest.raises(poptorch.Error) as info:
        call("Cube", "com.acme", [x, x], [x, x])
    text = str(info.value)
    assert "'com.acme::Cube'" in text
    assert "openpop.register_custom_op('Cube', 'com.acme', fn)" in text


def test_registered_op_runs_with_attributes_as_keywords_and_returns_a_list(scratch_op):
    name, domain = scratch_op

    @openpop.register_custom_op(name, domain)
    def cube(x, bias, scale=1.0):
        return x * x * x * scale + bias, x * x * x

    assert poptorch.register_custom_op is openpop.register_custom_op
    x, bias = torch.full((1, 8), 2.0), torch.full((1, 8), 4.0)
    out = call(name, domain, [x, bias], [x, x], {"scale": 0.5})
    assert isinstance(out, list) and len(out) == 2
    torch.testing.assert_close(out[0], torch.full((1, 8), 8.0))
    torch.testing.assert_close(out[1], torch.full((1, 8), 8.0))


def test_outputs_take_the_examples_dtype_and_must_match_count_and_shape(scratch_op):
    name, domain = scratch_op
    openpop.register_custom_op(name, domain, lambda x: x.sum(-1))
    x = torch.arange(6.0).reshape(2, 3)
    (out,) = call(name, domain, [x], [torch.zeros(2, dtype=torch.float64)])
    assert out.dtype == torch.float64 and out.tolist() == [3.0, 12.0]
    with pytest.raises(poptorch.Error, match=re.escape("returned 1 output(s), example_outputs holds 2")):
        call(name, domain, [x], [x, x])
    with pytest.raises(poptorch.Error, match=re.escape("output 0 of its implementation")):
        call(name, domain, [x], [x])
    with pytest.raises(ValueError, match=re.escape("example_outputs[0] must be a torch.Tensor")):
        call(name, domain, [x], [3])


def test_registering_twice_needs_replace(scratch_op):
    name, domain = scratch_op
    openpop.register_custom_op(name, domain, lambda x: x)
    with pytest.raises(ValueError, match="pass replace=True"):
        openpop.register_custom_op(name, domain, lambda x: x + 1)
    openpop.register_custom_op(name, domain, lambda x: x + 1, replace=True)
    assert call(name, domain, [torch.zeros(1)], [torch.zeros(1)])[0].item() == 1.0
    with pytest.raises(ValueError, match="fn must be callable"):
        openpop.register_custom_op("Other", domain, 3)
    with pytest.raises(ValueError, match="domain must be a non-empty string"):
        openpop.register_custom_op("Other", "", lambda x: x)


@pytest.mark.parametrize("attributes, message", [
    ({1: 2}, "All attribute keys must be strings."),
    ({"a": {"b": 1}}, "Attribute values must be floats, ints, strings or a list/tuple of float, ints of strings."),
    ({"a": [1, 2.0]}, "The types in a list/tuple attribute must all be the same."),
    ({"a": "caf\u00e9"}, "caf\u00e9 contains non-ASCII characters."),
])
def test_attributes_follow_poptorch_rules(attributes, message):
    x = torch.ones(2)
    with pytest.raises(ValueError, match=re.escape(message)):
        call("LeakyRelu", "custom.ops", [x], [x], attributes)


def test_a_registered_op_trains_in_an_executor_like_plain_pytorch(scratch_op):
    """A user's op with its gradient by autograd, in a training model: the oracle's weights."""
    name, domain = scratch_op
    openpop.register_custom_op(name, domain, lambda x, power=2: x.abs() ** power)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, y):
            out = call(name, domain, [self.fc(x)], [x], {"power": 3})[0]
            return out, F.mse_loss(out, y)

    torch.manual_seed(0)
    model = Model()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.05))(x, y)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05), [x, y],
               lambda m, a, b: m(a, b)[1], di=2, ga=2, r=1)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


# --- layout-only ops and the tutorial's LeakyRelu -----------------------------------

@pytest.mark.parametrize("name, attributes", [
    ("RemapCE", {"grain_size": 8}),
    ("RemapCE", {"fwd_grain_size": 16, "bwd_grain_size": 16, "fwd_clone_layout": 0, "bwd_clone_layout": 0,
                 "fwd_after_matmul": 0, "bwd_after_matmul": 0, "debug_str": "logits"}),
    ("CopyTensor", None),
])
def test_layout_ops_are_copies_with_identity_gradients(name, attributes):
    x = torch.randn(3, 5, requires_grad=True)
    (out,) = call(name, "ai.graphcore", [x], [x], attributes)
    assert out is not x and out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, x)
    weights = torch.randn(3, 5)
    (out * weights).sum().backward()
    torch.testing.assert_close(x.grad, weights)


def test_leaky_relu_matches_torch_forward_and_backward():
    x = torch.tensor([-2.0, -0.5, 0.5, 3.0], requires_grad=True)
    (out,) = call("LeakyRelu", "custom.ops", [x], [x], {"alpha": 0.02})
    reference = x.detach().clone().requires_grad_()
    expected = F.leaky_relu(reference, 0.02)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)
    (default,) = call("LeakyRelu", "custom.ops", [x], [x])
    torch.testing.assert_close(default, F.leaky_relu(x, 0.01))


# --- Ctc ------------------------------------------------------------------------------

def ctc_inputs(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    steps, batch, classes, labels = 12, 3, 6, 4
    logits = torch.randn(steps, batch, classes, dtype=dtype, requires_grad=True)
    targets = torch.randint(1, classes, (batch, labels), dtype=torch.int32)
    return logits, targets, torch.tensor([12, 10, 9], dtype=torch.int32), torch.tensor([4, 2, 3], dtype=torch.int32)


@pytest.mark.parametrize("reduction", ["Sum", "Mean", "None"])
def test_ctc_matches_torch_ctc_loss_and_its_gradient(reduction):
    logits, targets, input_lengths, target_lengths = ctc_inputs()
    log_probs = logits.log_softmax(-1)
    example_loss = torch.zeros(3) if reduction == "None" else torch.zeros(())
    loss, gradient = call("Ctc", "ai.graphcore", [log_probs, targets, input_lengths, target_lengths],
                          [example_loss, log_probs], {"reduction": reduction, "blank": 0})
    reference_logits = logits.detach().clone().requires_grad_()
    reference_log_probs = reference_logits.log_softmax(-1)
    expected = F.ctc_loss(reference_log_probs, targets.long(), input_lengths.long(), target_lengths.long(),
                          blank=0, reduction=reduction.lower())
    torch.testing.assert_close(loss, expected)
    seed = torch.randn(expected.shape)
    (loss * seed).sum().backward()
    (expected * seed).sum().backward()
    torch.testing.assert_close(logits.grad, reference_logits.grad)
    # the second output: the gradient of each sample's loss with respect to log_probs
    per_sample = F.ctc_loss(reference_log_probs, targets.long(), input_lengths.long(), target_lengths.long(),
                            reduction="none")
    (expected_gradient,) = torch.autograd.grad(per_sample.sum(), reference_log_probs)
    torch.testing.assert_close(gradient, expected_gradient)
    assert not gradient.requires_grad


def test_ctc_rejects_an_unknown_reduction_with_poparts_text():
    logits, targets, input_lengths, target_lengths = ctc_inputs()
    with pytest.raises(ValueError, match="Unexpected ReductionType string, Average. Cannot convert"):
        call("Ctc", "ai.graphcore", [logits, targets, input_lengths, target_lengths], [torch.zeros(()), logits],
             {"reduction": "Average"})


class ConformerCtc(torch.nn.Module):
    """The Conformer application's call: a half or float dummy scalar and log_probs as examples,
    Sum reduction divided by the batch size, the app's attributes (its "UNDIFINED" included)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.out = torch.nn.Linear(5, 6)
        self.dtype = dtype

    def forward(self, features, targets, input_lengths, target_lengths):
        log_probs = F.log_softmax(self.out(features), -1).transpose(0, 1)  # [T, N, C]
        dummy = torch.zeros_like(torch.tensor(58.0, dtype=self.dtype), dtype=self.dtype, requires_grad=True)
        loss = poptorch.custom_op(
            [log_probs, targets, input_lengths, target_lengths - 1], "Ctc", "ai.graphcore", 1,
            example_outputs=[dummy, log_probs],
            attributes={"enableReducedClassesInLabel": self.training, "reduction": "Sum", "blank": 0,
                        "outDataType": "UNDIFINED"})[0]
        loss = loss / torch.tensor(log_probs.shape[1], dtype=self.dtype)
        return poptorch.identity_loss(loss, reduction="mean")


def reference_conformer_loss(model, features, targets, input_lengths, target_lengths):
    log_probs = F.log_softmax(model.out(features), -1).transpose(0, 1)
    loss = F.ctc_loss(log_probs, targets.long(), input_lengths.long(), (target_lengths - 1).long(), reduction="sum")
    return loss / log_probs.shape[1]


def test_conformer_ctc_trains_like_torch_ctc_loss():
    torch.manual_seed(0)
    model = ConformerCtc()
    reference = copy.deepcopy(model)
    batch = 8
    features = torch.randn(batch, 10, 5)
    targets = torch.randint(1, 6, (batch, 4), dtype=torch.int32)
    input_lengths = torch.randint(7, 11, (batch,), dtype=torch.int32)
    target_lengths = torch.randint(2, 5, (batch,), dtype=torch.int32)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(features, targets, input_lengths, target_lengths)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1),
               [features, targets, input_lengths, target_lengths], reference_conformer_loss, di=2, ga=2, r=1)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


def test_ctc_in_half_precision_computes_in_float():
    logits, targets, input_lengths, target_lengths = ctc_inputs(dtype=torch.float16)
    log_probs = logits.log_softmax(-1)
    loss, _ = call("Ctc", "ai.graphcore", [log_probs, targets, input_lengths, target_lengths],
                   [torch.zeros((), dtype=torch.float16), log_probs], {"reduction": "Mean", "blank": 0})
    expected = F.ctc_loss(log_probs.float(), targets.long(), input_lengths.long(), target_lengths.long())
    assert loss.dtype == torch.float16
    torch.testing.assert_close(loss.float(), expected, atol=1e-2, rtol=1e-2)
    loss.backward()
    assert logits.grad.dtype == torch.float16 and torch.isfinite(logits.grad).all()


# --- Nms ------------------------------------------------------------------------------

def reference_nms(scores, boxes, threshold, score_threshold, detections, sigma=0.0):
    """Per image, in plain Python: repeatedly take the best remaining (box, class) pair (ties:
    lowest box, then class) and suppress that class's overlapping boxes."""
    int_max = 2 ** 31 - 1
    batch, count, classes = scores.shape
    result = []
    for b in range(batch):
        work = {(n, c): float(scores[b, n, c]) for n in range(count) for c in range(classes)}
        box = [[float(v) for v in boxes[b, n]] for n in range(count)]
        indices, kept_scores, kept_boxes, kept_classes = [], [], [], []
        length = detections
        for step in range(detections):
            (n, c), best = max(work.items(), key=lambda item: (item[1], -item[0][0], -item[0][1]))
            if not best > score_threshold:
                length = step
                break
            indices.append(n)
            kept_scores.append(best)
            kept_boxes.append(box[n])
            kept_classes.append(c)
            work[(n, c)] = -math.inf
            x1, y1, x2, y2 = box[n]
            for m in range(count):
                if work[(m, c)] > score_threshold:
                    a1, b1, a2, b2 = box[m]
                    inter = max(0.0, min(a2, x2) - max(a1, x1)) * max(0.0, min(b2, y2) - max(b1, y1))
                    iou = inter / ((a2 - a1) * (b2 - b1) + (x2 - x1) * (y2 - y1) - inter)
                    if sigma == 0.0:
                        if iou > threshold:
                            work[(m, c)] = -math.inf
                    else:
                        work[(m, c)] *= math.exp(-(iou * iou) / sigma)
        pad = detections - len(indices)
        result.append((indices + [-1] * pad, kept_scores + [0.0] * pad, kept_boxes + [[0.0] * 4] * pad,
                       kept_classes + [int_max] * pad, length))
    return result


def random_detections(seed, batch=3, count=20, classes=4):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(batch, count, 2, generator=generator) * 40
    size = torch.rand(batch, count, 2, generator=generator) * 20 + 5
    boxes = torch.cat([corner, corner + size], -1)
    scores = torch.rand(batch, count, classes, generator=generator)
    scores = scores * (scores > 0.4)  # as YOLOv4's preprocessing zeroes the low ones
    return scores, boxes


@pytest.mark.parametrize("seed, threshold, score_threshold, detections, sigma", [
    (0, 0.5, 0.3, 10, 0.0),
    (1, 0.3, 0.5, 30, 0.0),   # an image runs out of detections before the others
    (2, 0.6, 0.2, 5, 0.0),
    (3, 0.5, 0.3, 12, 0.5),   # soft NMS
])
def test_nms_matches_a_reference(seed, threshold, score_threshold, detections, sigma):
    scores, boxes = random_detections(seed)
    attributes = {"threshold": threshold, "scoreThreshold": score_threshold, "numDetections": detections,
                  "useGather": 1}
    if sigma:
        attributes["sigma"] = sigma
    batch = scores.shape[0]
    examples = [torch.zeros(batch, detections, dtype=torch.long), torch.zeros(batch, detections),
                torch.zeros(batch, detections, 4), torch.zeros(batch, detections, dtype=torch.int),
                torch.zeros(batch, dtype=torch.int)]
    indices, kept_scores, kept_boxes, classes, lengths = call("Nms", "ai.graphcore", [scores, boxes], examples,
                                                              attributes)
    assert [t.dtype for t in (indices, kept_scores, kept_boxes, classes, lengths)] == [e.dtype for e in examples]
    expected = reference_nms(scores, boxes, threshold, score_threshold, detections, sigma)
    for b, (want_indices, want_scores, want_boxes, want_classes, want_length) in enumerate(expected):
        assert indices[b].tolist() == want_indices
        torch.testing.assert_close(kept_scores[b], torch.tensor(want_scores))
        torch.testing.assert_close(kept_boxes[b], torch.tensor(want_boxes))
        assert classes[b].tolist() == want_classes
        assert lengths[b].item() == want_length
    if seed == 1:
        assert len(set(lengths.tolist())) > 1


def test_nms_in_an_inference_model_as_yolo_calls_it():
    class Nms(torch.nn.Module):
        def forward(self, scores, boxes):
            batch = scores.shape[0]
            return poptorch.custom_op(
                inputs=[scores, boxes], name="Nms", domain="ai.graphcore", domain_version=1,
                attributes={"threshold": 0.45, "scoreThreshold": 0.3, "numDetections": 8, "useGather": 1},
                example_outputs=[torch.zeros(dtype=torch.long, size=[batch, 8]),
                                 torch.zeros(dtype=scores.dtype, size=[batch, 8]),
                                 torch.zeros(dtype=boxes.dtype, size=[batch, 8, 4]),
                                 torch.zeros(dtype=torch.int, size=[batch, 8]),
                                 torch.zeros(dtype=torch.int, size=[batch])])

    scores, boxes = random_detections(4, batch=4)
    outputs = poptorch.inferenceModel(Nms(), poptorch.Options().deviceIterations(2))(scores, boxes)
    plain = Nms()(scores, boxes)
    for got, want in zip(outputs, plain):
        assert torch.equal(got, want)


def test_nms_checks_its_shapes():
    with pytest.raises(ValueError, match="scores must be \\[batch, boxes, classes\\]"):
        call("Nms", "ai.graphcore", [torch.zeros(2, 5), torch.zeros(2, 5, 4)], [torch.zeros(1)] * 5)


# --- ExpMovAvg ------------------------------------------------------------------------

class Dino(torch.nn.Module):
    """DINO's pattern: a trained student, a frozen teacher that follows it by ExpMovAvg inside
    the forward pass (under no_grad, in a Block; the teacher's BeginBlock starts the next one),
    ema_factor one value per sample."""

    def __init__(self):
        super().__init__()
        self.student = torch.nn.Linear(4, 4)
        # (not a copy of the student: the loss trains the student from the first step)
        self.teacher = poptorch.BeginBlock(torch.nn.Linear(4, 4), "ipu0", ipu_id=0)
        for p in self.teacher.parameters():
            p.requires_grad = False

    def forward(self, x, ema_factor):
        out = self.student(x)
        with torch.no_grad():
            for q, k in zip(self.student.parameters(), self.teacher.parameters()):
                with poptorch.Block("ipu0", 0):
                    poptorch.custom_op([q, k, ema_factor], "ExpMovAvg", "com.acme", 1, example_outputs=[q],
                                       attributes={})
            target = self.teacher(x)
        return out, F.mse_loss(out, target)


def test_exp_mov_avg_outside_an_executor_updates_in_place():
    weight, average = torch.randn(5), torch.randn(5)
    expected = 0.9 * average + 0.1 * weight
    (out,) = call("ExpMovAvg", "com.acme", [weight, average, torch.tensor([0.9])], [weight], {})
    torch.testing.assert_close(average, expected)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("replicas", [1, 2])
def test_exp_mov_avg_updates_the_teacher_once_per_step(replicas):
    torch.manual_seed(0)
    model = Dino()
    reference = copy.deepcopy(model)
    di, ga, momentum = 2, 3, 0.8
    rows = di * ga * replicas
    x = torch.randn(rows, 4)
    factor = torch.full((rows,), momentum)
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.student.parameters(), lr=0.1))
    training(x, factor)
    # The oracle: each step, the teacher first follows the student's weights of that step, then
    # every micro-batch of the step trains the student against it.
    optimizer = torch.optim.SGD(reference.student.parameters(), lr=0.1)
    views = x.reshape(di, ga * replicas, 1, 4)
    for step in range(di):
        with torch.no_grad():
            for q, k in zip(reference.student.parameters(), reference.teacher.parameters()):
                k.mul_(momentum).add_((1 - momentum) * q)
        optimizer.zero_grad()
        for micro in views[step]:
            out = reference.student(micro)
            (F.mse_loss(out, reference.teacher(micro)) / (ga * replicas)).backward()
        optimizer.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)
