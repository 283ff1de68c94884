"""``ExecutorWeights``: PopTorch's weight API of an executor - copying weights and buffers between
the user's model (the host) and the device, and ``load_state_dict``.
"""
from .. import errors


class ExecutorWeights:
    """Mixed into ``PoplarExecutor`` (reads its ``_executable``, ``_session``, ``_settings``,
    ``_model`` and ``_user_model``)."""

    def copyWeightsToHost(self) -> None:
        """Copy the device's weights to the user's model. A training model on the CPU trains the
        user's parameters in place, so there is nothing to copy there.
        """
        self._require_compiled()
        self._executable.weights.download()

    def copyWeightsToDevice(self) -> None:
        """Copy the user's model's weights (and buffers) to the device, for example after
        ``load_state_dict`` on the model itself. An inference model does this by itself when a
        training model of the same module has trained.
        """
        self._require_compiled()
        self._session.upload_weights()

    def copyWeightsToHostIfNeeded(self) -> bool:
        """With shared weights the host is never stale; copied weights change only by training."""
        return False

    def copyNamedBuffersToDevice(self) -> None:
        """Copy the buffers named by ``Options.updatableNamedBuffers`` from the user's model to the
        device.

        Raises:
            poptorch.Error: No buffers were named, or a named buffer is gone from the model.
        """
        names = self._settings.updatable_named_buffers
        if not names:
            raise errors.createPoptorchError(errors.NO_UPDATABLE_BUFFERS)
        self._require_compiled()
        self._check_updatable_buffers()  # (a buffer deleted since the compile)
        self._session.upload_buffers(names)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Load a state dict into the user's model and, when the executor is attached, copy the
        weights to the device.

        Args:
            state_dict (dict): As for ``torch.nn.Module.load_state_dict``.
            strict (bool): As for ``torch.nn.Module.load_state_dict`` (default True).

        Returns:
            The ``torch.nn.Module.load_state_dict`` result (missing and unexpected keys).
        """
        result = self._user_model.load_state_dict(state_dict, strict=strict)
        if self._executable is not None and self._session.attached:
            self.copyWeightsToDevice()
        return result

    def _check_updatable_buffers(self) -> None:
        """``Options.updatableNamedBuffers`` names buffers of the model (at compile, before any
        state changes; PopTorch found out only at ``copyNamedBuffersToDevice``)."""
        names = self._settings.updatable_named_buffers
        if not names:
            return
        buffers = dict(self._model.named_buffers(remove_duplicate=False))
        unknown = [name for name in names if name not in buffers]
        if unknown:
            raise errors.createPoptorchError(errors.UNKNOWN_UPDATABLE_BUFFERS.format(
                unknown=", ".join(unknown), buffers=", ".join(buffers) or "none"))
