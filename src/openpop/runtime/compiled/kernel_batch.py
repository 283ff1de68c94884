"""Inductor's C++ kernels of one program built by one g++ run instead of one run per kernel.

With its Python wrapper on CPU, Inductor builds each C++ kernel of a graph as a shared library
of its own (``AsyncCompile.cpp_pybinding``: one g++ run, which loads the ~150 MB precompiled
``cpp_prefix.h`` header and links against libtorch, ~0.6 CPU-s here whatever the kernel's size).
A BERT program has 30-60 distinct kernels, so most of g++'s time was that per-run cost.
``batched_kernels()`` (entered around Inductor's compile by ``inductor.ProgramCompiler``) collects
the kernels a generated module defines and builds them when the module waits for them
(``AsyncCompile.wait``) as one library per compile thread: each kernel in a namespace of its own
(the same source, optimisation flags and precompiled header as Inductor's own build), one Python
binding function per kernel in a module Inductor's ``CppPythonBindingsCodeCache`` builds and
caches like any kernel (keyed on the combined source: a warm cache loads the library, no g++).
The kernels called, and their arguments, are Inductor's own. A kernel whose source has a shape
this does not expect (preprocessor lines other than the prefix include, no single
``extern "C"`` function) is built by Inductor as before; so is every kernel if the batch fails.
"""
import contextlib
import re
import threading

_PREFIX_INCLUDE = re.compile(r'^#include [<"][^>"]*cpp_prefix\.h[>"]\s*$', re.M)
_ENTRY = re.compile(r'extern "C"\s+void\s+kernel\(')
_LOCK = threading.Lock()
_ACTIVE = 0  # nesting depth of batched_kernels()
_ORIGINAL = {}


class _Pending:
    """A kernel ``cpp_pybinding`` was asked for, built at the module's ``wait``."""

    __slots__ = ("argtypes", "source")

    def __init__(self, argtypes, source):
        self.argtypes, self.source = list(argtypes), source


def _batchable(source: str) -> bool:
    others = [line for line in source.splitlines() if line.startswith("#") and not _PREFIX_INCLUDE.match(line)]
    return not others and len(_ENTRY.findall(source)) == 1 and source.count('extern "C"') == 1


def _cpp_pybinding(self, argtypes, source_code):
    if not _batchable(source_code):
        return _ORIGINAL["cpp_pybinding"](self, argtypes, source_code)
    pending = _Pending(argtypes, source_code)
    vars(self).setdefault("_openpop_pending", []).append(pending)
    return pending


def _wait(self, scope):
    pending = vars(self).pop("_openpop_pending", [])
    if pending:
        built = _build(self, pending)
        for key, value in list(scope.items()):
            if isinstance(value, _Pending):
                scope[key] = built[id(value)]
    return _ORIGINAL["wait"](self, scope)


def _build(async_compile, pending):
    """``{id(pending kernel): callable}``: the kernels built in ``compile_threads`` libraries (one
    g++ run each, run by Inductor's compile workers when it has several)."""
    from ...torch_compat import CppPythonBindingsCodeCache, get_compile_threads
    try:
        chunks = max(1, min(get_compile_threads(), len(pending) // 8))
        groups = [pending[i::chunks] for i in range(chunks)]
        submit = async_compile.submit if chunks > 1 else None
        loads = [CppPythonBindingsCodeCache.load_async(combined_source(group), "cpu", submit_fn=submit)
                 for group in groups]
        built = {}
        for group, load in zip(groups, loads):
            module = load()
            built.update({id(kernel): getattr(module, f"kernel_{i}") for i, kernel in enumerate(group)})
        return built
    except Exception:
        return {id(kernel): _ORIGINAL["cpp_pybinding"](async_compile, kernel.argtypes, kernel.source)
                for kernel in pending}


def combined_source(kernels) -> str:
    """One C++ source defining ``kernels`` (``_Pending``) and a Python module ``kernel`` whose
    function ``kernel_<i>`` calls the i-th with its arguments parsed as Inductor's binding parses them."""
    parts = ["#include <torch/csrc/inductor/cpp_prefix.h>"]
    for i, kernel in enumerate(kernels):
        body = _ENTRY.sub("void kernel(", _PREFIX_INCLUDE.sub("", kernel.source))
        parts.append(f"namespace openpop_kernel_{i} {{\n{body}\n}}")
    parts.append(_BINDING_PRELUDE)
    methods = []
    for i, kernel in enumerate(kernels):
        arguments = ", ".join(f"parse_arg<{t.replace('const ', '')}>(args, {n})" for n, t in enumerate(kernel.argtypes))
        parts.append(_BINDING.format(i=i, count=len(kernel.argtypes), arguments=arguments))
        methods.append(f'{{"kernel_{i}", kernel_{i}_py, METH_VARARGS, ""}},')
    parts.append(_MODULE.format(methods="\n    ".join(methods)))
    return "\n".join(parts)


_BINDING_PRELUDE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

static void* (*_torchinductor_pyobject_tensor_data_ptr)(PyObject* obj);

template <typename T> static inline T parse_arg(PyObject* args, size_t n) {
    static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
    return static_cast<T>(_torchinductor_pyobject_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
}
template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if (result == -1 && PyErr_Occurred()) throw std::runtime_error("expected int arg");
    return result;
}
template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
    if (result == reinterpret_cast<void*>(-1) && PyErr_Occurred()) throw std::runtime_error("expected int arg");
    return reinterpret_cast<uintptr_t>(result);
}
template <> inline float parse_arg<float>(PyObject* args, size_t n) {
    auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if (result == -1.0 && PyErr_Occurred()) throw std::runtime_error("expected float arg");
    return static_cast<float>(result);
}
"""

_BINDING = r"""
static PyObject* kernel_{i}_py(PyObject* self, PyObject* args) {{
    try {{
        if (!PyTuple_CheckExact(args)) throw std::runtime_error("tuple args required");
        if (PyTuple_GET_SIZE(args) != {count}) throw std::runtime_error("requires {count} args");
        openpop_kernel_{i}::kernel({arguments});
        Py_RETURN_NONE;
    }} catch (std::exception const& e) {{
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }} catch (...) {{
        PyErr_SetString(PyExc_RuntimeError, "unhandled error");
        return nullptr;
    }}
}}
"""

_MODULE = r"""
static PyMethodDef py_methods[] = {{
    {methods}
    {{NULL, NULL, 0, NULL}}}};

static struct PyModuleDef py_module = {{PyModuleDef_HEAD_INIT, "kernel", NULL, -1, py_methods}};

PyMODINIT_FUNC PyInit_kernel(void) {{
    const char* str_addr = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if (!str_addr) {{
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
        return nullptr;
    }}
    char* endptr = nullptr;
    errno = 0;
    uintptr_t addr = std::strtoull(str_addr, &endptr, 10);
    if (errno != 0 || endptr == str_addr || addr == 0) {{
        PyErr_SetString(PyExc_RuntimeError, "Failed to parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        return nullptr;
    }}
    _torchinductor_pyobject_tensor_data_ptr = reinterpret_cast<decltype(_torchinductor_pyobject_tensor_data_ptr)>(addr);
    return PyModule_Create(&py_module);
}}
"""


@contextlib.contextmanager
def batched_kernels():
    """Inside: Inductor's CPU kernels of each generated module built together (module docstring)."""
    global _ACTIVE
    from ...torch_compat import AsyncCompile
    from .passes import switched_on
    if not switched_on("kernel_batch"):  # (OPENPOP_DISABLE_PASSES): Inductor's own build
        yield
        return
    with _LOCK:
        if _ACTIVE == 0:
            _ORIGINAL.update(cpp_pybinding=AsyncCompile.cpp_pybinding, wait=AsyncCompile.wait)
            AsyncCompile.cpp_pybinding, AsyncCompile.wait = _cpp_pybinding, _wait
        _ACTIVE += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE -= 1
            if _ACTIVE == 0:
                AsyncCompile.cpp_pybinding, AsyncCompile.wait = _ORIGINAL["cpp_pybinding"], _ORIGINAL["wait"]
