"""Which training executor wraps a user model, and the ``destroy()`` the model has meanwhile.

As on PopTorch, a model may have one live ``trainingModel`` at a time, and while it is wrapped
the user's model object itself offers ``model.destroy()`` (PopTorch's error for wrapping twice
tells users to call it). PopTorch does this by swapping the object's class for a generated
subclass; so does openpop, and ``unwrap`` swaps the original class back:

* the subclass only adds ``destroy`` and keeps the original's ``__name__``, ``__qualname__``,
  ``__module__`` and ``__doc__``, so ``isinstance``, ``repr``, ``type(model).__name__``, Lightning
  and logs see the user's class (PopTorch named it ``Poptorch<Name>``; nothing useful depends on
  that name, and a changed name shows up in model summaries and checkpoints);
* a wrapped model pickles (``torch.save(model)``, ``copy.copy``/``deepcopy``) as an instance of the
  original class, so a copy is not wrapped and the file loads without openpop;
* the class is swapped back by ``destroy()`` (the executor's or the model's) and when the executor
  is garbage-collected without one;
* a ``destroy`` the user's class defines itself is hidden while the model is wrapped (PopTorch's
  error tells users that model.destroy() unwraps).

The registry and the swap are weak: dropping the executor and the model frees both.
"""
import copyreg
import functools
import weakref

from ..log import logger

# User model -> weak reference to the live training executor wrapping it.
_wrappers = weakref.WeakKeyDictionary()


class _Wrapped:
    """Marker base of the generated subclasses; ``_wrapped_original`` is the user's class."""
    __slots__ = ()
    _wrapped_original = None


def training_wrapper_of(model):
    """The live training executor wrapping ``model``, or None."""
    ref = _wrappers.get(model)
    return ref() if ref is not None else None


def original_class(cls: type) -> type:
    """``cls`` itself, or the user's class when ``cls`` is a wrapped subclass."""
    return cls._wrapped_original if issubclass(cls, _Wrapped) else cls


def is_wrapped(model) -> bool:
    return isinstance(model, _Wrapped)


def wrap(model, executor) -> None:
    """Record ``executor`` as ``model``'s training wrapper and give ``model`` its ``destroy()``."""
    _wrappers[model] = weakref.ref(executor, _unwrap_when_dropped(weakref.ref(model)))
    if is_wrapped(model):
        return
    cls = _wrapped_class(type(model))
    if cls is None:
        return
    try:
        model.__class__ = cls
    except TypeError as exc:  # an exotic layout; the model then has no destroy()
        logger.debug("%s cannot offer destroy(): %s", type(model).__qualname__, exc)


def unwrap(model, executor) -> None:
    """Undo ``wrap`` if ``executor`` is still ``model``'s training wrapper."""
    if training_wrapper_of(model) is not executor:
        return
    del _wrappers[model]
    _restore_class(model)


def _restore_class(model) -> None:
    if is_wrapped(model):
        model.__class__ = original_class(type(model))


def _unwrap_when_dropped(model_ref):
    def callback(_executor_ref):
        model = model_ref()
        if model is not None and training_wrapper_of(model) is None:
            _wrappers.pop(model, None)
            _restore_class(model)
    return callback


def _destroy(self) -> None:
    """Unwrap this model: destroy its training wrapper (weights and optimizer state stay with the
    model), so that it can be wrapped again."""
    executor = training_wrapper_of(self)
    if executor is not None:
        executor.destroy()
    else:
        _wrappers.pop(self, None)
        _restore_class(self)


def _reduce_ex(self, protocol):
    """Pickle as the original class: the copy is not wrapped and loads without openpop."""
    cls = type(self)
    original = original_class(cls)
    reduced = super(cls, self).__reduce_ex__(protocol)
    if not (isinstance(reduced, tuple) and len(reduced) >= 2 and isinstance(reduced[1], tuple)):
        return reduced
    make, args = reduced[0], reduced[1]
    if args and args[0] is cls and make in (copyreg.__newobj__, copyreg.__newobj_ex__):
        # The pickler insists that __newobj__'s class be the object's own: the same call, as a
        # plain callable (standard library only).
        make, args = functools.partial(make, original), args[1:]
    else:
        args = tuple(original if arg is cls else arg for arg in args)
    return (make, args) + tuple(reduced[2:])


def _wrapped_class(cls: type):
    """A new subclass per wrap (not cached: a cache would keep every wrapped class alive)."""
    namespace = {"__slots__": (), "_wrapped_original": cls, "destroy": _destroy, "__reduce_ex__": _reduce_ex,
                 "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    try:
        return type(cls)(cls.__name__, (cls, _Wrapped), namespace)
    except TypeError as exc:  # a metaclass or base that cannot be subclassed this way
        logger.debug("%s cannot offer destroy(): %s", cls.__qualname__, exc)
        return None
