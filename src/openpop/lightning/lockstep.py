"""Manual optimization with several replicas: the replicas' steps run in lockstep, as DDP ranks.

With automatic optimization the executor runs replicas; with manual optimization the user's
``training_step`` calls ``manual_backward`` and ``optimizer.step()`` itself, so replicas must
meet where DDP ranks would:

* ``manual_backward``: after each replica's backward, gradients are averaged over replicas
  (DDP's all-reduce), then over poprun's instances (``instances``); every replica then holds
  the same gradients;
* ``optimizer.step()``: applied once, with the averaged gradients (every rank would apply the
  same update to the same weights).

Each replica runs in its own thread, but only one runs at a time: a replica runs until it
reaches a meeting point, then the next one runs; when all are there the collective happens.
Each replica keeps private gradients, ``requires_grad`` flags and ``toggle_optimizer`` state
(swapped in when it runs); weights and optimizer state are shared, as they are identical on
every rank. Replicas that disagree (one calls ``optimizer.step()`` while another returns) are
an error, where DDP would hang.
"""
import threading
from typing import Callable, Optional

import torch

DIVERGED = ("The replicas of a manual-optimization step did not meet: each must call `manual_backward` and "
            "`optimizer.step()` the same number of times in the same order (replica states: {states}).")

_local = threading.local()


class _Aborted(BaseException):
    """Raised inside replica threads to unwind them when the step fails."""


def current() -> Optional["Lockstep"]:
    """The lockstep of the calling replica thread, or None."""
    return getattr(_local, "lockstep", None)


def replica() -> int:
    return getattr(_local, "replica", 0)


class Lockstep:
    def __init__(self, module: torch.nn.Module, replicas: int, instances=None):
        self.module = module
        self.replicas = replicas
        self.instances = instances  # GlobalReplication across processes, or None
        self.params = list(module.parameters())
        self._go = [threading.Event() for _ in range(replicas)]
        self._paused = threading.Event()
        self._states: list[object] = [None] * replicas
        self._aborted = False

    # ------------------------------------------------------------------ replica side
    def meet(self, kind: str, payload=None) -> None:
        """Called in a replica thread at a meeting point ("backward" or "step")."""
        index = replica()
        self._states[index] = (kind, payload)
        self._pause(index)

    def _pause(self, index: int) -> None:
        self._paused.set()
        self._go[index].wait()
        self._go[index].clear()
        if self._aborted:
            raise _Aborted()

    # ------------------------------------------------------------------ coordinator side
    def run(self, steps: list[Callable[[], object]], on_step: Callable) -> list:
        """Run ``steps[r]()`` for every replica r; ``on_step(optimizer)`` applies a step."""
        outputs: list[object] = [None] * self.replicas
        errors: list[Optional[BaseException]] = [None] * self.replicas
        private = [self._capture(clone=r > 0) for r in range(self.replicas)]

        def body(index):
            _local.lockstep, _local.replica = self, index
            try:
                self._go[index].wait()
                self._go[index].clear()
                outputs[index] = steps[index]()
                self._states[index] = ("done", None)
            except _Aborted:
                self._states[index] = ("aborted", None)
            except BaseException as exc:  # re-raised in the caller's thread
                errors[index] = exc
                self._states[index] = ("error", None)
            finally:
                self._paused.set()

        threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"openpop-replica-{r}")
                   for r in range(self.replicas)]
        for thread in threads:
            thread.start()
        try:
            while True:
                for r in range(self.replicas):
                    if self._states[r] is not None and self._states[r][0] in ("done", "error"):
                        continue
                    self._restore(private[r])
                    self._states[r] = None
                    self._paused.clear()
                    self._go[r].set()
                    self._paused.wait()
                    private[r] = self._capture()
                    if self._states[r][0] == "error":
                        raise errors[r]
                kinds = {state[0] for state in self._states}
                if kinds == {"done"}:
                    break
                if len(kinds) > 1 or len({id(state[1]) for state in self._states}) > 1:
                    raise RuntimeError(DIVERGED.format(states=[state[0] for state in self._states]))
                kind, payload = self._states[0]
                if kind == "backward":
                    self._average(private)
                else:
                    self._restore(private[0])
                    on_step(payload)
                    private[0] = self._capture()
        except BaseException:
            self._aborted = True
            for r, thread in enumerate(threads):
                self._go[r].set()
                thread.join(timeout=10)
            raise
        for thread in threads:
            thread.join()
        self._restore(private[0])
        return outputs

    def _capture(self, clone: bool = False):
        grads = [p.grad.clone() if clone and p.grad is not None else p.grad for p in self.params]
        flags = [p.requires_grad for p in self.params]
        return grads, flags, getattr(self.module, "_param_requires_grad_state", {})

    def _restore(self, state) -> None:
        grads, flags, toggled = state
        for p, grad, flag in zip(self.params, grads, flags):
            p.grad = grad
            p.requires_grad_(flag)
        self.module._param_requires_grad_state = toggled

    def _average(self, private) -> None:
        """DDP's all-reduce: every replica's gradients become their mean (over the instances'
        replicas too, with ``instances``)."""
        count = self.replicas
        means = []
        for i in range(len(self.params)):
            grads = [state[0][i] for state in private]
            present = [g for g in grads if g is not None]
            means.append(None if not present else torch.stack(
                [g if g is not None else torch.zeros_like(present[0]) for g in grads]).sum(0) / count)
        if self.instances is not None:
            saved = [p.grad for p in self.params]
            for p, mean in zip(self.params, means):
                p.grad = mean
            self.instances.all_reduce(self.params)
            means = [p.grad for p in self.params]
            for p, grad in zip(self.params, saved):
                p.grad = grad
        for i, mean in enumerate(means):
            if mean is None:
                continue
            for r, state in enumerate(private):
                state[0][i] = mean if r == 0 else mean.clone()
