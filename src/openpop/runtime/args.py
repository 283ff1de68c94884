"""Host-call arguments: binding against ``forward``'s signature, the micro-batch split, and the
checks that later calls match the compiled ones (PopTorch's exact mismatch messages)."""
import inspect

import torch

from .. import errors
from ..arg_parsers import custom_arg_parser_for, same_constant
from ..log import logger
from ..torch_compat import has_internal_overlap, pytree


class BoundInputs:
    """One host call's arguments: ``forward``'s parameters by name, flattened to leaves."""

    def __init__(self, signature: inspect.Signature, args, kwargs):
        names = plain_parameter_names(signature)
        if not kwargs and names is not None and len(args) == len(names):
            # forward(a, b, ...) called with exactly its parameters: nothing to bind.
            self.arguments = dict(zip(names, args))
            self.args, self.kwargs = tuple(args), {}
        else:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                missing = _missing_parameter(signature, args, kwargs)
                if missing is not None:
                    raise errors.createPoptorchError(errors.MANDATORY_PARAMETER.format(name=missing)) from None
                raise errors.createPoptorchError(str(exc)) from None
            bound.apply_defaults()  # as PopTorch: an omitted default and the same value given compile alike
            self.arguments = _named_arguments(signature, bound.arguments)
            self.args = bound.args
            self.kwargs = bound.kwargs
        # Common case, kept cheap: every argument is a tensor given positionally.
        self.simple = not self.kwargs and all(type(a) is torch.Tensor for a in self.args)
        if self.simple:
            self.leaves, self.spec = list(self.args), None
            self.tensor_positions = list(range(len(self.leaves)))
        else:
            self.leaves, self.spec = pytree.tree_flatten((self.args, self.kwargs))
            self.tensor_positions = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def named_tensors(self):
        """``(path, tensor)`` for every tensor argument, nested ones named ``x[0]``, ``d['k']``."""
        for name, value in self.arguments.items():
            yield from _named_tensors(name, value)

    def rebuild(self, leaves):
        """(args, kwargs) with ``leaves`` in place of the original leaves."""
        if self.simple:
            return tuple(leaves), {}
        return pytree.tree_unflatten(leaves, self.spec)


def _named_arguments(signature: inspect.Signature, arguments) -> dict:
    """name -> value in signature order; the entries of a ``**kwargs`` parameter are arguments of
    their own name, as PopTorch names them (``u``, not ``kwargs['u']``; not a dict input)."""
    named = {}
    for name, value in arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


_PLAIN_NAMES = {}  # id(signature) -> (signature, names): by identity (hashing a Signature costs µs)


def plain_parameter_names(signature: inspect.Signature):
    """Parameter names if every parameter is positional without a default, else None."""
    cached = _PLAIN_NAMES.get(id(signature))
    if cached is None or cached[0] is not signature:
        if len(_PLAIN_NAMES) >= 256:
            _PLAIN_NAMES.clear()
        cached = _PLAIN_NAMES[id(signature)] = (signature, _plain_names_of(signature))
    return cached[1]


def _plain_names_of(signature: inspect.Signature):
    params = list(signature.parameters.values())
    if all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params):
        return tuple(p.name for p in params)
    return None


def _missing_parameter(signature, args, kwargs):
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, param in enumerate(positional):
        if index < len(args) or param.name in kwargs:
            continue
        if param.default is inspect.Parameter.empty:
            return param.name
    for param in signature.parameters.values():
        if param.kind == param.KEYWORD_ONLY and param.name not in kwargs and param.default is param.empty:
            return param.name
    return None


def prepare_tensors(inputs: BoundInputs, warned: set) -> "CallerTensors":
    """Refuse zero-sized inputs; detach inputs that require grad and make non-contiguous ones
    contiguous, warning once each.

    Returns the ``CallerTensors`` that writes in-place changes the model makes to a copied input
    back to the caller's tensor after the run.
    """
    callers = CallerTensors(warned)
    for pos in inputs.tensor_positions:
        tensor = inputs.leaves[pos]
        if tensor.numel() == 0:  # (the copies made so far are the executor's own: nothing changed)
            raise errors.createPoptorchError(errors.ZERO_SIZED.format(shape=list(tensor.shape)))
        if tensor.requires_grad:
            if "requires_grad" not in warned:
                logger.warning(errors.INPUT_REQUIRES_GRAD)
                warned.add("requires_grad")
            tensor = tensor.detach()  # same memory and version counter: nothing to write back
        if not tensor.is_contiguous():
            if "contiguous" not in warned:
                logger.warning(errors.INPUT_NOT_CONTIGUOUS)
                warned.add("contiguous")
            contiguous = tensor.contiguous()
            callers.replaced(pos, tensor, contiguous)
            tensor = contiguous
        inputs.leaves[pos] = tensor
    if any(isinstance(v, dict) for v in inputs.arguments.values()) and "dict" not in warned:
        logger.warning(errors.DICT_INPUTS)
        warned.add("dict")
    return callers


class CallerTensors:
    """The caller's tensors behind inputs the executor gave the model as copies (made contiguous,
    moved to a device). As on PopTorch, an input the model changes in place is changed for the
    caller too: after the run each copy the model wrote to is copied back, and only those - an
    input the model did not write is never written (it may be an expanded view, whose elements
    share memory, or a tensor the caller reads elsewhere)."""

    def __init__(self, warned: set):
        self._warned = warned
        self._copies = {}  # leaf position -> (caller's tensor, copy the model sees, copy's version)

    def replaced(self, pos: int, tensor: torch.Tensor, copy: torch.Tensor) -> None:
        """``copy`` replaces ``tensor`` at ``pos`` (itself a copy when converted twice)."""
        earlier = self._copies.get(pos)
        caller = earlier[0] if earlier is not None else tensor
        self._copies[pos] = (caller, copy, _version_of(copy))

    def write_back(self) -> None:
        if not self._copies:
            return
        with torch.no_grad():
            for caller, copy, version in self._copies.values():
                if not _written(copy, version, caller):
                    continue
                problem = _unwritable(caller)
                if problem is None:
                    caller.copy_(copy)
                elif "write_back" not in self._warned:
                    self._warned.add("write_back")
                    logger.warning(errors.INPUT_NOT_WRITTEN_BACK.format(problem=problem))


def _version_of(tensor: torch.Tensor):
    """The version counter, or None for an inference tensor (it has none)."""
    return None if tensor.is_inference() else tensor._version


def _written(copy: torch.Tensor, version, caller: torch.Tensor) -> bool:
    if version is not None:
        return copy._version != version
    return not torch.equal(copy, caller.to(copy.device))


def _unwritable(tensor: torch.Tensor):
    """Why ``tensor`` cannot take a copy, or None."""
    if tensor.is_inference() and not torch.is_inference_mode_enabled():
        return "it is an inference tensor (made under torch.inference_mode())"
    if has_internal_overlap(tensor) == 1:  # 1: some elements share memory
        return "several of its elements share memory (an expanded or broadcast view)"
    return None


class InputSignature:
    """What the model was compiled with; later calls must match it."""

    def __init__(self, inputs: BoundInputs):
        self.arguments = {name: _describe(value) for name, value in inputs.arguments.items()}
        self.positional_count = len(inputs.args)
        # Every argument a tensor given positionally (BoundInputs.simple): a later simple call with
        # as many arguments binds the same names, so comparing dtypes and shapes in order suffices.
        self._simple = [(t.dtype, t.shape) for t in inputs.args] if inputs.simple else None

    def check(self, inputs: BoundInputs) -> None:
        simple = self._simple
        if (simple is not None and inputs.simple and len(inputs.args) == len(simple)
                and all(t.dtype == d and t.shape == s for t, (d, s) in zip(inputs.args, simple))):
            return
        problem = None
        if len(inputs.args) != self.positional_count:
            problem = (f"Number of positional arguments mismatch: expected {self.positional_count} "
                       f"arguments but got {len(inputs.args)}.")
        else:
            expected_names = set(self.arguments)
            got_names = set(inputs.arguments)
            if expected_names != got_names:
                problem = _keys_problem("forward", expected_names, got_names)
            else:
                for name, value in inputs.arguments.items():
                    problem = _compare(name, self.arguments[name], value)
                    if problem:
                        break
        if problem:
            raise errors.createPoptorchError(problem + errors.INPUT_MISMATCH_SUFFIX)


def _describe(value):
    """A comparable record of an argument: tensors by dtype and shape, containers recursively."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.shape)
    parser = custom_arg_parser_for(value)
    if parser is not None:
        return (type(value), [_describe(t) for t in parser.yieldTensors(value)])
    if isinstance(value, (list, tuple)):
        return (type(value), [_describe(v) for v in value])
    if isinstance(value, dict):
        return (dict, {k: _describe(v) for k, v in value.items()})
    return ("value", value)


def _type_name(record):
    kind = record[0]
    if kind == "tensor":
        return "torch.Tensor"
    if kind == "value":
        return type(record[1]).__name__
    return kind.__name__


def _compare(name, expected, value):
    got = _describe(value)
    if _type_name(expected) != _type_name(got):
        return f"Type mismatch for {name}: expected {_type_name(expected)} but got {_type_name(got)}."
    kind = expected[0]
    if kind == "tensor":
        if expected[1] != got[1]:
            return f"Data type mismatch for {name}: expected {expected[1]} but got {got[1]}."
        if expected[2] != got[2]:
            return f"Shape mismatch for {name}: expected {expected[2]} but got {got[2]}."
        return None
    if kind == "value":
        if not same_constant(expected[1], got[1]):
            return f"Value mismatch for {name}: expected {expected[1]} but got {got[1]}."
        return None
    if kind is dict:
        if set(expected[1]) != set(value):
            return _keys_problem(name, set(expected[1]), set(value))
        for key in expected[1]:
            problem = _compare(f"{name}[{key!r}]", expected[1][key], value[key])
            if problem:
                return problem
        return None
    parser = custom_arg_parser_for(value)
    items = list(parser.yieldTensors(value)) if parser is not None else value
    if len(expected[1]) != len(items):
        return f"Length mismatch for {name}: expected {len(expected[1])} elements but got {len(items)}."
    for index, (exp, val) in enumerate(zip(expected[1], items)):
        problem = _compare(f"{name}[{index}]", exp, val)
        if problem:
            return problem
    return None


def _keys_problem(name, expected, got):
    unexpected = ", ".join(sorted(map(str, got - expected)))
    missing = ", ".join(sorted(map(str, expected - got)))
    return f"Keys mismatch for {name}: Unexpected arguments: {unexpected}. Missing arguments: {missing}."


def _named_tensors(name, value):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _named_tensors(f"{name}[{index}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _named_tensors(f"{name}[{key!r}]", item)
