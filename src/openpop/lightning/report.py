"""``IPUStrategy(autoreport=True)``: a profile report per stage, written as JSON.

PopTorch wrote PopVision reports (``<autoreport_dir>/training/profile.pop``). openpop writes
``<autoreport_dir>/<stage>/profile.json`` (stage: ``training``, ``validation``, ``test``,
``predict``; ``autoreport_dir`` defaults to the Trainer's ``default_root_dir``) when the stage
ends. Format ``openpop-profile-1``::

    {
      "format": "openpop-profile-1",
      "stage": "training",
      "geometry": {"device_iterations": 8, "gradient_accumulation": 2, "replication_factor": 4,
                   "micro_batches_per_call": 64},
      "execution": {"strategy": "ShardedExecution", "pipeline_stages": 4, "ipus_per_replica": 4,
                    "blocks": [{"name": "layer1", "stage": 0, "ipu": 0, "modules": ["layer1"]}, ...]},
      "compile_seconds": 0.01,
      "host_calls": [{"index": 0, "seconds": 0.02, "step_seconds": [0.0025, ...]}, ...],
      "stages": [{"stage": 0, "ipu": 0, "forward_seconds": 0.004, "forward_calls": 64}, ...],
      "memory": [{"virtual_ipu": 0, "replica": 0, "ipu": 0, "parameter_bytes": 240,
                  "buffer_bytes": 0, "optimizer_state_bytes": 480}, ...],
      "totals": {"host_calls": 10, "seconds": 0.2, "samples": 5120, "samples_per_second": 25600.0}
    }

``step_seconds`` are the device iterations of one host call (optimizer steps when training);
``stages`` are forward times per pipeline stage summed over the run (each forward pass is cut
where blocks start) and how many micro-batches ran through the stage; ``memory`` is per virtual
IPU (replica x IPU of the plan): the bytes of the parameters, buffers and optimizer state placed
on it. Everything is plain data so a fuller PopVision-like report can add sections without
changing these.
"""
import json
import os
import time
from typing import Optional

import torch

from ..runtime.plan import top_modules

FORMAT = "openpop-profile-1"
WRAPPER_PREFIX = "module."  # the LightningModule inside steps.StepModule


class StageProfile:
    """Measurements of one stage (training, validation, ...) of a Trainer run."""

    def __init__(self, stage: str, directory: str):
        self.stage = stage
        self.directory = directory
        self.host_calls: list[dict] = []
        self.samples = 0
        self._stage_seconds: dict[int, float] = {}
        self._stage_calls: dict[int, int] = {}
        self._handles = []
        self._hooked = None

    # ------------------------------------------------------------------ recording
    def hook_blocks(self, executor, model: torch.nn.Module) -> None:
        """Time each pipeline stage's forward, from the executor's plan (once compiled).

        A forward pass is cut at the points where blocks start (a forward pre-hook on each
        block's first module); each piece is charged to its block's stage."""
        plan = _plan(executor)
        if plan is None or self._hooked is plan:
            return
        self.unhook()
        self._hooked = plan
        names = dict(model.named_modules())
        first_stage = plan.blocks[0].stage if plan.blocks else 0
        self._handles.append(model.register_forward_pre_hook(lambda m, i: self._event(first_stage, begin=True)))
        self._handles.append(model.register_forward_hook(lambda m, i, o: self._event(None)))
        for block in plan.blocks:
            target = names.get(block.modules[0]) if block.modules else None
            if target is not None and target is not model:
                self._handles.append(target.register_forward_pre_hook(
                    lambda m, i, stage=block.stage: self._event(stage)))

    def _event(self, stage, begin: bool = False) -> None:
        now = time.perf_counter()
        if begin:
            self._open = (stage, now)
            self._charged = set()
            return
        if getattr(self, "_open", None) is None:
            return
        current, started = self._open
        self._stage_seconds[current] = self._stage_seconds.get(current, 0.0) + now - started
        if current not in self._charged:
            self._charged.add(current)
            self._stage_calls[current] = self._stage_calls.get(current, 0) + 1
        self._open = (stage, now) if stage is not None else None

    def unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._hooked = None

    def record_call(self, executor, seconds: float, samples: int) -> None:
        perf = executor.getPerfCounters() if executor is not None else None
        steps = []
        if perf and perf.get("input") and perf["input"][0]:
            steps = [end - start for start, end in zip(perf["input"][0], perf["output"][0])]
        self.host_calls.append({"index": len(self.host_calls), "seconds": seconds, "step_seconds": steps})
        self.samples += samples

    # ------------------------------------------------------------------ writing
    def write(self, executor, model: torch.nn.Module, optimizer=None) -> Optional[str]:
        self.unhook()
        if not self.host_calls:
            return None
        options = executor.options if executor is not None else None
        plan = _plan(executor)
        report = {
            "format": FORMAT,
            "stage": self.stage,
            "geometry": _geometry(options),
            "execution": _execution(options, plan),
            "compile_seconds": executor.compileSeconds(),
            "host_calls": self.host_calls,
            "stages": [{"stage": s, "ipu": _ipu_of_stage(plan, s), "forward_seconds": self._stage_seconds[s],
                        "forward_calls": self._stage_calls.get(s, 0)} for s in sorted(self._stage_seconds)],
            "memory": _memory(model, plan, options, optimizer),
            "totals": _totals(self.host_calls, self.samples),
        }
        folder = os.path.join(self.directory, self.stage)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "profile.json")
        with open(path, "w") as stream:
            json.dump(report, stream, indent=1, default=str)
        return path


def _plan(executor):
    return executor.executionPlan()


def _geometry(options) -> dict:
    if options is None:
        return {}
    accumulation = options.Training.gradient_accumulation
    return {"device_iterations": options.device_iterations, "gradient_accumulation": accumulation,
            "replication_factor": options.replication_factor,
            "micro_batches_per_call": options.device_iterations * accumulation * options.replication_factor}


def _execution(options, plan) -> dict:
    result = {"strategy": type(options._execution_strategy).__name__ if options is not None else None}
    if plan is not None:
        result.update(pipeline_stages=plan.pipeline_stages, ipus_per_replica=plan.ipus_per_replica,
                      blocks=[{"name": _user_name(b.name), "stage": b.stage, "ipu": b.ipu,
                               "modules": [_user_name(m) for m in top_modules(b.modules)]} for b in plan.blocks])
    return result


def _user_name(name: str) -> str:
    """Module names as the user wrote them (without the strategy's wrapper prefix)."""
    return ", ".join(part.strip()[len(WRAPPER_PREFIX):] if part.strip().startswith(WRAPPER_PREFIX) else part.strip()
                     for part in name.split(","))


def _ipu_of_stage(plan, stage: int) -> int:
    if plan is None:
        return 0
    return next((b.ipu for b in plan.blocks if b.stage == stage), 0)


def _memory(model: torch.nn.Module, plan, options, optimizer) -> list:
    """Bytes of parameters, buffers and optimizer state per virtual IPU."""
    ipu_of_module = {}
    if plan is not None:
        for block in plan.blocks:
            for name in block.modules:
                ipu_of_module.setdefault(name, block.ipu)

    def ipu_of(qualified: str) -> int:
        name = qualified.rsplit(".", 1)[0] if "." in qualified else ""
        while name and name not in ipu_of_module:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return ipu_of_module.get(name, 0)

    per_ipu: dict[int, dict] = {}
    seen = set()
    states = optimizer.state if optimizer is not None else {}
    for kind, items in (("parameter_bytes", model.named_parameters()), ("buffer_bytes", model.named_buffers())):
        for name, tensor in items:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            entry = per_ipu.setdefault(ipu_of(name), {"parameter_bytes": 0, "buffer_bytes": 0,
                                                       "optimizer_state_bytes": 0})
            entry[kind] += tensor.numel() * tensor.element_size()
            for value in states.get(tensor, {}).values() if kind == "parameter_bytes" else ():
                if isinstance(value, torch.Tensor):
                    entry["optimizer_state_bytes"] += value.numel() * value.element_size()
    replicas = options.replication_factor if options is not None else 1
    ipus = plan.ipus_per_replica if plan is not None else max(per_ipu, default=0) + 1
    empty = {"parameter_bytes": 0, "buffer_bytes": 0, "optimizer_state_bytes": 0}
    return [{"virtual_ipu": replica * ipus + ipu, "replica": replica, "ipu": ipu, **per_ipu.get(ipu, empty)}
            for replica in range(replicas) for ipu in range(ipus)]


def _totals(calls: list, samples: int) -> dict:
    seconds = sum(c["seconds"] for c in calls)
    return {"host_calls": len(calls), "seconds": seconds, "samples": samples,
            "samples_per_second": samples / seconds if seconds > 0 else None}
