"""``memory_per_ipu``: what each virtual IPU holds - parameters, buffers, optimizer state - counted from
the tensors themselves, beside the measured activation and device peaks (the profile report's table)."""
import torch


def memory_per_ipu(model, plan, optimizer, activation_peaks=None, device_peaks=None) -> list:
    """Bytes of the parameters, buffers and optimizer state held for each virtual IPU, counted
    from the tensors themselves (a module's tensors belong to the IPU of the block it ran in),
    the measured peak activation bytes (``activation_memory``; None when not measured) and, on
    CUDA, the peak bytes allocated on the IPU's device during the recorded calls (``memory_stats``:
    everything on that device, shared by the IPUs mapped to it)."""
    ipu_of_module = {}
    for block in plan.blocks if plan is not None else ():
        for name in block.modules:
            ipu_of_module.setdefault(name, block.ipu)

    def ipu_of(qualified):
        name = qualified.rpartition(".")[0]
        while name and name not in ipu_of_module:
            name = name.rpartition(".")[0]
        return ipu_of_module.get(name, 0)

    ipus = plan.ipus_per_replica if plan is not None else 1
    peaks, device_peaks = activation_peaks or {}, device_peaks or {}
    table = [{"ipu": i, "parameter_bytes": 0, "buffer_bytes": 0, "optimizer_state_bytes": 0,
              "activation_peak_bytes": peaks.get(i), "device_peak_bytes": device_peaks.get(i)} for i in range(ipus)]
    states = optimizer.state if optimizer is not None else {}
    seen = set()
    for kind, items in (("parameter_bytes", model.named_parameters()), ("buffer_bytes", model.named_buffers())):
        for name, tensor in items:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            entry = table[min(ipu_of(name), ipus - 1)]
            entry[kind] += tensor.numel() * tensor.element_size()
            for value in states.get(tensor, {}).values() if kind == "parameter_bytes" else ():
                if isinstance(value, torch.Tensor):
                    entry["optimizer_state_bytes"] += value.numel() * value.element_size()
    return table
