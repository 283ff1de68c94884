"""Lightning's per-optimizer-step work, done at every optimizer step inside a host call.

With ``device_iterations = DI`` one Lightning batch (one host call) runs DI optimizer steps.
openpop makes each of them an optimizer step in Lightning's sense, so a run equals the same
run on the CPU with DI times more (smaller) batches:

* before each step: the ``on_before_optimizer_step`` hooks and gradient clipping
  (``gradient_clip_val`` / ``gradient_clip_algorithm`` / ``configure_gradient_clipping``), on the
  step's reduced gradients;
* after each step: ``trainer.global_step`` advances by one (so it grows by DI per host call and
  reads correctly inside the step), and every ``interval="step"`` LR scheduler steps when the
  CPU run would (honouring ``frequency``, counted in the CPU run's batches). Lightning's own
  once-per-batch stepping of those schedulers is turned off for the run; ``"epoch"`` and
  ``ReduceLROnPlateau`` schedulers stay with Lightning.

Hooked through ``torch.optim.Optimizer.register_step_pre_hook`` / ``register_step_post_hook`` on
the optimizer the executor steps; the hooks act only during the strategy's host calls.

On the compiled backend no ``optimizer.step()`` runs: this object is attached to the optimizer as
its step hooks' compiled form (``runtime/compiled/step_hooks.py``). Before the program runs it
steps the LR schedulers and counters through the call's DI steps exactly as the hooks would,
reading the optimizer's hyperparameters before each step (the program takes them as ``[DI]``
tensors); gradient clipping by ``gradient_clip_val`` (norm or value) is part of the program's
update. ``on_before_optimizer_step`` overridden by the module or a callback, or an overridden
``configure_gradient_clipping`` / ``clip_gradients`` (Python that must run between steps), keeps
the executor eager.
"""
import contextlib
import copy

from openpop.runtime.compiled import step_hooks

from ._framework import module


class PerStepHooks:
    def __init__(self, trainer, optimizer, precision, device_iterations: int, accumulation: int,
                 skipped_steps=lambda: 0):
        self.trainer = trainer
        self._skipped_steps = skipped_steps  # steps automatic loss scaling has skipped so far (all calls)
        self._skipped_before = 0  # ... when the host call started
        self._applied = 0  # steps of the host call the optimizer applied
        self.optimizer = optimizer
        self.precision = precision
        self.device_iterations = device_iterations
        self.accumulation = accumulation
        self.active = False
        self.batch_idx = 0
        self.steps = 0
        self._handles = [optimizer.register_step_pre_hook(self._before),
                         optimizer.register_step_post_hook(self._after)]
        self._loop = trainer.fit_loop.epoch_loop
        self._call = module("trainer.call")
        self._original_update = None
        self._take_over_step_schedulers()
        self._user_hooks = _user_before_step_hooks(trainer, precision)
        self._before_needed = self._user_hooks is not None or bool(trainer.gradient_clip_val)
        self._snapshot = None
        self._at_start = None  # _state() when the host call started (restart)
        step_hooks.attach(optimizer, self)

    @property
    def hook_ids(self):
        return [handle.id for handle in self._handles]

    # ------------------------------------------------------------------ lifecycle
    def remove(self) -> None:
        step_hooks.detach(self.optimizer)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._original_update is not None:
            self._loop.__dict__.pop("_update_learning_rates", None)
            self._original_update = None

    def _take_over_step_schedulers(self) -> None:
        original = self._loop._update_learning_rates
        self._original_update = original

        def update_learning_rates(interval: str, update_plateau_schedulers: bool) -> None:
            if interval == "step" and not update_plateau_schedulers:
                return  # stepped after every optimizer step by this object
            original(interval=interval, update_plateau_schedulers=update_plateau_schedulers)

        self._loop._update_learning_rates = update_learning_rates

    @contextlib.contextmanager
    def host_call(self):
        """Around one host call: afterwards the call counted exactly DI optimizer steps."""
        self.active = True
        self.batch_idx = self._loop.batch_idx
        self.steps = self._applied = 0
        self._skipped_before = self._skipped_steps()
        self._at_start = self._state()
        try:
            yield
        finally:
            self.active = False
            self._at_start = None
        # Steps the executor skipped (automatic loss scaling found inf/NaN) still count, in their
        # place, as a skipped GradScaler step does on the CPU: those before a step when it starts,
        # the call's last ones here.
        while self.steps < self.device_iterations:
            self._count_step()

    def restart(self) -> None:
        """The executor runs the host call again from its start (float16 overflow,
        ``runtime/eager.py``): the schedulers, counters and group values go back to where the call
        found them, so its steps count once."""
        if self._at_start is not None:
            self._restore(self._at_start)
        self.steps = self._applied = 0
        self._skipped_before = self._skipped_steps()

    def _count_skipped(self) -> None:
        while self.steps < self._applied + self._skipped_steps() - self._skipped_before:
            self._count_step()

    # ------------------------------------------------------------------ compiled form (step_hooks.py)
    def compiled_reason(self):
        return None if self._user_hooks is None else f"{self._user_hooks} (runs between optimizer steps)"

    def clipping(self):
        value = self.trainer.gradient_clip_val
        if not value or value <= 0:
            return None
        algorithm = self.trainer.gradient_clip_algorithm
        return ("value" if algorithm is not None and str(getattr(algorithm, "value", algorithm)) == "value" else "norm",
                float(value))

    def begin_compiled_call(self, steps: int, read_hyper):
        """The hyperparameters of each of the call's steps; afterwards the schedulers and counters
        are where the eager steps leave them (``abort_compiled_call`` undoes it)."""
        self._snapshot = self._state()
        self.optimizer._opt_called = True  # what the scheduler-wrapped optimizer.step() would mark
        if not self._step_scheduler_configs():  # nothing changes the values between steps
            values = read_hyper()
            for _ in range(steps):
                self._count_step()
            return [values] * steps
        per_step = []
        for _ in range(steps):
            per_step.append(read_hyper())
            self._count_step()
        return per_step

    def abort_compiled_call(self) -> None:
        if self._snapshot is None:
            return
        snapshot, self._snapshot = self._snapshot, None
        self._restore(snapshot)
        self.steps = 0

    def _restore(self, state) -> None:
        groups, schedulers, progress = state
        for group, values in zip(self.optimizer.param_groups, groups):
            group.update(values)
        for config, saved in zip(self.trainer.lr_scheduler_configs, schedulers):
            config.scheduler.load_state_dict(saved)
        for counter, saved in zip(self._progress(), progress):
            counter.load_state_dict(saved)

    def _progress(self):
        return [self._loop.automatic_optimization.optim_progress.optimizer.step, self._loop.scheduler_progress]

    def _state(self):
        """What ``begin_compiled_call`` changes (group values are numbers and tuples: not copied)."""
        groups = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        schedulers = [copy.deepcopy(config.scheduler.state_dict()) for config in self.trainer.lr_scheduler_configs]
        return groups, schedulers, [counter.state_dict() for counter in self._progress()]

    def _step_scheduler_configs(self):
        return [config for config in self.trainer.lr_scheduler_configs
                if config.interval == "step" and not config.reduce_on_plateau]

    # ------------------------------------------------------------------ hooks
    def _before(self, optimizer, args, kwargs):
        if self.active:
            self._count_skipped()
        if not self.active or not self._before_needed:
            return None
        lightning_module = self.trainer.lightning_module
        self.precision._after_closure(lightning_module, optimizer)
        return None

    def _after(self, optimizer, args, kwargs):
        if self.active:
            self._applied += 1
            self._count_step()
        return None

    def _count_step(self) -> None:
        d = self.steps
        self.steps += 1
        if d < self.device_iterations - 1:  # Lightning counts the host call's last step itself
            progress = self._loop.automatic_optimization.optim_progress.optimizer.step
            progress.increment_completed()
            progress.increment_ready()
        self._step_schedulers(d)

    def _step_schedulers(self, d: int) -> None:
        trainer = self.trainer
        cpu_batches = (self.batch_idx * self.device_iterations + d + 1) * self.accumulation
        for config in self._step_scheduler_configs():
            if cpu_batches % config.frequency:
                continue
            self._loop.scheduler_progress.increment_ready()
            self._call._call_lightning_module_hook(trainer, "lr_scheduler_step", config.scheduler, None)
            self._loop.scheduler_progress.increment_completed()


def _user_before_step_hooks(trainer, precision):
    """The first ``on_before_optimizer_step`` hook or clipping override that is not Lightning's
    default (those do nothing but clip by ``gradient_clip_val``), or None."""
    callback_base = module("callbacks").Callback
    module_base = module("core.module").LightningModule
    lightning_module = trainer.lightning_module
    for callback in trainer.callbacks:
        if type(callback).on_before_optimizer_step is not callback_base.on_before_optimizer_step:
            return f"{type(callback).__name__}.on_before_optimizer_step"
    for name in ("on_before_optimizer_step", "configure_gradient_clipping", "clip_gradients"):
        if getattr(type(lightning_module), name) is not getattr(module_base, name):
            return f"{type(lightning_module).__name__}.{name}"
    precision_base = module("plugins.precision").Precision
    for name in ("_after_closure", "_clip_gradients", "clip_gradients", "clip_grad_by_norm", "clip_grad_by_value"):
        if getattr(type(precision), name, None) is not getattr(precision_base, name):
            return f"{type(precision).__name__}.{name}"
    return None
