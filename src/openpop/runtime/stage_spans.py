"""Forward/backward spans per pipeline stage and micro-batch, and the stage running now.

Forward hooks on each planned block's top modules open ``openpop:ipu<I>:stage<S>:forward:mb<M>:step<D>``
when the block is entered; a stage's backward span opens when the gradient of its output
arrives and closes when the next stage's backward opens or the micro-batch's backward ends.
The state is per thread, so micro-batches running concurrently on several devices (one worker
thread each) get their own spans; micro-batches are numbered in the order their forwards start.
"""
import contextlib
import functools
import itertools
import threading

import torch

SPAN_PREFIX = "openpop:"


class StageSpans:
    """Hooks on the plan's blocks while entered; ``current_ipu()`` is the virtual IPU of the
    stage this thread runs (forward, else backward, else the last one it ran)."""

    def __init__(self, model, plan, micro_batches_per_step):
        self.model = model
        self.plan = plan
        self.per_step = max(micro_batches_per_step, 1)
        self._numbers = itertools.count()
        self._local = threading.local()
        self._all_open = []      # every thread's open spans, closed on exit
        self._lock = threading.Lock()
        self.handles = []

    def _state(self):
        local = self._local
        if not hasattr(local, "forward"):
            local.forward = local.backward = None   # (stage, ipu, record_function)
            local.micro_batch = -1
            local.last_ipu = 0
        return local

    def current_ipu(self) -> int:
        state = self._state()
        for current in (state.forward, state.backward):
            if current is not None:
                return current[1]
        return state.last_ipu

    def __enter__(self):
        from .plan import top_modules
        modules = dict(self.model.named_modules())
        self.handles.append(self.model.register_forward_pre_hook(self._root_entered))
        self.handles.append(self.model.register_forward_hook(self._root_exited))
        for block in self.plan.blocks:
            stage = stage_of_block(self.plan, block)
            for name in top_modules(block.modules):
                module = modules.get(name)
                if module is None or module is self.model:
                    continue
                self.handles.append(module.register_forward_pre_hook(
                    functools.partial(self._block_entered, stage, block.ipu)))
                self.handles.append(module.register_forward_hook(
                    functools.partial(self._block_exited, stage, block.ipu)))
        return self

    def __exit__(self, *exc):
        with self._lock:
            left_open, self._all_open = self._all_open, []
        for function in left_open:
            function.__exit__(None, None, None)
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _name(self, stage, ipu, kind, micro_batch):
        step, mb = divmod(micro_batch, self.per_step)
        return f"{SPAN_PREFIX}ipu{ipu}:stage{stage}:{kind}:mb{mb}:step{step}"

    def _open(self, kind, stage, ipu, micro_batch):
        state = self._state()
        current = getattr(state, kind)
        if current is not None and current[0] == stage:
            return
        self._close(kind)
        function = torch.profiler.record_function(self._name(stage, ipu, kind, micro_batch))
        function.__enter__()
        with self._lock:
            self._all_open.append(function)
        setattr(state, kind, (stage, ipu, function))
        state.last_ipu = ipu

    def _close(self, kind):
        state = self._state()
        current = getattr(state, kind)
        if current is None:
            return
        setattr(state, kind, None)
        with self._lock:
            try:
                self._all_open.remove(current[2])
            except ValueError:  # already closed by __exit__
                return
        current[2].__exit__(None, None, None)

    def restart(self) -> None:
        """The host call runs again from its first micro-batch (a float16 overflow's rerun)."""
        self._numbers = itertools.count()

    def _root_entered(self, module, inputs):
        self._state().micro_batch = next(self._numbers)

    def _root_exited(self, module, inputs, output):
        self._close("forward")

    def _block_entered(self, stage, ipu, module, inputs):
        self._open("forward", stage, ipu, self._state().micro_batch)

    def _block_exited(self, stage, ipu, module, inputs, output):
        if not torch.is_grad_enabled():
            return
        micro_batch = self._state().micro_batch
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        for tensor in outputs:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(functools.partial(self._gradient_arrived, stage, ipu, micro_batch))
                break

    def _gradient_arrived(self, stage, ipu, micro_batch, grad):
        self._open("backward", stage, ipu, micro_batch)

    @contextlib.contextmanager
    def backward_span(self):
        with torch.profiler.record_function(SPAN_PREFIX + "backward"):
            try:
                yield
            finally:
                self._close("backward")


def stage_of_block(plan, block) -> int:
    """Pipeline stage = position of the block's IPU run in block order (as the plan counts)."""
    stage, previous = 0, None
    for b in plan.blocks:
        if previous is not None and b.ipu != previous:
            stage += 1
        previous = b.ipu
        if b is block:
            return stage
    return stage


def parse_stage_span(name: str):
    """``openpop:ipu1:stage1:forward:mb0:step0`` -> dict, or None for other names."""
    if not name.startswith(SPAN_PREFIX + "ipu"):
        return None
    parts = name[len(SPAN_PREFIX):].split(":")
    if len(parts) != 5:
        return None
    try:
        return {"ipu": int(parts[0][3:]), "stage": int(parts[1][5:]), "kind": parts[2],
                "micro_batch": int(parts[3][2:]), "step": int(parts[4][4:])}
    except ValueError:
        return None


IPU_TID_BASE = 1_000_000
LANE_TID_STRIDE = 1_000


def tracks_per_ipu(trace: dict, plan) -> dict:
    """Move stage spans to one track per virtual IPU, named by metadata events. Spans that
    overlap on one IPU (concurrent micro-batches, one waiting for the device) go to extra
    tracks ``virtual IPU <i> (<device>) overlap <k>``: a track's spans never cross."""
    events = trace.get("traceEvents", [])
    pid = None
    stage_events = []
    for event in events:
        info = parse_stage_span(event.get("name", "")) if event.get("ph") == "X" else None
        if info is None:
            continue
        pid = event.get("pid", pid)
        info["thread"] = event.get("tid")
        event["name"] = f"stage{info['stage']} {info['kind']} mb{info['micro_batch']}"
        event["cat"] = "openpop_stage"
        event.setdefault("args", {}).update(info)
        stage_events.append(event)
    lane_ends = {}  # ipu -> end time of each lane's last span
    for event in sorted(stage_events, key=lambda e: float(e["ts"])):
        ends = lane_ends.setdefault(event["args"]["ipu"], [])
        start = float(event["ts"])
        lane = next((i for i, end in enumerate(ends) if end <= start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = start + float(event.get("dur", 0))
        event["tid"] = IPU_TID_BASE + event["args"]["ipu"] + LANE_TID_STRIDE * lane
    device_map = getattr(plan, "device_map", None)
    for ipu, ends in sorted(lane_ends.items()):
        device = device_map.device(ipu) if device_map is not None else "?"
        for lane in range(len(ends)):
            tid = IPU_TID_BASE + ipu + LANE_TID_STRIDE * lane
            name = f"virtual IPU {ipu} ({device})" + (f" overlap {lane}" if lane else "")
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": ipu * 100 + lane}})
    trace["traceEvents"] = events
    return trace
