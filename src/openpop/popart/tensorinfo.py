"""``popart.TensorInfo`` and the one table of data types: PopART's names, ONNX's enum, numpy, torch."""
import numpy as np
import onnx
import torch

from . import messages
from .errors import popart_exception

# PopART name -> (ONNX TensorProto enum, numpy dtype, torch dtype)
_TYPES = {
    "FLOAT": (onnx.TensorProto.FLOAT, np.float32, torch.float32),
    "FLOAT16": (onnx.TensorProto.FLOAT16, np.float16, torch.float16),
    "DOUBLE": (onnx.TensorProto.DOUBLE, np.float64, torch.float64),
    "INT8": (onnx.TensorProto.INT8, np.int8, torch.int8),
    "UINT8": (onnx.TensorProto.UINT8, np.uint8, torch.uint8),
    "INT16": (onnx.TensorProto.INT16, np.int16, torch.int16),
    "UINT16": (onnx.TensorProto.UINT16, np.uint16, torch.uint16),
    "INT32": (onnx.TensorProto.INT32, np.int32, torch.int32),
    "UINT32": (onnx.TensorProto.UINT32, np.uint32, torch.uint32),
    "INT64": (onnx.TensorProto.INT64, np.int64, torch.int64),
    "UINT64": (onnx.TensorProto.UINT64, np.uint64, torch.uint64),
    "BOOL": (onnx.TensorProto.BOOL, np.bool_, torch.bool),
    "BFLOAT16": (onnx.TensorProto.BFLOAT16, None, torch.bfloat16),
}
_BY_ONNX = {v[0]: k for k, v in _TYPES.items()}
_LCASE = {"FLOAT": "float32", "DOUBLE": "float64"}  # the others are their name in lower case
_BY_NUMPY = {np.dtype(v[1]): k for k, v in _TYPES.items() if v[1] is not None}
_BY_TORCH = {v[2]: k for k, v in _TYPES.items()}


def popart_name(dtype) -> str:
    """PopART's name of ``dtype`` (a name, ``popart.DataType``, numpy dtype, torch dtype or ONNX enum)."""
    from .enums import DataType
    if isinstance(dtype, DataType):
        dtype = dtype.name
    if isinstance(dtype, str):
        name = dtype.upper()
        if name == "FLOAT32":
            name = "FLOAT"
        if name in _TYPES:
            return name
        raise popart_exception(messages.UNKNOWN_DATA_TYPE.format(dtype=dtype, known=', '.join(_TYPES)))
    if isinstance(dtype, torch.dtype):
        return _BY_TORCH[dtype]
    if isinstance(dtype, int) and dtype in _BY_ONNX:
        return _BY_ONNX[dtype]
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except (TypeError, KeyError):
        raise popart_exception(messages.NO_POPART_DATA_TYPE.format(dtype=dtype)) from None


def onnx_type(name: str) -> int:
    return _TYPES[popart_name(name)][0]


def numpy_dtype(name) -> np.dtype:
    return np.dtype(_TYPES[popart_name(name)][1])


def torch_dtype(name) -> torch.dtype:
    return _TYPES[popart_name(name)][2]


class TensorInfo:
    """A data type and a shape: ``TensorInfo("FLOAT", [2, 3])`` or ``TensorInfo(np_array)``."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], np.ndarray):
            self._dtype = popart_name(args[0].dtype)
            self._shape = [int(d) for d in args[0].shape]
        elif len(args) == 2:
            self._dtype = popart_name(args[0])
            self._shape = [int(d) for d in args[1]]
        else:
            raise popart_exception(messages.TENSOR_INFO_ARGUMENTS)

    def shape(self) -> list[int]:
        return list(self._shape)

    def rank(self) -> int:
        return len(self._shape)

    def nelms(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    def data_type(self) -> str:
        return self._dtype

    def data_type_lcase(self) -> str:
        """PopART's lower-case name, numpy's spelling: ``float32``, ``float16``, ``int32``, ``bool``..."""
        return _LCASE.get(self._dtype, self._dtype.lower())

    def dim(self, i: int) -> int:
        return self._shape[i]

    def __eq__(self, other):
        return isinstance(other, TensorInfo) and (self._dtype, self._shape) == (other._dtype, other._shape)

    def __repr__(self):
        return f"TensorInfo({self._dtype}, {self._shape})"

    __str__ = __repr__
