"""Optimizer updates as pure functions of tensors, for the compiled backend.

Each ``FunctionalOptimizer`` reads an optimizer (``poptorch.optim``'s SGD / Adam / AdamW / LAMB /
RMSprop or torch's SGD / Adam / AdamW / RMSprop) and gives:

* ``hyper()``   the hyperparameters a user may change between host calls (``lr``,
  ``weight_decay``, ...), group after group, as one float32 tensor: a program input, so a new
  value never recompiles (one tensor, not one per value: each input costs the host call its
  guard and its argument handling); ``unpack`` (traced) makes it per group ``{name: value}``;
* ``state_in()`` per parameter, the state tensors the update reads (created as the eager
  optimizer would create them on its first step);
* ``update(params, grads, state, hyper)`` the new parameters and state: the update
  ``optimizer.step()`` runs (``optim/updates.py``, the one definition of each optimizer's
  maths), on pure tensors;
* ``commit(state)`` writes the new state back into ``optimizer.state`` in torch's format.

Static choices (optimizer family, Nesterov, momentum on/off, clipping kind, bias correction,
RMSprop's centered and TensorFlow variants, per-step hyperparameters) are part of
``optimizer_support.signature()``: a change of them builds a new program.

With step hooks attached (``step_hooks.py``) the hyperparameters are per step: ``hyper_steps``
stacks them over the host call's optimizer steps (one ``[values, steps]`` tensor, indexed by
the program's step counter), and the hooks' gradient clipping (by norm or by value) is part of the
update.

Precision follows ``optim/_base.py``: updates are computed in float32 from float32 copies of
float16/bfloat16 parameters, gradients and state, the new parameters rounded to the parameter's
dtype (stochastically with ``Precision.enableStochasticRounding``, from numbers the host drew);
state is stored in its ``*_accum_type`` (float16 rounded after each update, the update itself
using the unrounded value) or else float32. torch's own optimizers compute half parameters in
half: only their float32 parameters are supported.
"""
import itertools

import torch

from ...optim import updates
from ..precision import round_with_noise
from .optimizer_support import clipping, family_of, signature, updated_parameters

_VELOCITY_SCALE_KEY = "velocity_scaling"  # optim/sgd.py: momentum_buffer is stored times this


class FunctionalOptimizer:
    """See the module docstring."""

    def __init__(self, optimizer, unused=frozenset()):
        self.family = family_of(optimizer)
        self.unused = frozenset(unused)  # ids of parameters the trace gives no gradient (constants)
        self.bind(optimizer)
        self.static = signature(optimizer)
        names = [list(values) for values in self.hyper_values()]  # per group, in hyper()'s order
        self._unpacking = list(zip(itertools.accumulate((len(n) for n in names), initial=0), names))
        self.stateless = self.family == "sgd" and not any(group[1] for group in self.static[2])  # plain SGD

    def bind(self, optimizer) -> None:
        """Read hyperparameters and state from ``optimizer`` from now on (``setOptimizer``):
        the caller has checked ``signature(optimizer)`` is this one's."""
        self.optimizer = optimizer
        self._cache = {}
        self.groups = updated_parameters(optimizer, self.unused)  # (frozen and unused ones are constants)
        self.params = [p for params in self.groups for p in params]
        self._no_state = [{} for _ in self.params]  # plain SGD's (the program never changes its inputs)
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.combined = bool(getattr(optimizer, "use_combined_accum", False))
        first = getattr(optimizer, "first_order_momentum_accum_type", None)
        second = getattr(optimizer, "second_order_momentum_accum_type", None)
        if self.family == "sgd":
            velocity = optimizer.accum_type if self.combined else getattr(optimizer, "velocity_accum_type", None)
            self.accum_types = {"momentum_buffer": velocity}
        elif self.family == "rmsprop":  # its momentum buffer is always float32 (optim/rmsprop.py)
            self.accum_types = {"square_avg": first, "grad_avg": second}
        else:
            self.accum_types = {"exp_avg": first, "exp_avg_sq": second}

    def _stored(self, state):
        """``state`` with each accumulator in the dtype the optimizer stores it in
        (``optim._base.storage_dtype``: float16 when its accum type says so, else float32)."""
        return {key: value.to(torch.float16 if self.accum_types.get(key) == torch.float16 else torch.float32)
                if value.is_floating_point() and key != "step" else value for key, value in state.items()}

    def _velocity_scale(self, group):
        return float(group.get("velocity_scaling", 1.0)) if self.combined else 1.0

    # ------------------------------------------------------------------ inputs
    def loss_scale(self):
        """The optimizer's ``loss_scaling`` as a program input (a 0-d float32 tensor)."""
        value = float(getattr(self.optimizer, "loss_scaling", 1.0))
        return self._cached("loss_scale", value, lambda: self._tensor(value))

    def _cached(self, slot, key, make):
        """``make()``'s tensor, made again only when ``key`` changes (a host call costs
        microseconds: creating its input tensors on every call would show)."""
        cached = self._cache.get(slot)
        if cached is None or cached[0] != key:
            cached = self._cache[slot] = (key, make())
        return cached[1]

    def _tensor(self, values):
        """A float32 program input on the parameters' device (CUDA graphs take no CPU inputs)."""
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def hyper_values(self):
        """Per group ``{name: float}``: the hyperparameters the update reads now."""
        family = "adam" if self.family == "adamw" else self.family
        values = [updates.hyperparameters(family, group, velocity_scale=self._velocity_scale(group))
                  for group in self.optimizer.param_groups]
        if self.static[1] is not None:
            values[0]["clip"] = clipping(self.optimizer)[1]
        return values

    def hyper(self):
        """``hyper_values()`` as one float32 tensor (``unpack``)."""
        key = [float(x) for v in self.hyper_values() for x in v.values()]
        return self._cached("hyper", key, lambda: self._tensor(key))

    def unpack(self, packed):
        """(Traced) ``hyper()``'s tensor, or a ``[values]`` row or the ``[values, steps]`` tensor of
        ``hyper_steps()``, as per group ``{name: value}``."""
        return [{name: packed[start + k] for k, name in enumerate(names)} for start, names in self._unpacking]

    def hyper_steps(self, per_step):
        """``per_step`` (one ``hyper_values()`` per optimizer step; the same object for steps
        that share their values) as one ``[values, steps]`` tensor (``unpack``)."""
        distinct = list({id(values): values for values in per_step}.values())
        key = [[tuple(float(x) for x in v.values()) for v in values] for values in distinct]
        key.append([id(values) for values in per_step] if len(distinct) > 1 else len(per_step))
        return self._cached("hyper_steps", key, lambda: self._tensor(
            [[float(x) for v in values for x in v.values()] for values in per_step]).t().contiguous())

    def state_in(self, placeholders=False):
        """Per parameter a dict of state tensors (copies: the program's result replaces them).
        ``placeholders``: state the optimizer has not created yet is left uninitialised (a dry
        run, ``compile()``, which does not run the program: zeroing BERT-base's LAMB state costs
        ~1 s)."""
        if self.stateless:
            return self._no_state
        fill = _uninitialised if placeholders else torch.full_like
        state = []
        for group, static, params in zip(self.optimizer.param_groups, self.static[2], self.groups):
            for p in params:
                st = self.optimizer.state.get(p, {})
                if self.family == "lamb":
                    state.append(_lamb_state(st, p, fill))
                elif self.family == "rmsprop":
                    state.append(_rmsprop_state(st, p, static[1], static[6], static[7], fill))
                elif self.family == "sgd":
                    if not static[1]:  # momentum 0 (the signature, checked every call, says so)
                        state.append({})
                        continue
                    buf = st.get("momentum_buffer")
                    if buf is None:
                        state.append({"momentum_buffer": fill(p, 0.0, memory_format=torch.preserve_format),
                                      "has_buffer": self._flag(False, p)})
                        continue
                    previous = st.get(_VELOCITY_SCALE_KEY, 1.0)
                    scale = self._velocity_scale(group)
                    if previous != scale:  # velocity_scaling changed: keep the velocity itself
                        buf = buf.to(torch.float32) * (scale / previous)
                    state.append({"momentum_buffer": buf, "has_buffer": self._flag(True, p)})
                else:
                    step = st.get("step")
                    step = torch.zeros((), device=p.device) if step is None else \
                        torch.as_tensor(step, dtype=torch.float32).to(p.device)
                    state.append({"step": step.reshape(()),
                                  "exp_avg": _or_zeros(st.get("exp_avg"), p, fill),
                                  "exp_avg_sq": _or_zeros(st.get("exp_avg_sq"), p, fill)})
        return [self._stored(st) for st in state]

    def _flag(self, value, param):
        """A 0-d bool program input for ``param``, made once (programs never write their inputs;
        each parameter its own: ``while_loop`` refuses carried inputs that alias each other)."""
        key = ("flag", value, id(param))
        flag = self._cache.get(key)
        if flag is None:
            flag = self._cache[key] = torch.tensor(value, device=param.device)
        return flag

    # ------------------------------------------------------------------ the update (traced)
    def update(self, params, grads, state, hyper, noise=None):
        """New (params, state): pure, traced by torch.compile. Computed in float32 (module docstring);
        ``noise``: ``{index: uniform numbers}`` of the parameters rounded to their dtype
        stochastically (``precision.round_with_noise``), the others rounded to nearest."""
        dtypes = [p.dtype for p in params]
        params = [p.to(torch.float32) for p in params]
        grads = [g.to(torch.float32) for g in grads]
        if self.static[1] == "norm":  # torch.nn.utils.clip_grad_norm_
            coefficient = updates.clip_coefficient(updates.PURE, grads, hyper[0]["clip"])
            grads = updates.PURE.mul(grads, coefficient)
        elif self.static[1] == "value":  # torch.nn.utils.clip_grad_value_
            grads = [torch.clamp(g, min=-hyper[0]["clip"], max=hyper[0]["clip"]) for g in grads]
        new_params, new_state = [], []
        i = 0
        for group, h in zip(self.static[2], hyper):
            n = group[0]
            if n == 0:
                continue
            states = [{key: v.to(torch.float32) if v.is_floating_point() else v for key, v in st.items()}
                      for st in state[i:i + n]]
            group_params, group_state = self._update_group(group, params[i:i + n], grads[i:i + n], states, h)
            for k, p, st in zip(range(i, i + n), group_params, group_state):
                new_params.append(round_with_noise(p, dtypes[k], noise[k]) if noise and k in noise else p.to(dtypes[k]))
                new_state.append({key: st[key].to(value.dtype) for key, value in state[k].items()})
            i += n
        return new_params, new_state

    def _update_group(self, group, params, grads, states, h):
        """``optim/updates.py``'s update of one group, pure: (new params, per parameter its new state)."""
        _, momentum_on, nesterov, maximize, decoupled, bias_correction, centered, tf_variant = group
        o = updates.PURE

        def column(key):
            return [st[key] for st in states] if states and key in states[0] else None

        if self.family == "sgd":
            params, bufs = updates.sgd(o, params, grads, column("momentum_buffer"), h, momentum_on=momentum_on,
                                       nesterov=nesterov, maximize=maximize, has_buffer=column("has_buffer"))
            if not momentum_on:
                return params, [{} for _ in params]
            return params, [{"momentum_buffer": b, "has_buffer": torch.ones_like(st["has_buffer"])}
                            for b, st in zip(bufs, states)]
        if self.family == "rmsprop":
            params, square, grad_avg, bufs, steps = updates.rmsprop(
                o, params, grads, column("square_avg"), column("grad_avg"), column("momentum_buffer"),
                column("step"), h, momentum_on=momentum_on, centered=centered, tf_variant=tf_variant,
                maximize=maximize)
            new = [{"step": s, "square_avg": sq} for s, sq in zip(steps, square)]
            for key, values in (("grad_avg", grad_avg), ("momentum_buffer", bufs)):
                if values is not None:
                    for st, value in zip(new, values):
                        st[key] = value
            return params, new
        if self.family == "lamb":
            params, m, v, steps = updates.lamb(o, params, grads, column("exp_avg"), column("exp_avg_sq"),
                                               column("step"), h, bias_correction=bias_correction)
        else:
            params, m, v, steps = updates.adam(o, params, grads, column("exp_avg"), column("exp_avg_sq"),
                                               column("step"), h, maximize=maximize, decoupled=decoupled,
                                               bias_correction=bias_correction)
        return params, [{"step": s, "exp_avg": a, "exp_avg_sq": b} for s, a, b in zip(steps, m, v)]

    # ------------------------------------------------------------------ results
    def commit(self, new_state):
        """``optimizer.state`` as ``step()`` would have left it (and an LR scheduler's step
        wrapper's flag, which its order check reads, as calling the wrapper sets it)."""
        if getattr(vars(self.optimizer).get("step"), "_wrapped_by_lr_sched", False):
            self.optimizer._opt_called = True
        if self.stateless:
            return
        for group, params in zip(self.optimizer.param_groups, self.groups):
            scale = self._velocity_scale(group) if self.family == "sgd" else 1.0
            for p in params:
                st = new_state.pop(0)
                if not st:
                    continue
                state = self.optimizer.state[p]
                if self.family == "sgd":
                    state["momentum_buffer"] = st["momentum_buffer"]
                    if scale != 1.0:
                        state[_VELOCITY_SCALE_KEY] = scale
                    else:
                        state.pop(_VELOCITY_SCALE_KEY, None)
                else:
                    state.update(st)


def _or_zeros(tensor, param, fill=torch.full_like):
    if tensor is None:
        return fill(param, 0.0, dtype=torch.float32, memory_format=torch.preserve_format)
    return tensor


def _uninitialised(param, value, **kwargs):
    """``torch.full_like``'s signature, without the fill."""
    return torch.empty_like(param, **kwargs)


def _lamb_state(st, p, fill=torch.full_like):
    """``fill(p, value, memory_format=...)`` makes the state not created yet (``state_in``)."""
    return {"step": _step_of(st, p), "exp_avg": _or_fill(st.get("exp_avg"), p, 0.0, fill),
            "exp_avg_sq": _or_fill(st.get("exp_avg_sq"), p, 0.0, fill)}


def _rmsprop_state(st, p, momentum_on, centered, tf_variant, fill=torch.full_like):
    state = {"step": _step_of(st, p),
             "square_avg": _or_fill(st.get("square_avg"), p, 1.0 if tf_variant else 0.0, fill)}
    if centered:  # keys in the order update() returns them (the program carries them flattened)
        state["grad_avg"] = _or_fill(st.get("grad_avg"), p, 0.0, fill)
    if momentum_on:
        state["momentum_buffer"] = _or_fill(st.get("momentum_buffer"), p, 0.0, fill)
    return state


def _step_of(st, p):
    step = st.get("step")
    if step is None:
        return torch.zeros((), device=p.device)
    return torch.as_tensor(step, dtype=torch.float32).to(p.device).reshape(())


def _or_fill(tensor, param, value=0.0, fill=torch.full_like):
    if tensor is None:
        return fill(param, value, memory_format=torch.preserve_format)
    return tensor.to(torch.float32)
