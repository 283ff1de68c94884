"""Weight synchronisation rules and argument handling of ``PoplarExecutor``."""
import logging

import pytest
import torch
import torch.nn.functional as F

import poptorch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x, target=None):
        out = self.fc(x)
        if target is None:
            return out
        return out, F.mse_loss(out, target)


def test_user_model_shares_parameters_and_sees_trained_values():
    model = Net()
    weight = model.fc.weight
    pop = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    before = weight.detach().clone()
    pop(torch.randn(4, 3), torch.randn(4, 2))
    assert model.fc.weight is weight
    assert not torch.equal(model.fc.weight, before)
    assert pop.model is model
    assert pop.fc is model.fc  # attribute forwarding


def test_inference_model_sharing_a_trained_model_picks_up_new_weights():
    model = Net()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    inference = poptorch.inferenceModel(model)
    x = torch.randn(2, 3)
    first = inference(x)
    training(torch.randn(4, 3), torch.randn(4, 2))
    second = inference(x)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, model(x).detach())


def test_pure_inference_model_needs_copy_weights_to_device():
    model = Net()
    inference = poptorch.inferenceModel(model)
    x = torch.randn(2, 3)
    first = inference(x)
    with torch.no_grad():
        model.fc.weight.add_(1.0)
    torch.testing.assert_close(inference(x), first)
    inference.copyWeightsToDevice()
    torch.testing.assert_close(inference(x), model(x).detach())


def test_load_state_dict_uploads():
    model = Net()
    inference = poptorch.inferenceModel(model)
    x = torch.randn(2, 3)
    inference(x)
    other = Net()
    inference.load_state_dict(other.state_dict())
    torch.testing.assert_close(inference(x), other(x).detach())


def test_copy_weights_to_host_from_inference_copy():
    model = Net()
    inference = poptorch.inferenceModel(model)
    inference(torch.randn(2, 3))
    original = model.fc.weight.detach().clone()
    with torch.no_grad():
        model.fc.weight.zero_()
    inference.copyWeightsToHost()
    torch.testing.assert_close(model.fc.weight.detach(), original)


def test_named_buffers_update_only_when_listed():
    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.zeros(2))

        def forward(self, x):
            return x + self.offset

    model = WithBuffer()
    pop = poptorch.inferenceModel(model)
    pop(torch.zeros(1, 2))
    with pytest.raises(poptorch.Error, match="No named buffers marked as updatable"):
        pop.copyNamedBuffersToDevice()
    opts = poptorch.Options().updatableNamedBuffers(["offset"])
    pop = poptorch.inferenceModel(model, opts)
    pop(torch.zeros(1, 2))
    model.offset.fill_(3.0)
    torch.testing.assert_close(pop(torch.zeros(1, 2)), torch.zeros(1, 2))
    pop.copyNamedBuffersToDevice()
    torch.testing.assert_close(pop(torch.zeros(1, 2)), torch.full((1, 2), 3.0))


def test_detach_attach_cycle():
    pop = poptorch.inferenceModel(Net())
    pop(torch.randn(1, 3))
    assert pop.isAttachedToDevice()
    pop.detachFromDevice()
    assert not pop.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        pop.detachFromDevice()
    pop.attachToDevice()
    with pytest.raises(poptorch.Error, match="Device is already attached"):
        pop.attachToDevice()
    pop.detachFromDevice()
    pop(torch.randn(1, 3))  # calling re-attaches
    assert pop.isAttachedToDevice()


def test_keyword_default_and_star_args():
    class Mixed(torch.nn.Module):
        def forward(self, a, b=None, *rest, scale=1.0):
            out = a * scale
            if b is not None:
                out = out + b
            for extra in rest:
                out = out + extra
            return out

    pop = poptorch.inferenceModel(Mixed(), poptorch.Options().deviceIterations(2))
    a, b, c = torch.ones(4, 2), torch.full((4, 2), 2.0), torch.full((4, 2), 3.0)
    torch.testing.assert_close(pop(a, b, c, scale=2.0), a * 2 + b + c)
    with pytest.raises(poptorch.Error, match="Value mismatch for scale: expected 2.0 but got 3.0."):
        pop(a, b, c, scale=3.0)
    with pytest.raises(poptorch.Error, match="Number of positional arguments mismatch: expected 3 arguments "
                                             "but got 2."):
        pop(a, b, scale=2.0)


def test_mandatory_parameter_missing():
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    with pytest.raises(poptorch.Error, match="Mandatory parameter b missing"):
        poptorch.inferenceModel(Two())(torch.ones(1))


def test_nested_inputs_are_split_per_micro_batch():
    class Nested(torch.nn.Module):
        def forward(self, pair, mapping):
            return pair[0] + pair[1] * mapping["k"]

    opts = poptorch.Options().deviceIterations(3)
    pop = poptorch.inferenceModel(Nested(), opts)
    x, y, z = torch.randn(6, 2), torch.randn(6, 2), torch.randn(6, 2)
    torch.testing.assert_close(pop((x, y), {"k": z}), x + y * z)
    with pytest.raises(poptorch.Error, match="Length mismatch for pair: expected 2 elements but got 3."):
        pop((x, y, z), {"k": z})
    with pytest.raises(poptorch.Error, match="Keys mismatch for mapping: Unexpected arguments: j. "
                                             "Missing arguments: k."):
        pop((x, y), {"j": z})


def test_inputs_requiring_grad_are_detached_with_warning(caplog):
    pop = poptorch.inferenceModel(torch.nn.Linear(2, 2))
    x = torch.randn(2, 2, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="poptorch::python"):
        poptorch.logger.propagate = True
        try:
            out = pop(x)
        finally:
            poptorch.logger.propagate = False
    assert not out.requires_grad
    assert any("will be detached" in r.getMessage() for r in caplog.records)


def test_in_place_input_changes_reach_the_caller():
    class AddOne(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    pop = poptorch.inferenceModel(AddOne(), poptorch.Options().deviceIterations(2))
    x = torch.zeros(4, 2)
    out = pop(x)
    torch.testing.assert_close(x, torch.ones(4, 2))
    torch.testing.assert_close(out, torch.full((4, 2), 2.0))
    y = torch.zeros(2, 4).t()  # non-contiguous: converted, then written back
    pop2 = poptorch.inferenceModel(AddOne(), poptorch.Options().deviceIterations(2))
    pop2(y)
    torch.testing.assert_close(y, torch.ones(4, 2))


def test_input_replica_grouping_shares_chunks():
    class Echo(torch.nn.Module):
        def forward(self, x):
            return x

    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    x = torch.tensor([[0.0], [1.0]])  # 4 replicas / group 2 = 2 chunks of 1 row
    torch.testing.assert_close(poptorch.inferenceModel(Echo(), opts)(x), torch.tensor([[0.0], [0.0], [1.0], [1.0]]))
    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    torch.testing.assert_close(poptorch.inferenceModel(Echo(), opts)(x), torch.tensor([[0.0], [1.0], [0.0], [1.0]]))


def test_model_mode_is_frozen_at_compile():
    """Like a compiled PopTorch graph: the training model keeps dropout on even after eval()."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    model.eval()
    inference = poptorch.inferenceModel(model)
    x = torch.ones(8, 4)
    first = inference(x)
    model.train()
    torch.testing.assert_close(inference(x), first)
    assert model.training  # the user's flag is theirs to keep


def test_options_are_frozen_and_executor_works_on_a_clone():
    opts = poptorch.Options()
    pop = poptorch.inferenceModel(Net(), opts)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(2)
    assert opts.defaultOutputMode()
    assert pop.options.output_mode == poptorch.OutputMode.All
    with pytest.raises(poptorch.Error, match="Invalid type: 'options'"):
        poptorch.inferenceModel(Net(), {"device_iterations": 1})


def test_perf_counters_and_latency():
    pop = poptorch.inferenceModel(Net(), poptorch.Options().deviceIterations(3))
    pop(torch.randn(6, 3))
    counters = pop.getPerfCounters()
    assert set(counters) == {"input", "input_complete", "output", "output_complete"}
    assert len(counters["input"][0]) == 3
    low, high, avg = pop.getLatency()
    assert 0 <= low <= avg <= high


def test_custom_input_type_with_registered_parser():
    class Batch:
        def __init__(self, features, scale):
            self.features, self.scale = features, scale

    class BatchParser(poptorch.ICustomArgParser):
        def yieldTensors(self, struct):
            yield struct.features

        def reconstruct(self, original_structure, tensor_iterator):
            return Batch(next(tensor_iterator), original_structure.scale)

    poptorch.registerCustomArgParser(Batch, BatchParser())

    class UsesBatch(torch.nn.Module):
        def forward(self, batch):
            return batch.features * batch.scale

    pop = poptorch.inferenceModel(UsesBatch(), poptorch.Options().deviceIterations(2))
    x = torch.randn(4, 3)
    torch.testing.assert_close(pop(Batch(x, 3.0)), x * 3.0)
    torch.testing.assert_close(pop(Batch(x + 1, 3.0)), (x + 1) * 3.0)
    with pytest.raises(poptorch.Error, match="Shape mismatch for batch\\[0\\]"):
        pop(Batch(torch.randn(2, 3), 3.0))


def test_save_and_load_round_trip(tmp_path):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pop = poptorch.trainingModel(model, poptorch.Options().deviceIterations(2), optimizer)
    x, t = torch.randn(4, 3), torch.randn(4, 2)
    pop(x, t)
    path = tmp_path / "model.pop"
    pop.save(str(path))
    restored = poptorch.load(str(path), edit_opts_fn=lambda opts: opts.randomSeed(1))
    assert restored.options.device_iterations == 2
    # Same weights and momentum: the next step agrees with the original executor.
    _, loss_a = pop(x, t)
    _, loss_b = restored(x, t)
    torch.testing.assert_close(loss_a, loss_b)
    for p, q in zip(model.parameters(), restored.model.parameters()):
        torch.testing.assert_close(p, q)
    (tmp_path / "junk").write_bytes(b"not a model")
    with pytest.raises(poptorch.Error, match="is not a file saved by"):
        poptorch.load(str(tmp_path / "junk"))


def test_returned_tensors_never_alias_model_or_inputs(backend):
    class ReturnsState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            return x, self.fc.bias

    model = ReturnsState()
    x = torch.randn(1, 2)
    out, bias = poptorch.inferenceModel(model)(x)
    out.mul_(0)
    bias.mul_(0)
    assert not torch.equal(x, torch.zeros_like(x))
    assert not torch.equal(model.fc.bias.detach(), torch.zeros(2))


def test_default_given_explicitly_matches_the_compiled_call():
    class Scaled(torch.nn.Module):
        def forward(self, x, scale=2.0):
            return x * scale

    pop = poptorch.inferenceModel(Scaled())
    x = torch.ones(1, 2)
    pop(x)
    torch.testing.assert_close(pop(x, 2.0), x * 2)
    with pytest.raises(poptorch.Error, match="Value mismatch for scale"):
        pop(x, scale=3.0)


def test_dropped_training_models_are_freed():
    import gc
    import weakref
    model = Net()
    pop = poptorch.trainingModel(model)
    pop(torch.randn(2, 3), torch.randn(2, 2))
    ref = weakref.ref(model)
    del model, pop
    gc.collect()
    assert ref() is None


def test_failed_training_call_still_resyncs_sharing_inference_model():
    class FailsOnSecondIteration(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)
            self.calls = 0

        def forward(self, x, target=None):
            out = self.fc(x)
            if target is None:
                return out
            self.calls += 1
            if self.calls == 3:  # compile pass, iteration 0, then iteration 1 fails
                raise RuntimeError("boom")
            return out, F.mse_loss(out, target)

    model = FailsOnSecondIteration()
    training = poptorch.trainingModel(model, poptorch.Options().deviceIterations(2),
                                      torch.optim.SGD(model.parameters(), lr=0.5))
    inference = poptorch.inferenceModel(model)
    x = torch.randn(1, 3)
    inference(x)
    with pytest.raises(RuntimeError, match="boom"):
        training(torch.randn(2, 3), torch.randn(2, 2))
    torch.testing.assert_close(inference(x), model.fc(x).detach())


def test_inference_model_compiled_under_inference_mode():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).eval()
    pop = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    x = torch.randn(4, 3)
    with torch.inference_mode():
        out = pop(x)
        out = pop(x)
    torch.testing.assert_close(out, model(x).detach())
