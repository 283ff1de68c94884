"""A ``poptorch.DataLoader`` returned by a LightningModule's ``*_dataloader`` hook.

Built for other options than the stage runs with (``poptorch.Options()`` under
``Trainer(devices=2)``), it is re-created for the stage's options with every argument the user
gave (``batch_size`` stays the micro-batch size); one it cannot re-create is an error naming the
fix; one built for the stage's options is used as it is."""
import copy

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, TensorDataset

import poptorch

from helpers.lightning_models import IPUStrategy, Regressor, make_net, pl, regression_data, trainer
from helpers.oracle import train_loop

pytestmark = pytest.mark.usefixtures("one_thread")

MisconfigurationException = pl.utilities.exceptions.MisconfigurationException
REBUILT = "re-created it with the training options, keeping batch_size=3 as the micro-batch size"


class LoaderModule(Regressor):
    """Returns ``make_loader(self)`` from every dataloader hook."""

    def __init__(self, make_loader, **kwargs):
        super().__init__(**kwargs)
        self.make_loader = make_loader

    def train_dataloader(self):
        return self.make_loader(self)

    def predict_dataloader(self):
        return self.make_loader(self)


def _dataset(n=96):
    return TensorDataset(*regression_data(n=n))


def test_loader_with_default_options_is_recreated_for_the_run_and_trains_like_the_oracle():
    """batch_size=3 with poptorch.Options() under devices=2, device_iterations=2: PopTorch
    (and Lightning 2.0, which passed it on) refused it; openpop runs micro-batches of 3."""
    x, y = regression_data(n=96)
    model = LoaderModule(lambda m: poptorch.DataLoader(poptorch.Options(), TensorDataset(x, y), batch_size=3),
                         net=make_net())
    reference = copy.deepcopy(model.net)
    run = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    with pytest.warns(UserWarning, match=REBUILT):
        run.fit(model)

    assert {seen[3] for seen in model.seen if seen[0] == "train"} == {3}
    assert run.global_step == 96 // 12 * 2
    loader = run.train_dataloader
    assert isinstance(loader, poptorch.DataLoader) and loader.options is run.strategy.training_opts
    assert loader.combinedBatchSize == 12

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for start in range(0, 96, 12):
        train_loop(reference, optimizer, (x[start:start + 12], y[start:start + 12]),
                   lambda net, a, b: torch.nn.functional.mse_loss(net(a), b), di=2, ga=1, r=2)
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def _mark_collate(samples):
    x, y = torch.utils.data.default_collate(samples)
    return x, y + 1000.0  # visible in the step


SETTINGS = {
    "shuffle_workers_collate": lambda m: poptorch.DataLoader(
        poptorch.Options(), _dataset(), batch_size=3, shuffle=True, num_workers=1, collate_fn=_mark_collate,
        drop_last=False),
    "sampler": lambda m: poptorch.DataLoader(
        poptorch.Options(), _dataset(), batch_size=3, sampler=torch.utils.data.SubsetRandomSampler(range(48))),
    "batch_sampler": lambda m: poptorch.DataLoader(
        options=poptorch.Options(), dataset=_dataset(), batch_sampler=BatchSampler(SequentialSampler(range(96)), 3,
                                                                                   drop_last=True)),
    "async_mode": lambda m: poptorch.DataLoader(
        poptorch.Options(), _dataset(), batch_size=3, mode=poptorch.DataLoaderMode.Async),
}


@pytest.mark.parametrize("form", list(SETTINGS))
def test_recreated_loader_keeps_the_users_settings(form):
    seen_y = []

    class Model(LoaderModule):
        def training_step(self, batch, batch_idx):
            seen_y.append(batch[1].min().item())
            return super().training_step(batch, batch_idx)

    model = Model(SETTINGS[form])
    original = model.make_loader(model)
    run = trainer(accelerator="ipu", devices=2, max_epochs=1)
    with pytest.warns(UserWarning, match=REBUILT):
        run.fit(model)
    loader = run.train_dataloader
    assert isinstance(loader, poptorch.DataLoader) and loader is not original
    assert loader.options.replication_factor == 2
    assert {seen[3] for seen in model.seen if seen[0] == "train"} == {3}
    if form == "shuffle_workers_collate":
        assert isinstance(loader.sampler, RandomSampler) and loader.num_workers == 1
        assert loader.collate_fn is _mark_collate and min(seen_y) >= 900.0
        assert loader.combinedBatchSize == 6 and run.global_step == 96 // 6
    elif form == "sampler":
        assert type(loader.sampler) is torch.utils.data.SubsetRandomSampler and run.global_step == 48 // 6
    elif form == "batch_sampler":
        assert loader.batch_sampler.batch_size == 6 and run.global_step == 96 // 6
    else:
        assert loader._mode == poptorch.DataLoaderMode.Async and run.global_step == 96 // 6
        loader.terminate()
    original.terminate()


def test_loader_made_outside_the_hook_is_an_error_naming_the_fix():
    outside = poptorch.DataLoader(poptorch.Options(), _dataset(), batch_size=3)
    model = LoaderModule(lambda m: outside)
    before = [p.detach().clone() for p in model.parameters()]
    run = trainer(accelerator="ipu", devices=2, max_epochs=1)
    with pytest.raises(MisconfigurationException) as error:
        run.fit(model)
    message = str(error.value)
    assert "it was not created inside `train_dataloader`" in message
    assert "self.trainer.strategy.training_opts" in message and "replicationFactor(2)" in message
    assert run.global_step == 0
    for old, new in zip(before, model.parameters()):
        assert torch.equal(old, new)


def test_loader_subclass_without_options_argument_is_an_error_naming_it():
    class FixedOptionsLoader(poptorch.DataLoader):
        def __init__(self, dataset, batch_size):
            super().__init__(poptorch.Options(), dataset, batch_size=batch_size)

    model = LoaderModule(lambda m: FixedOptionsLoader(_dataset(), 3))
    with pytest.raises(MisconfigurationException, match="its class, FixedOptionsLoader, takes no `options`"):
        trainer(accelerator="ipu", devices=2, max_epochs=1).fit(model)


def test_loader_built_with_the_stage_options_is_used_as_it_is():
    """Training and predict with ``self.trainer.strategy.*_opts``: no copy, no warning; predict
    host calls take combined batches of 2 x 2 x 3 rows (Lightning's own predict-time rebuild of
    the loader used to take its batch size as the micro-batch size) and a prediction writer
    gets each host call's indices."""
    from lightning.pytorch.callbacks import BasePredictionWriter

    made = []

    def build(module):
        stage = module.trainer.state.stage
        options = module.trainer.strategy.training_opts if stage == "train" else module.trainer.strategy.inference_opts
        made.append(poptorch.DataLoader(options, _dataset(40), batch_size=3, drop_last=stage == "train"))
        return made[-1]

    class Writer(BasePredictionWriter):
        def __init__(self):
            super().__init__("batch")
            self.indices = []

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, loader_idx):
            self.indices.append(list(batch_indices))

    model = LoaderModule(build)
    writer = Writer()
    run = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1,
                  callbacks=[writer])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", ".*(does not have many workers|val_dataloader|LeafSpec).*")
        run.fit(model)
    assert run.train_dataloader is made[0] and run.global_step == 40 // 12 * 2
    predictions = run.predict(model)
    assert [p.shape[0] for p in predictions] == [12, 12, 12, 4]
    assert writer.indices == [list(range(start, min(start + 12, 40))) for start in range(0, 40, 12)]
    x = _dataset(40).tensors[0]
    torch.testing.assert_close(torch.cat(predictions), model(x).detach())
