"""Global replication: the replicas of every process form one data-parallel group.

With ``Options.Distributed.numProcesses > 1`` (``popdist.poptorch.Options`` under ``poprun``, or
``OMPI_COMM_WORLD_*`` / ``configureProcessId``) each process runs its local replicas and, once
per optimizer step, its gradients are all-reduced with the other processes' through
torch.distributed (the group ``popdist.init()`` / ``openpop.distributed.process_group`` joins):

* **where**: first thing in ``GradientReduction.finish_step`` (its ``ReplicaSum``), after
  local replicas on their own devices are summed, before the gradients are unscaled. The all-reduce
  works on loss-scaled gradients, so every process unscales, checks for inf/NaN and updates the
  automatic loss scale from the *same* reduced values: all processes skip the same steps and
  keep the same scale.
* **what**: ``Mean`` averages the processes' local means (each process has ``GA x R_local``
  micro-batches, so this is the mean over all ``GA x R_total``), ``Sum`` sums; a parameter whose
  gradient is ``None`` in every process stays ``None`` (one present anywhere counts as zero
  elsewhere). The optimizer then steps in every process on identical gradients and weights:
  the same weights as one process running all replicas, up to float summation order.
* **how**: gradients are flattened into buckets of at most ``OPENPOP_ALLREDUCE_BUCKET_MB``
  (25, as DDP's default) per device and dtype, each reduced by an asynchronous ``all_reduce``.
  When the step's micro-batches run one after another in the calling thread (``start_step``
  with ``overlap``), the buckets are reduced *during* the last micro-batch's backward, as DDP
  does: a post-accumulate-grad hook counts each parameter's gradient accumulations, and once
  every parameter of a bucket has received its last one the bucket's all-reduce starts while
  autograd goes on with earlier layers. Buckets start in a fixed order (bucket ``i`` after
  ``0..i-1``), so every process issues the same collectives in the same order; a bucket whose
  parameters did not all take part in the last micro-batch starts in ``all_reduce`` instead.
  ``OPENPOP_ALLREDUCE_OVERLAP=0`` turns the overlap off.
* **first run** (``join``): every process checks that all have the same parameters and buffers
  (names, shapes, dtypes), then instance 0's weights, buffers and optimizer state are broadcast,
  so every process starts from instance 0's model.

A collective that does not complete within the process group's timeout
(``OPENPOP_COLLECTIVE_TIMEOUT``, poprun ``--collective-timeout``) raises ``CollectiveTimeout``
naming the collective, the step and the instance; so does one that loses another instance on
the way (gloo's "Connection closed by peer": that instance was killed or crashed), saying so.
"""
import os
import weakref
from typing import Optional

import torch

from .. import errors, openpop_settings
from ..distributed import messages as distributed_messages
from ..enums import ReductionType
from . import messages, trace

BUCKET_MB_ENV = openpop_settings.env("allreduce_bucket_mb")
OVERLAP_ENV = openpop_settings.env("allreduce_overlap")


class CollectiveTimeout(RuntimeError):
    """A collective across processes failed or did not complete in time."""


# gloo's words when the other end of a connection went away (the process died).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _bucket_bytes() -> int:
    return int(openpop_settings.read("allreduce_bucket_mb") * 1024 * 1024)


def buckets_of(tensors: list[torch.Tensor], cap_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped by device and dtype, last tensor first (the last layers'
    gradients are ready first, as in DDP), each group cut into buckets of at most ``cap_bytes``
    (a larger tensor gets a bucket of its own)."""
    groups = {}
    for index in reversed(range(len(tensors))):
        tensor = tensors[index]
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    buckets = []
    for indices in groups.values():
        current, size = [], 0
        for index in indices:
            nbytes = tensors[index].numel() * tensors[index].element_size()
            if current and size + nbytes > cap_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(index)
            size += nbytes
        if current:
            buckets.append(current)
    return buckets


def check_job_replicas(options) -> None:
    """Under poprun, a model whose options join the job (``Distributed.numProcesses`` = the
    instances, as ``popdist.poptorch.Options`` and a plain ``Options`` reading poprun's
    ``OMPI_COMM_WORLD_*`` have) must run poprun's replicas: ``replicationFactor`` x instances =
    ``--num-replicas``. In PopTorch the replication factor of ``popdist.poptorch.Options`` comes
    from poprun and cannot be changed, and a model that does not fit the instance's IPUs fails
    to acquire them; here a script whose replicas do not add up fails before its first call
    instead of training a different number of replicas. A process that left the job
    (``Distributed.disable()``) is not checked."""
    from ..distributed import instance
    local, total = os.environ.get(instance.LOCAL_REPLICAS), os.environ.get(instance.TOTAL_REPLICAS)
    if not local or not total or os.environ.get(instance.UNIFORM_REPLICAS, "1") != "1":
        return
    local, total = int(local), int(total)
    instances = max(total // max(local, 1), 1)
    processes = options.Distributed.numProcesses
    if processes != instances or options.replication_factor == local:
        return
    raise errors.createPoptorchError(distributed_messages.REPLICAS_DO_NOT_ADD_UP.format(
        total=total, instances=instances, local=local, replicas=options.replication_factor, processes=processes,
        asked=options.replication_factor * processes))


class SingleProcess:
    """This process trains alone (``GlobalReplication``'s interface, doing nothing)."""

    num_processes = 1
    overlapped_buckets = 0

    def join(self, model: torch.nn.Module, optimizer) -> None:
        pass

    def start_step(self, params, micro_batches: int, overlap: bool) -> None:
        pass

    def all_reduce(self, params) -> None:
        pass

    def all_true(self, flag: bool) -> bool:
        return flag


class GlobalReplication:
    """The processes' side of one training model's data-parallel group."""

    def __init__(self, num_processes: int, process_id: int, mean: bool):
        self.num_processes = num_processes
        self.process_id = process_id
        self.mean = mean
        self.steps = 0
        self.overlap_enabled = openpop_settings.read("allreduce_overlap")
        self._params = None
        self._buckets = None
        self._bucket_key = None
        self._bucket_of = []      # parameter index -> bucket index
        self._hooks = []
        self._armed = False       # counting accumulations for this step's overlap
        self._counts = []
        self._waiting = []        # per bucket: parameters still to receive their last gradient
        self._target = 0          # gradient accumulations per parameter in a step
        self._launched = []       # (flat, work) per bucket started so far, in bucket order
        self._flats = []          # per bucket: its flat buffer, kept from step to step (_launch)
        self.overlapped_buckets = 0  # buckets started during a backward (for tests and benchmarks)

    @classmethod
    def from_options(cls, options):
        """``SingleProcess`` for one process; else checks that this process is in a matching group."""
        num_processes = options.Distributed.numProcesses
        if num_processes <= 1:
            return SingleProcess()
        from ..distributed import process_group
        process_id = options.Distributed.processId
        if not process_group.initialize():
            raise errors.createPoptorchError(messages.NOT_LAUNCHED.format(n=num_processes))
        import torch.distributed as dist
        if dist.get_world_size() != num_processes or dist.get_rank() != process_id:
            raise errors.createPoptorchError(messages.RANK_MISMATCH.format(
                process_id=process_id, n=num_processes, rank=dist.get_rank(), world_size=dist.get_world_size()))
        mean = options.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
        return cls(num_processes, process_id, mean)

    # ------------------------------------------------------------------ first run
    def join(self, model: torch.nn.Module, optimizer) -> None:
        """Check every process has the same model, then take instance 0's weights, buffers and
        optimizer state."""
        import torch.distributed as dist
        layout = [(kind, name, tuple(t.shape), str(t.dtype)) for kind, name, t in _named_state(model)]
        gathered = [None] * self.num_processes
        self._collective("the check that every instance has the same model",
                         lambda: dist.all_gather_object(gathered, layout))
        for process, other in enumerate(gathered):
            difference = _first_difference(gathered[0], other)
            if difference is not None:  # every process sees it and raises: none waits in a collective
                raise errors.createPoptorchError(messages.MODELS_DIFFER.format(process=process, difference=difference))
        tensors = [t for _, _, t in _named_state(model)]
        with torch.no_grad():
            self._broadcast_tensors(tensors, "the broadcast of instance 0's weights")
        self.broadcast_optimizer(optimizer)

    def _broadcast_tensors(self, tensors, what: str) -> None:
        import torch.distributed as dist
        for bucket in buckets_of(tensors, _bucket_bytes()):
            members = [tensors[i] for i in bucket]
            flat = torch.cat([t.reshape(-1) for t in members])
            self._collective(what, lambda flat=flat: dist.broadcast(flat, src=0))
            _copy_back(flat, members)

    def broadcast_optimizer(self, optimizer) -> None:
        """Instance 0's optimizer state (and loss scale) in every process."""
        import torch.distributed as dist
        if optimizer is None:
            return
        payload = [optimizer.state_dict() if self.process_id == 0 else None,
                   getattr(optimizer, "loss_scaling", None)]
        has_state = [bool(optimizer.state)]
        everyone = [None] * self.num_processes
        self._collective("the check of the optimizers' state", lambda: dist.all_gather_object(everyone, has_state))
        if not any(flag[0] for flag in everyone):
            return
        self._collective("the broadcast of instance 0's optimizer state",
                         lambda: dist.broadcast_object_list(payload, src=0))
        if self.process_id != 0:
            optimizer.load_state_dict(payload[0])
            if payload[1] is not None:
                optimizer.loss_scaling = payload[1]

    # ------------------------------------------------------------------ every step
    def _layout(self, params) -> None:
        key = tuple(id(p) for p in params)
        if key == self._bucket_key:
            return
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._params = list(params)
        self._buckets = buckets_of(self._params, _bucket_bytes())
        self._bucket_key = key
        self._flats = [None] * len(self._buckets)
        self._bucket_of = [0] * len(self._params)
        for b, bucket in enumerate(self._buckets):
            for i in bucket:
                self._bucket_of[i] = b

    def start_step(self, params: list[torch.nn.Parameter], micro_batches: int, overlap: bool) -> None:
        """Before a step's micro-batches. ``overlap``: they run one after another in this thread,
        each back-propagating once into every parameter it uses."""
        self._layout(params)
        self._launched = []
        self._armed = overlap and self.overlap_enabled
        if not self._armed:
            return
        if not self._hooks:
            owner = weakref.ref(self)  # the parameters' hooks must not keep this object alive
            self._hooks = [p.register_post_accumulate_grad_hook(_accumulation_hook(owner, index))
                           for index, p in enumerate(self._params) if p.requires_grad]
        self._target = micro_batches
        self._counts = [0] * len(self._params)
        self._waiting = [len(bucket) for bucket in self._buckets]

    def _accumulated(self, index: int) -> None:
        """A gradient accumulation into parameter ``index`` (post-accumulate-grad hook)."""
        if not self._armed:
            return
        self._counts[index] += 1
        if self._counts[index] != self._target:
            return
        self._waiting[self._bucket_of[index]] -= 1
        while len(self._launched) < len(self._buckets) and self._waiting[len(self._launched)] == 0:
            self._launch(len(self._launched))
            self.overlapped_buckets += 1

    def _launch(self, b: int) -> None:
        import torch.distributed as dist

        from ..distributed import process_group
        members = [self._params[i] for i in self._buckets[b]]
        pieces = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1) for p in members]
        # The bucket's buffer is kept: a fresh one each step (tens of MB) is a fresh mapping from
        # the allocator, page-faulted again - 16.8 MB of gradients took 25 ms to flatten, reduce and
        # copy back between 2 processes on gloo instead of 20 (benchmarks/scaleout.py). The copies
        # below leave no gradient aliasing it, and every reduction of it is waited for within the step.
        flat = self._flats[b]
        if flat is None or flat.dtype != pieces[0].dtype or flat.device != pieces[0].device:
            flat = self._flats[b] = torch.empty(sum(t.numel() for t in pieces), dtype=pieces[0].dtype,
                                                device=pieces[0].device)
        torch.cat(pieces, out=flat)
        if self.mean:
            flat.div_(self.num_processes)
        work = self._collective(f"the all-reduce of step {self.steps + 1}'s gradients",
                                lambda: dist.all_reduce(flat, group=process_group.current_group(), async_op=True))
        self._launched.append((flat, work))

    @trace.spanned("all_reduce")
    def all_reduce(self, params: list[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its all-reduce over the processes (finishing the
        buckets ``start_step`` let the backward start)."""
        import torch.distributed as dist

        from ..distributed import process_group
        self._layout(params)
        self._armed = False
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        while len(self._launched) < len(self._buckets):
            self._launch(len(self._launched))
        self.steps += 1
        what = f"the all-reduce of step {self.steps}'s gradients"
        works = [work for _, work in self._launched]
        works.append(self._collective(what, lambda: dist.all_reduce(present, group=process_group.current_group(),
                                                                    async_op=True)))
        for work in works:
            self._collective(what, work.wait)
        flats = [flat for flat, _ in self._launched]
        self._launched = []
        for bucket, flat in zip(self._buckets, flats):
            offset = 0
            for i in bucket:
                p = params[i]
                n = p.numel()
                if int(present[i]) == 0:
                    p.grad = None
                elif p.grad is None:
                    p.grad = flat[offset:offset + n].view_as(p).clone()
                else:
                    p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds in every process (each calls this at the same point)."""
        import torch.distributed as dist

        from ..distributed import process_group
        value = torch.tensor([int(flag)], dtype=torch.int32)
        self._collective("the check that the step's values are finite", lambda: dist.all_reduce(
            value, op=dist.ReduceOp.MIN, group=process_group.current_group()))
        return bool(value.item())

    def _collective(self, what: str, call):
        from ..distributed import process_group
        try:
            return call()
        except RuntimeError as exc:  # gloo/NCCL timeouts and closed connections
            text = messages.COLLECTIVE_PEER_GONE if any(words in str(exc) for words in _PEER_GONE) \
                else messages.COLLECTIVE_FAILED
            raise CollectiveTimeout(text.format(
                what=what, n=self.num_processes, process_id=self.process_id,
                timeout=process_group.collective_timeout(), error=exc)) from exc


def _accumulation_hook(owner: "weakref.ref", index: int):
    def hook(_parameter):
        replication = owner()
        if replication is not None:
            replication._accumulated(index)
    return hook


def _named_state(model):
    for name, param in model.named_parameters():
        yield "parameter", name, param
    for name, buffer in model.named_buffers():
        yield "buffer", name, buffer


def _first_difference(reference, other) -> Optional[str]:
    ours = {(kind, name): (shape, dtype) for kind, name, shape, dtype in reference}
    theirs = {(kind, name): (shape, dtype) for kind, name, shape, dtype in other}
    for key in ours:
        if key not in theirs:
            return f"{key[0]} {key[1]} is missing"
        if ours[key] != theirs[key]:
            (s0, d0), (s1, d1) = ours[key], theirs[key]
            return f"{key[0]} {key[1]} is {list(s1)} {d1} instead of {list(s0)} {d0}"
    for key in theirs:
        if key not in ours:
            return f"it has an extra {key[0]} {key[1]}"
    return None


def _copy_back(flat: torch.Tensor, tensors) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
