"""The executable cache: ``Options.enableExecutableCaching(path)`` / ``POPTORCH_CACHE_DIR``.

openpop has no IPU executable; what a second process can load instead of recompiling is what
torch's own on-disk compile caches hold: Inductor's FX graph cache (the generated kernels and
wrapper code per graph), the AOTAutograd cache (the forward/backward split per graph) and, on
GPUs, Triton's kernel cache. ``compile_cache_for(options)`` points all of them at the cache
directory for the duration of a compile and restores the previous settings afterwards;
``watch_compiles()`` tells from torch's counters whether a compile was loaded from the cache.

Several processes (poprun instances, a job array) compiling the same model into one cache
directory take turns: ``compile_cache_for`` holds an exclusive ``fcntl.flock`` on
``<cache>/openpop-compile.lock`` while it is active, so one process compiles and writes the
artefacts and the others wait (one log line each), then find them in the cache. The lock is
re-entrant within a process (nested ``compile_cache_for`` blocks, e.g. the BERT app around
``compile()``), released when the block ends or the process dies, and waited for at most
``OPENPOP_CACHE_LOCK_TIMEOUT`` seconds (default 1800); past that the process compiles without
it (torch writes its cache entries atomically, so the worst case is compiling twice).

Without a directory named by the user the cache is still on: ``CompileCache.default()`` is
``<OPENPOP_CACHE_DIR>/executables`` (``~/.cache/openpop/executables``), unless
``OPENPOP_EXECUTABLE_CACHE=0`` or ``enableExecutableCaching(None)`` turns it off. A process
that compiles the model a second time then loads it, as PopTorch loads a cached executable. That
directory is openpop's own, so it is ``managed``: after each compile into it, the least recently
used files go when it passes ``OPENPOP_EXECUTABLE_CACHE_MAX_MB`` (``prune``), and it takes no
lock: unrelated jobs on one machine do not wait for each other's compiles (two processes
compiling the same model at once both compile; every write is atomic). A directory the user names
is neither capped nor unlocked: it is theirs, and processes sharing it mean to share its compiles.

Dynamo's tracing of the Python code is not cached by torch: through these caches alone a cached
compile still re-traces the model, and only skips AOTAutograd's partitioning and Inductor's code
generation. The compiled backend therefore also saves each program whole into the cache directory
(``compiled/saved_programs.py``: ``openpop-programs/<key>.program``), which a later process loads
without tracing; ``CompileOutcome`` counts those programs too. Inductor's keys
include torch's version, the graph, the configuration and the number of intra-op threads: a
process with another ``torch.set_num_threads`` compiles afresh.
"""
import contextlib
import dataclasses
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Optional

from .. import errors, openpop_settings
from ..log import logger
from . import messages

ENVIRONMENT_VARIABLE = "POPTORCH_CACHE_DIR"
OPTION = "poptorch.Options.enableExecutableCaching()"
DEFAULT_SOURCE = "the default executable cache (OPENPOP_CACHE_DIR, off with OPENPOP_EXECUTABLE_CACHE=0)"
DEFAULT_SUBDIRECTORY = "executables"
_PRUNED_TO = 0.8  # of the cap: a directory just over it is not pruned again at the next compile
LOCK_FILE = "openpop-compile.lock"
LOCK_TIMEOUT_ENV = openpop_settings.env("cache_lock_timeout")
_LOCK_POLL = 0.05

# torch's counters (torch._dynamo.utils.counters) that tell a cache hit from a fresh compile.
_COUNTERS = {
    "fx_graph_hits": ("inductor", "fxgraph_cache_hit"),
    "fx_graph_misses": ("inductor", "fxgraph_cache_miss"),
    "fx_graph_bypasses": ("inductor", "fxgraph_cache_bypass"),
    "autograd_hits": ("aot_autograd", "autograd_cache_hit"),
    "autograd_misses": ("aot_autograd", "autograd_cache_miss"),
    "autograd_bypasses": ("aot_autograd", "autograd_cache_bypass"),
    "programs_loaded": ("openpop", "saved_program_loaded"),  # whole programs (compiled/saved_programs.py)
    "programs_saved": ("openpop", "saved_program_saved"),
}


@dataclasses.dataclass(frozen=True)
class CompileCache:
    """A validated, writable cache directory and the setting it came from (for error messages)."""

    path: str
    source: str = OPTION
    managed: bool = False  # openpop's default directory: size-capped, unlocked (module docstring)

    @classmethod
    def from_options(cls, options=None, source: Optional[str] = None) -> Optional["CompileCache"]:
        """The cache ``options`` ask for, or None when caching is off.

        ``poptorch.Options()`` applies ``POPTORCH_CACHE_DIR`` when it is built, so an explicit
        ``enableExecutableCaching(path)`` (or ``(None)``) made afterwards wins over the environment;
        without options the environment decides. ``source`` names the setting in errors (e.g. a
        command-line flag that called ``enableExecutableCaching``)."""
        environment = os.environ.get(ENVIRONMENT_VARIABLE, "")
        if options is None:
            path, default_source = environment, ENVIRONMENT_VARIABLE
            chosen = bool(environment)
        else:
            from .settings import executable_cache_chosen, executable_cache_path
            path = executable_cache_path(options)
            default_source = ENVIRONMENT_VARIABLE if path and path == environment else OPTION
            chosen = executable_cache_chosen(options)
        if path:
            return cls.at(path, source or default_source)
        return None if chosen else cls.default()

    @classmethod
    def default(cls) -> Optional["CompileCache"]:
        """openpop's own cache directory, ``<OPENPOP_CACHE_DIR>/executables``, or None when
        ``OPENPOP_EXECUTABLE_CACHE`` turns it off or it cannot be written (logged once: the user
        did not ask for it, so the run goes on without it)."""
        if not openpop_settings.read("executable_cache"):
            return None
        path = os.path.join(openpop_settings.read("cache_dir"), DEFAULT_SUBDIRECTORY)
        try:
            return cls.at(path, DEFAULT_SOURCE, managed=True)
        except errors.Error:
            if path not in _unusable_defaults:
                _unusable_defaults.add(path)
                logger.warning(messages.CACHE_DEFAULT_UNUSABLE, path)
            return None

    @classmethod
    def at(cls, path: str, source: str = OPTION, managed: bool = False) -> "CompileCache":
        """The cache in ``path``, created if missing; a clear error when it cannot be written."""
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise errors.createPoptorchError(messages.CACHE_PATH.format(source=source, path=path))
        cache = cls(os.path.abspath(os.path.expanduser(os.fspath(path))), source, managed)
        cache._check_writable()
        return cache

    def _check_writable(self) -> None:
        try:
            os.makedirs(self.path, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.path):
                pass
        except OSError as exc:
            raise errors.createPoptorchError(messages.CACHE_NOT_WRITABLE.format(
                source=self.source, path=self.path, reason=exc.strerror or exc)) from None

    @contextlib.contextmanager
    def locked(self, timeout: Optional[float] = None) -> Iterator[bool]:
        """This process alone compiles into the directory until the block ends (module docstring).
        Yields whether the lock is held (False after a timeout)."""
        if timeout is None:
            timeout = openpop_settings.read("cache_lock_timeout")
        with _held_locks_guard:
            held = _held_locks.get(self.path)
            if held is not None:
                held[1] += 1
        if held is not None:
            try:
                yield True
            finally:
                _release(self.path)
            return
        lock_path = os.path.join(self.path, LOCK_FILE)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        if not _acquire(fd, self.path, lock_path, timeout):
            os.close(fd)
            yield False
            return
        with _held_locks_guard:
            _held_locks[self.path] = [fd, 1]
        try:
            yield True
        finally:
            _release(self.path)

    def prune(self, max_bytes: Optional[float] = None) -> int:
        """Delete the least recently used files (by their last access or change) until the
        directory holds at most 80 % of ``max_bytes`` (default ``OPENPOP_EXECUTABLE_CACHE_MAX_MB``),
        when it holds more than ``max_bytes``. Returns the bytes deleted. A file that torch or
        openpop needs again is a cache miss: it is compiled and written again."""
        if max_bytes is None:
            max_bytes = openpop_settings.read("executable_cache_max_mb") * 2**20
        files, total = [], 0
        for root, _, names in os.walk(self.path):
            for name in names:
                if name == LOCK_FILE:
                    continue
                path = os.path.join(root, name)
                try:
                    status = os.stat(path, follow_symlinks=False)
                except OSError:  # deleted meanwhile
                    continue
                files.append((max(status.st_atime, status.st_mtime), status.st_size, path))
                total += status.st_size
        if total <= max_bytes:
            return 0
        deleted = 0
        for _, size, path in sorted(files):
            if total - deleted <= _PRUNED_TO * max_bytes:
                break
            with contextlib.suppress(OSError):
                os.remove(path)
                deleted += size
        logger.info(messages.CACHE_PRUNED, self.path, deleted / 2**20, max_bytes / 2**20,
                    openpop_settings.env("executable_cache_max_mb"))
        return deleted

    @contextlib.contextmanager
    def active(self) -> Iterator["CompileCache"]:
        """torch's on-disk compile caches in this directory until the block ends."""
        from ..torch_compat import clear_inductor_caches as clear_caches
        from ..torch_compat import functorch_config, inductor_config

        previous = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
        moved = previous["TORCHINDUCTOR_CACHE_DIR"] != self.path
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.path
        os.environ["TRITON_CACHE_DIR"] = os.path.join(self.path, "triton")
        if moved:
            clear_caches()  # in-memory caches keyed by the old directory
        try:
            with inductor_config.patch(fx_graph_cache=True), functorch_config.patch(enable_autograd_cache=True), \
                    _isa_probes_remembered(self.path):
                yield self
        finally:
            # Inductor writes TORCHINDUCTOR_CACHE_DIR itself when it resolves its default directory,
            # so "unset before" means unset again now.
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if moved:
                clear_caches()


ISA_PROBES = "openpop-isa-probes-{torch}.txt"


@contextlib.contextmanager
def _isa_probes_remembered(path: str) -> Iterator[None]:
    """Inductor's CPU ISA checks, remembered in the cache directory. Before generating or loading
    CPU kernels, each process builds a test library per vector ISA (AMX, AVX512-VNNI, AVX512,
    AVX2; kept in the cache) and loads each in a fresh Python child process, ten children in all:
    ~1 CPU-s and, on this loaded 2-core machine, 5-10 s of a cached compile's wall time. A library
    (its path in the cache is a hash of its source, flags and compiler) that loaded once loads
    again with the same torch: its path is recorded in ``ISA_PROBES`` and not probed again. The
    ISA still has to be in the CPU's flags (torch checks those first, in-process)."""
    try:
        import torch

        from .. import torch_compat
        VecISA = torch_compat.VecISA
        probe = VecISA.__dict__["_probe_load"]
    except (ImportError, AttributeError, KeyError):  # another torch: its own checks, unremembered
        yield
        return
    record = os.path.join(path, ISA_PROBES.format(torch=torch.__version__.replace("/", "_")))

    def probe_load(isa, output_path):
        try:
            with open(record) as file:
                if output_path in file.read().splitlines():
                    return True
        except OSError:
            pass
        loaded = probe(isa, output_path)
        if loaded:
            with open(record, "a") as file:
                file.write(output_path + "\n")
        return loaded

    VecISA._probe_load = probe_load
    try:
        yield
    finally:
        VecISA._probe_load = probe


_unusable_defaults: set = set()  # default directories already reported unwritable
_held_locks: dict = {}  # cache path -> [file descriptor, depth] of the locks this process holds
_held_locks_guard = threading.Lock()


def _acquire(fd: int, path: str, lock_path: str, timeout: float) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    logger.warning(messages.CACHE_LOCK_WAITING, path, lock_path, timeout)
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(_LOCK_POLL)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        logger.info(messages.CACHE_LOCK_ACQUIRED, path, time.monotonic() - started)
        return True
    logger.warning(messages.CACHE_LOCK_TIMEOUT, path, timeout)
    return False


def _release(path: str) -> None:
    with _held_locks_guard:
        held = _held_locks[path]
        held[1] -= 1
        if held[1]:
            return
        del _held_locks[path]
    fcntl.flock(held[0], fcntl.LOCK_UN)
    os.close(held[0])


@contextlib.contextmanager
def compile_cache_for(options) -> Iterator[Optional[CompileCache]]:
    """``with compile_cache_for(options) as cache:`` compile inside; ``options`` is a
    ``poptorch.Options``, a ``CompileCache`` or None (environment only). Yields None when caching
    is off (torch's default caches stay in use)."""
    cache = options if isinstance(options, CompileCache) else CompileCache.from_options(options)
    if cache is None:
        yield None
        return
    if cache.managed:
        with cache.active():
            yield cache
        cache.prune()
        return
    with cache.locked(), cache.active():
        yield cache


@dataclasses.dataclass
class CompileOutcome:
    """What torch compiled during a ``watch_compiles()`` block, and how long the block took."""

    cache: Optional[CompileCache] = None
    seconds: float = 0.0
    fx_graph_hits: int = 0
    fx_graph_misses: int = 0
    fx_graph_bypasses: int = 0
    autograd_hits: int = 0
    autograd_misses: int = 0
    autograd_bypasses: int = 0
    programs_loaded: int = 0
    programs_saved: int = 0

    @property
    def hits(self) -> int:
        """Inductor graphs loaded from the cache."""
        return self.fx_graph_hits

    @property
    def misses(self) -> int:
        """Inductor graphs generated afresh (the expensive part of a compile)."""
        return self.fx_graph_misses + self.fx_graph_bypasses

    @property
    def compiled_anything(self) -> bool:
        return (self.hits + self.misses + self.autograd_hits + self.autograd_misses + self.autograd_bypasses
                + self.programs_loaded + self.programs_saved > 0)

    @property
    def loaded_from_cache(self) -> bool:
        """Every Inductor graph came from the cache. AOTAutograd may still have re-run for a graph
        it does not save (e.g. an empty graph after a graph break), which costs little. A program
        loaded whole (``compiled/saved_programs.py``) counts as loaded: it holds its graphs."""
        return (self.hits > 0 or self.programs_loaded > 0) and self.misses == 0

    def describe(self) -> str:
        """One log line's worth: fresh compile, load from cache, or nothing compiled."""
        where = f"executable cache {self.cache.path}" if self.cache is not None else "executable cache off"
        counts = (f"FX graphs: {self.fx_graph_hits} from cache, {self.fx_graph_misses} compiled"
                  + (f", {self.fx_graph_bypasses} not cacheable" if self.fx_graph_bypasses else "")
                  + f"; AOTAutograd: {self.autograd_hits} from cache, {self.autograd_misses} compiled"
                  + (f", {self.autograd_bypasses} not cacheable" if self.autograd_bypasses else "")
                  + (f"; programs: {self.programs_loaded} loaded whole (no trace)" if self.programs_loaded else "")
                  + (f"; programs: {self.programs_saved} saved whole" if self.programs_saved else ""))
        if not self.compiled_anything:
            return f"nothing compiled by torch.compile; {where}"
        if self.loaded_from_cache:
            return f"loaded from cache ({counts}); {where}"
        if self.hits or self.programs_loaded:
            return f"partly loaded from cache ({counts}); {where}"
        return f"compiled fresh ({counts}); {where}"

    def as_dict(self) -> dict:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cache"}
        return dict(fields, cache=None if self.cache is None else self.cache.path,
                    loaded_from_cache=self.loaded_from_cache)


def _counter_values() -> dict:
    from .. import torch_compat
    if not torch_compat.dynamo_loaded():
        return dict.fromkeys(_COUNTERS, 0)  # nothing compiled yet; importing Dynamo would cost seconds
    counters = torch_compat.dynamo_counters
    return {name: counters[group][key] for name, (group, key) in _COUNTERS.items()}


@contextlib.contextmanager
def watch_compiles(cache: Optional[CompileCache] = None) -> Iterator[CompileOutcome]:
    """``with watch_compiles(cache) as outcome:`` — ``outcome`` is filled in when the block ends."""
    outcome = CompileOutcome(cache=cache)
    before = _counter_values()
    started = time.perf_counter()
    try:
        yield outcome
    finally:
        outcome.seconds = time.perf_counter() - started
        for name, value in _counter_values().items():
            setattr(outcome, name, value - before[name])
