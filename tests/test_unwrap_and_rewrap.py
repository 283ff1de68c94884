"""``model.destroy()`` and wrapping a model again, as on PopTorch: while a training model wraps
it, the user's model object offers ``destroy()``; afterwards it is its own class again."""
import copy
import gc
import io
import pickle
import weakref

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.models import Classifier, classifier_batch
from helpers.oracle import train_loop

ALREADY_WRAPPED = ("Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() on the "
                   "model to unwrap before wrapping again.")


def test_wrapped_model_offers_destroy_and_still_looks_like_itself():
    model = Classifier()
    assert not hasattr(model, "destroy")
    pop = poptorch.trainingModel(model)
    assert isinstance(model, Classifier) and isinstance(model, torch.nn.Module)
    assert type(model).__name__ == "Classifier" and type(model).__qualname__ == "Classifier"
    assert repr(model).startswith("Classifier(")
    assert callable(model.destroy)
    pop(*classifier_batch())
    assert list(model.state_dict()) == ["fc.weight", "fc.bias"]
    model.destroy()
    assert type(model) is Classifier and not hasattr(model, "destroy")
    assert not pop.isCompiled()


def test_model_destroy_then_wrap_again_continues_training():
    model = Classifier()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [classifier_batch(seed=s) for s in range(4)]
    first = poptorch.trainingModel(model, optimizer=optimizer)
    with pytest.raises(RuntimeError) as info:
        poptorch.trainingModel(model, optimizer=optimizer)
    assert str(info.value) == ALREADY_WRAPPED
    for x, labels in data[:2]:
        first(x, labels)
    model.destroy()
    second = poptorch.trainingModel(model, optimizer=optimizer)
    for x, labels in data[2:]:
        second(x, labels)

    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, labels in data:
        train_loop(reference, ref_optimizer, (x, labels), lambda m, a, b: m(a, b)[1], 1, 1, 1)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight)
    torch.testing.assert_close(model.fc.bias, reference.fc.bias)


def test_wrapper_destroy_then_wrap_the_wrapper_again():
    model = Classifier()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    pop = poptorch.trainingModel(model, optimizer=optimizer)
    pop(*classifier_batch(seed=1))
    pop.destroy()
    assert type(model) is Classifier
    again = poptorch.trainingModel(pop, optimizer=optimizer)
    assert again.model is model and type(model) is not Classifier and isinstance(model, Classifier)
    again(*classifier_batch(seed=2))

    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    for seed in (1, 2):
        train_loop(reference, ref_optimizer, classifier_batch(seed=seed), lambda m, a, b: m(a, b)[1], 1, 1, 1)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight)


def test_destroyed_wrapper_rewraps_when_called_again_unless_another_took_over():
    model = Classifier()
    old = poptorch.trainingModel(model)
    old(*classifier_batch())
    old.destroy()
    old(*classifier_batch())  # recompiles and wraps the model again
    assert callable(model.destroy)
    with pytest.raises(RuntimeError, match="already been wrapped"):
        poptorch.trainingModel(model)
    old.destroy()
    new = poptorch.trainingModel(model)
    with pytest.raises(RuntimeError) as info:
        old(*classifier_batch())
    assert str(info.value) == ALREADY_WRAPPED
    assert not old.isCompiled()
    new(*classifier_batch())
    new.destroy()  # destroying one that no longer wraps it changes nothing
    old.destroy()
    assert type(model) is Classifier


def test_inference_wrappers_do_not_wrap_the_model():
    model = Classifier()
    inference = poptorch.inferenceModel(model)
    inference(*classifier_batch())
    assert type(model) is Classifier
    training = poptorch.trainingModel(model)
    training(*classifier_batch())
    inference.destroy()
    assert callable(model.destroy)  # the training wrapper still holds it
    model.destroy()
    assert type(model) is Classifier


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_wrapped_model_pickles_as_its_own_class(protocol):
    model = Classifier()
    pop = poptorch.trainingModel(model)
    pop(*classifier_batch())
    restored = pickle.loads(pickle.dumps(model, protocol=protocol))
    assert type(restored) is Classifier
    torch.testing.assert_close(restored.fc.weight, model.fc.weight)
    assert type(copy.deepcopy(model)) is Classifier and type(copy.copy(model)) is Classifier
    stream = io.BytesIO()
    torch.save(model, stream)
    stream.seek(0)
    loaded = torch.load(stream, weights_only=False)
    assert type(loaded) is Classifier
    torch.testing.assert_close(loaded.fc.weight, model.fc.weight)
    assert type(model) is not Classifier  # still wrapped


def test_dropping_the_wrapper_unwraps_and_frees():
    model = Classifier()
    pop = poptorch.trainingModel(model)
    pop(*classifier_batch())
    del pop
    gc.collect()
    assert type(model) is Classifier
    poptorch.trainingModel(model)(*classifier_batch())  # nothing holds it: it can be wrapped again
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


class LitClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 5):
        super().__init__()
        self.save_hyperparameters()
        self.fc = torch.nn.Linear(4, hidden)
        self.out = torch.nn.Linear(hidden, 3)

    def forward(self, x, labels):
        out = self.out(torch.relu(self.fc(x)))
        return out, F.cross_entropy(out, labels)


def test_a_lightning_module_wrapped_directly():
    model = LitClassifier()
    pop = poptorch.trainingModel(model)
    pop(*classifier_batch())
    assert isinstance(model, pl.LightningModule) and isinstance(model, LitClassifier)
    assert type(model).__name__ == "LitClassifier"
    assert model.hparams.hidden == 5
    restored = copy.deepcopy(model)
    assert type(restored) is LitClassifier and restored.hparams.hidden == 5
    model.destroy()
    assert type(model) is LitClassifier
    poptorch.trainingModel(model)(*classifier_batch())
