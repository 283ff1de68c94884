"""Initializers stored outside the ONNX model, as PopART stores them: ``saveInitializersExternally``
writes their bytes one after another to a file and leaves the model pointing at it (``location`` as
given, ``offset``, ``length``); sessions read them from there and ``modelToHost`` writes the updated
weights back to the same places."""
import os
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from . import messages
from .errors import popart_exception


def is_external(tp: onnx.TensorProto) -> bool:
    return tp.HasField("data_location") and tp.data_location == onnx.TensorProto.EXTERNAL


def check_locations(model: onnx.ModelProto) -> None:
    """ONNX's checker's test of external initializers (their file, relative to the working directory)."""
    for tp in model.graph.initializer:
        if is_external(tp):
            location = {e.key: e.value for e in tp.external_data}.get("location", "")
            if not location or not os.path.isfile(location):
                raise popart_exception(messages.EXTERNAL_DATA_MISSING.format(name=tp.name, location=location))


def external_info(tp: onnx.TensorProto):
    """``(location, offset, length)`` of an external tensor, checked as PopART checks them."""
    info = {e.key: e.value for e in tp.external_data}
    location, offset, length = info.get("location", ""), int(info.get("offset", 0)), int(info.get("length", 0))
    if not location:
        raise popart_exception(messages.EXTERNAL_NO_LOCATION.format(name=tp.name))
    if not os.path.exists(location):
        raise popart_exception(messages.EXTERNAL_FILE_UNKNOWN.format(location=location, name=tp.name))
    if length <= 0:
        raise popart_exception(messages.EXTERNAL_BAD_LENGTH.format(length=length, name=tp.name))
    if offset < 0:
        raise popart_exception(messages.EXTERNAL_BAD_OFFSET.format(offset=offset, name=tp.name))
    return location, offset, length


def _dtype(tp: onnx.TensorProto) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tp.data_type))


def to_array(tp: onnx.TensorProto) -> np.ndarray:
    """An initializer's value, from the model or from its external file."""
    if not is_external(tp):
        return numpy_helper.to_array(tp)
    location, offset, length = external_info(tp)
    with open(location, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    return np.frombuffer(data, dtype=_dtype(tp)).reshape(list(tp.dims)).copy()


def write_back(tp: onnx.TensorProto, value: np.ndarray) -> None:
    """Write ``value`` where the external tensor ``tp`` keeps its data."""
    location, offset, length = external_info(tp)
    data = np.ascontiguousarray(value, dtype=_dtype(tp)).tobytes()
    if len(data) != length:
        raise popart_exception(messages.EXTERNAL_SIZE_CHANGED.format(name=tp.name, length=length, size=len(data)))
    with open(location, "r+b") as f:
        f.seek(offset)
        f.write(data)


def save_externally(model: onnx.ModelProto, ids, fn: str, append: bool = False,
                    update_existing: bool = False) -> None:
    """Move the data of initializers ``ids`` to the file ``fn`` (PopART's saveInitializersExternally)."""
    parent = os.path.dirname(fn)
    if parent and not os.path.exists(parent):
        raise popart_exception(messages.EXTERNAL_PARENT_MISSING.format(fn=fn))
    if append and not os.path.exists(fn):
        raise popart_exception(messages.EXTERNAL_APPEND_MISSING.format(ids="".join(i + " " for i in ids), fn=fn))
    initializers = {tp.name: tp for tp in model.graph.initializer}
    total = os.path.getsize(fn) if append else 0
    chunks = []
    for tensor_id in ids:
        tp = initializers.get(tensor_id)
        if tp is None:
            raise popart_exception(messages.NOT_AN_INITIALIZER.format(id=tensor_id))
        if is_external(tp) and not update_existing:
            raise popart_exception(messages.ALREADY_EXTERNAL.format(id=tensor_id))
        data = np.ascontiguousarray(to_array(tp)).tobytes()
        if not data:
            raise popart_exception(messages.EXTERNAL_NO_DATA.format(id=tensor_id))
        chunks.append((tp, data, total))
        total += len(data)
    with open(fn, "ab" if append else "wb") as f:
        for _, data, _ in chunks:
            f.write(data)
    for tp, data, offset in chunks:
        _point_at(tp, fn, offset, len(data))


def _point_at(tp: onnx.TensorProto, fn: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                  "string_data"):
        tp.ClearField(field)
    del tp.external_data[:]
    tp.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", fn), ("length", str(length)), ("offset", str(offset))):
        entry = tp.external_data.add()
        entry.key, entry.value = key, value


def relocate(model: onnx.ModelProto, from_location: str, to_location: str) -> Optional[list]:
    """Point the tensors stored in ``from_location`` at a copy of it in ``to_location``
    (``Session.updateExternallySavedTensorLocations``)."""
    if os.path.exists(to_location):
        raise popart_exception(messages.EXTERNAL_RELOCATE_EXISTS.format(
            from_location=from_location, to_location=to_location))
    if not os.path.exists(from_location):
        raise popart_exception(messages.EXTERNAL_RELOCATE_MISSING.format(
            from_location=from_location, to_location=to_location))
    moved = []
    for tp in model.graph.initializer:
        if is_external(tp) and {e.key: e.value for e in tp.external_data}.get("location") == from_location:
            moved.append(tp)
    if not moved:
        raise popart_exception(messages.EXTERNAL_RELOCATE_NONE.format(from_location=from_location))
    with open(from_location, "rb") as src, open(to_location, "wb") as dst:
        dst.write(src.read())
    for tp in moved:
        for entry in tp.external_data:
            if entry.key == "location":
                entry.value = to_location
    return moved
