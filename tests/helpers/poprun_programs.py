"""Programs the poprun tests launch (``python helpers/poprun_programs.py COMMAND ...``), and the model,
options and data they share with the one-process oracle in the tests.

Commands:
  train OUTDIR CONFIG...   train each config under popdist; write weights, losses, shards
  fail-after SECONDS RANK  instance RANK raises after SECONDS; the others sleep
  sleep SECONDS            print the pid, then sleep (Ctrl-C / kill -9 tests)
  stuck-collective         instance 1 never joins the all-reduce instance 0 waits in
  killed-in-allreduce DIR  each instance starts a child process and trains; in step 2's gradient all-reduce
                           both write DIR/in-all-reduce-<instance> and instance 1 stays there (for a kill -9)
  bert-stalled-checkpoint STEP DIR ARGS...
                           openpop-bert ARGS; instance 0's write of step_STEP.pt keeps a copy of the whole
                           checkpoint in DIR/uninterrupted.pt, writes half of it, writes its pid to
                           DIR/writing and stays there (for a kill -9 during the write)
  mismatch                 instance 1 builds a wider model than instance 0
  lightning OUTDIR         Trainer(accelerator="ipu") in every instance, with a checkpoint callback
  replicas N|popdist       one training call with plain Options().replicationFactor(N), or with
                           popdist.poptorch.Options() after trying replicationFactor(1) on it
"""
import os
import sys
import time

import torch

STEPS = 3  # host calls per config
MICRO = 2  # micro-batch size

# name -> (optimizer, reduction, gradient accumulation, device iterations, automatic loss scaling, pipelined)
CONFIGS = {
    "sgd_momentum_mean": ("sgd", "Mean", 2, 2, False, False),
    "adam_sum": ("adam", "Sum", 1, 1, False, False),
    "lamb_ga": ("lamb", "Mean", 3, 1, False, False),
    "als_skip": ("sgd", "Mean", 2, 1, True, False),
    "pipelined": ("sgd", "Mean", 3, 1, False, True),
}


class Net(torch.nn.Module):
    def __init__(self, pipelined=False):
        super().__init__()
        import poptorch
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        if pipelined:
            self.fc1 = poptorch.BeginBlock(self.fc1, "first", ipu_id=0)
            self.fc2 = poptorch.BeginBlock(self.fc2, "second", ipu_id=1)

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, torch.nn.functional.cross_entropy(out, y)


def build(name, options, init_seed):
    """Model, training model and the options for config ``name`` (``options`` is pre-made:
    popdist's or a plain one with the replication factor set)."""
    import poptorch
    kind, reduction, ga, di, als, pipelined = CONFIGS[name]
    torch.manual_seed(init_seed)
    model = Net(pipelined)
    options.Training.gradientAccumulation(ga)
    options.deviceIterations(di)
    options.Training.accumulationAndReplicationReductionType(getattr(poptorch.ReductionType, reduction))
    options.outputMode(poptorch.OutputMode.All)
    options.showCompilationProgressBar(False)
    if pipelined:
        options.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    if als:
        options.Training.setAutomaticLossScaling(True)
    if kind == "sgd":
        optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                       loss_scaling=1024.0 if als else None)
    elif kind == "adam":
        optimizer = poptorch.optim.Adam(model.parameters(), lr=0.01)
    else:
        optimizer = poptorch.optim.LAMB(model.parameters(), lr=0.01)
    return model, poptorch.trainingModel(model, options, optimizer), optimizer


def global_batch(name, call, total_replicas):
    """The inputs of host call ``call`` for all replicas: ``[DI, GA, R, micro, ...]``."""
    _kind, _reduction, ga, di, als, _pipelined = CONFIGS[name]
    generator = torch.Generator().manual_seed(1000 * call + len(name))
    x = torch.randn(di, ga, total_replicas, MICRO, 8, generator=generator)
    y = torch.randint(0, 4, (di, ga, total_replicas, MICRO), generator=generator)
    if als and call == 1:
        x[0, 1, total_replicas - 1] *= 1e38  # the last instance's micro-batch overflows: step skipped
    return x, y


def local_part(tensor, first_replica, local_replicas):
    return tensor[:, :, first_replica:first_replica + local_replicas].reshape(-1, *tensor.shape[4:])


def train(outdir, names):
    import popdist
    import popdist.poptorch
    popdist.init()
    rank = popdist.getInstanceIndex()
    total, local, offset = popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset()
    results = {"api": {"instance": rank, "instances": popdist.getNumInstances(), "total": total, "local": local,
                       "offset": offset, "local_index": popdist.getLocalInstanceIndex(),
                       "env_set": popdist.isPopdistEnvSet(), "ipus": popdist.getNumIpusPerReplica()}}
    for name in names:
        # Instances start from different weights: the first run must give them instance 0's.
        options = popdist.poptorch.Options(ipus_per_replica=1)
        model, training, optimizer = build(name, options, init_seed=1234 + rank)
        losses = []
        for call in range(STEPS):
            x, y = global_batch(name, call, total)
            _out, loss = training(local_part(x, offset, local), local_part(y, offset, local))
            losses.append(loss.detach().clone())
        results[name] = {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                         "losses": losses, "loss_scaling": getattr(optimizer, "loss_scaling", None),
                         "overlapped_buckets": training._processes.overlapped_buckets}
        training.destroy()
    results["shards"] = shards(rank)
    results["execute_on_instances"] = popdist.execute_on_instances({0}, lambda value: value + rank, 10)
    results["horovod"] = horovod_checks(rank)
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    print(f"instance {rank} done")


def shards(rank):
    """One epoch of every loader variant: the dataset indices this instance read."""
    import popdist.poptorch
    import poptorch
    dataset = torch.arange(37)
    read = {}
    for drop_last in (True, False):
        options = popdist.poptorch.Options()
        options.randomSeed(7)
        loader = poptorch.DataLoader(options, dataset, batch_size=2, shuffle=True, drop_last=drop_last,
                                     auto_distributed_partitioning=True)
        read[drop_last] = torch.cat([batch.reshape(-1) for batch in loader]).tolist()
    return read


def horovod_checks(rank):
    import horovod.torch as hvd
    hvd.init()
    params = {"w": torch.full((3,), float(rank + 1))}
    hvd.broadcast_parameters(params, root_rank=0)
    return {"module": hvd.__name__, "rank": hvd.rank(), "size": hvd.size(),
            "average": hvd.allreduce(torch.tensor([float(rank)]), average=True).item(),
            "sum": hvd.allreduce(torch.tensor([float(rank + 1)]), average=False).item(),
            "broadcast": hvd.broadcast(torch.tensor([float(rank + 5)]), root_rank=1).item(),
            "params": params["w"].tolist()}


def fail_after(seconds, failing_rank):
    rank = int(os.environ["RANK"])
    print(f"pid {os.getpid()}", flush=True)
    time.sleep(seconds)
    if rank == failing_rank:
        raise ValueError(f"instance {rank} gives up")
    time.sleep(600)


def sleep(seconds):
    print(f"pid {os.getpid()}", flush=True)
    time.sleep(seconds)


def stuck_collective():
    import torch.distributed as dist

    import popdist
    popdist.init()
    if popdist.getInstanceIndex() == 1:
        time.sleep(600)
    from openpop.runtime.distributed_reduce import GlobalReplication
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter.grad = torch.ones(3)
    GlobalReplication(dist.get_world_size(), dist.get_rank(), mean=True).all_reduce([parameter])


def killed_in_allreduce(outdir):
    import subprocess
    import threading

    import popdist
    import popdist.poptorch
    import poptorch
    from openpop.runtime.distributed_reduce import GlobalReplication
    popdist.init()
    rank = popdist.getInstanceIndex()
    # A process of the instance's own, as a data-loader worker would be.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.path.join(outdir, f"child-{rank}"), "w") as stream:
        stream.write(str(child.pid))
    print(f"pid {os.getpid()}", flush=True)
    real = GlobalReplication.all_reduce

    def all_reduce(self, params):
        if self.steps == 1:  # the second step's gradients
            with open(os.path.join(outdir, f"in-all-reduce-{rank}"), "w") as stream:
                stream.write(str(os.getpid()))
            if rank == 1:
                threading.Event().wait()  # inside the all-reduce until killed
        return real(self, params)

    GlobalReplication.all_reduce = all_reduce
    torch.manual_seed(0)
    model = Net()
    options = popdist.poptorch.Options()
    options.showCompilationProgressBar(False)
    training = poptorch.trainingModel(model, options, poptorch.optim.SGD(model.parameters(), lr=0.1))
    for _step in range(3):
        training(torch.randn(2, 8), torch.tensor([0, 1]))
    print(f"instance {rank} done: instance 1 was not killed", flush=True)


def bert_stalled_checkpoint(step, outdir, bert_args):
    import io
    import threading

    from openpop.bert import checkpoint, train
    real = checkpoint.atomic_write

    def atomic_write(path, write):
        if os.path.basename(path) != f"step_{step}.pt":
            return real(path, write)
        whole = io.BytesIO()
        write(whole)  # what an uninterrupted run writes
        with open(os.path.join(outdir, "uninterrupted.pt"), "wb") as stream:
            stream.write(whole.getvalue())

        def half_then_stay(stream):
            data = whole.getvalue()
            stream.write(data[:len(data) // 2])
            stream.flush()
            with open(os.path.join(outdir, "writing"), "w") as marker:
                marker.write(str(os.getpid()))
            threading.Event().wait()  # inside the write until killed

        return real(path, half_then_stay)

    checkpoint.atomic_write = atomic_write
    sys.exit(train.main(bert_args))


def mismatch():
    import popdist
    import popdist.poptorch
    import poptorch
    popdist.init()
    rank = popdist.getInstanceIndex()
    class Wider(torch.nn.Sequential):
        def forward(self, x):
            return poptorch.identity_loss(super().forward(x).sum(), reduction="sum")

    model = Wider(torch.nn.Linear(4, 3 + rank), torch.nn.Linear(3 + rank, 1))
    training = poptorch.trainingModel(model, popdist.poptorch.Options(),
                                      poptorch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        training(torch.ones(2, 4))
    finally:
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "weights changed"
        print(f"instance {rank}: weights unchanged", flush=True)


def replicas(how):
    """A script whose replication factor may not add up to poprun's --num-replicas."""
    import popdist
    import popdist.poptorch
    import poptorch
    rank = popdist.getInstanceIndex()

    class Summed(torch.nn.Linear):
        def forward(self, x):
            return poptorch.identity_loss(super().forward(x).sum(), reduction="sum")

    if how == "popdist":
        options = popdist.poptorch.Options()
        try:
            options.replicationFactor(1)
        except RuntimeError as error:
            print(f"instance {rank}: {error}", flush=True)
    else:
        options = poptorch.Options().replicationFactor(int(how))
    model = Summed(4, 1)
    training = poptorch.trainingModel(model, options, poptorch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        training(torch.ones(2 * options.replication_factor, 4))
    finally:
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        print(f"instance {rank}: {options.replication_factor} replicas, weights "
              f"{'unchanged' if unchanged else 'trained'}", flush=True)


def half_loss_overflow(outdir):
    """A float16 model whose loss overflows in instance 1 only (its gradients stay finite): every
    instance must run the call again saturating, or the instances' collectives part ways."""
    import popdist
    import popdist.poptorch
    import poptorch
    rank = popdist.getInstanceIndex()

    class Summed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))

        def forward(self, x):
            return poptorch.identity_loss((self.w * x).sum(), reduction="sum")

    model = Summed()
    options = popdist.poptorch.Options().deviceIterations(2)
    training = poptorch.trainingModel(model, options, poptorch.optim.SGD(model.parameters(), lr=2.0 ** -20))
    x = torch.full((2, 4), 30000.0 if rank == 1 else 1.0, dtype=torch.float16)  # 4 x 30000 > 65504
    losses = training(x)
    torch.save({"weights": model.w.detach().clone(), "losses": losses.detach().clone(),
                "saturating": training._precision.overflow_seen}, os.path.join(outdir, f"rank{rank}.pt"))


LIGHTNING_SAMPLES, LIGHTNING_BATCH, LIGHTNING_STEPS = 32, 4, 3


def lightning_data():
    generator = torch.Generator().manual_seed(5)
    return torch.randn(LIGHTNING_SAMPLES, 8, generator=generator), torch.randint(0, 4, (LIGHTNING_SAMPLES,),
                                                                                generator=generator)


def lightning_module():
    import lightning.pytorch as pl

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.fc(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier()


def lightning(outdir):
    import lightning.pytorch as pl
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # different initial weights: instance 0's must win
    model = lightning_module()
    x, y = lightning_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=LIGHTNING_BATCH)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(outdir, "checkpoints"), every_n_train_steps=1,
                                               save_top_k=-1)
    trainer = pl.Trainer(accelerator="ipu", devices=1, max_steps=LIGHTNING_STEPS, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoints])
    trainer.fit(model, loader)
    torch.save({"world_size": trainer.world_size, "global_rank": trainer.global_rank,
                "is_global_zero": trainer.is_global_zero, "num_devices": trainer.num_devices,
                "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "logged_loss": float(trainer.callback_metrics["loss"])},
               os.path.join(outdir, f"rank{rank}.pt"))


def lightning_manual_module():
    """``lightning_module`` trained by manual optimization (momentum: the instances' optimizer
    states must start alike too)."""
    import lightning.pytorch as pl

    class ManualClassifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.fc(x), y)
            self.manual_backward(loss)
            optimizer.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return ManualClassifier()


def lightning_manual(outdir, devices):
    import lightning.pytorch as pl
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # different initial weights: instance 0's must win
    model = lightning_manual_module()
    x, y = lightning_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=LIGHTNING_BATCH)
    trainer = pl.Trainer(accelerator="ipu", devices=devices, max_steps=LIGHTNING_STEPS, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, loader)
    torch.save({"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}},
               os.path.join(outdir, f"rank{rank}.pt"))


if __name__ == "__main__":
    command, arguments = sys.argv[1], sys.argv[2:]
    if command == "train":
        train(arguments[0], arguments[1:])
    elif command == "fail-after":
        fail_after(float(arguments[0]), int(arguments[1]))
    elif command == "sleep":
        sleep(float(arguments[0]))
    elif command == "stuck-collective":
        stuck_collective()
    elif command == "killed-in-allreduce":
        killed_in_allreduce(arguments[0])
    elif command == "bert-stalled-checkpoint":
        bert_stalled_checkpoint(int(arguments[0]), arguments[1], arguments[2:])
    elif command == "mismatch":
        mismatch()
    elif command == "lightning":
        lightning(arguments[0])
    elif command == "half-loss-overflow":
        half_loss_overflow(arguments[0])
    elif command == "lightning-manual":
        lightning_manual(arguments[0], int(arguments[1]))
    elif command == "replicas":
        replicas(arguments[0])
    else:
        raise SystemExit(f"unknown command {command}")
