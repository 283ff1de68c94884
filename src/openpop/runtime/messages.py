"""The texts of the runtime's own (openpop-specific) errors and warnings. PopTorch's texts, and
those of the executor's PopTorch API, are in ``openpop/errors.py``."""

# --- anchors --------------------------------------------------------------------
ANCHOR_PERIOD = "anchorTensor('{name}'): OutputMode.EveryN needs output_return_period >= 1, got {period}."
ANCHOR_NOT_FOUND = ("anchorTensor: no tensor named '{name}'. openpop anchors parameters and buffers by "
                    "their names ({known}){hint}.")
ANCHOR_HINT_TRAINING = ", as 'Gradient___<name>' and 'UpdatedVar___<name>' in training models"
ANCHOR_HINT_INFERENCE = "; gradients exist in training models only"

# --- executable cache -----------------------------------------------------------
CACHE_PATH = "{source}: the executable cache path must be a non-empty directory path, got {path!r}."
CACHE_NOT_WRITABLE = ("{source}: cannot use {path} as the executable cache directory ({reason}). Pass a "
                      "writable directory to {source}, or unset it to compile without a cache.")
CACHE_LOCK_WAITING = ("Executable cache %s: another process is compiling into it (lock %s held); waiting up to "
                      "%.0f s to load what it compiles")
CACHE_DEFAULT_UNUSABLE = ("Executable cache: cannot write the default directory %s; compiling without a cache "
                          "(set OPENPOP_CACHE_DIR to a writable directory, or OPENPOP_EXECUTABLE_CACHE=0)")
CACHE_PRUNED = ("Executable cache %s: deleted the least recently used %.0f MiB to stay under its %.0f MiB cap "
                "(%s)")
CACHE_LOCK_ACQUIRED = "Executable cache %s: lock acquired after %.1f s of waiting"
CACHE_LOCK_TIMEOUT = ("Executable cache %s: still locked after %.0f s; compiling without the lock (set "
                      "OPENPOP_CACHE_LOCK_TIMEOUT to wait longer)")

# --- compiled backend -----------------------------------------------------------
REGIONS_CONCURRENT = ("pipelined stages that run concurrently with the compiled unit 'regions', which runs "
                      "micro-batches one after another (use unit='program' or 'auto')")
UNIT_REMEMBERED = "openpop compiled backend: unit %r (chosen before for this model, executable cache %s)"
UNIT_CHOSEN = "openpop compiled backend: unit %r (the probe micro-batch does %.3g FLOPs per aten op)"
UNIT_NOT_PROGRAM = "openpop compiled backend: unit 'regions' (the compiled backend does not support %s)"
HOST_CALLS_RUN_ON = "openpop host calls run on the %s backend (%s)"
COMPILED_FORCED = ("Options.openpopBackend('compiled') cannot run this model: {reason}. "
                   "Use openpopBackend('auto') or 'eager' to run it eagerly.")
AUTO_STAYS_EAGER = ("openpop auto backend: this model stays eager (%s; Options.openpopBackend('compiled') "
                    "compiles it anyway)")
AUTO_CONVOLUTION_BOUND = ("convolutions do {share:.0%} of its FLOPs at {per_op:.3g} FLOPs per aten op: compiled, "
                          "it calls the same convolution kernels and the host's share of a step is small")
AUTO_COMPILES = ("openpop auto backend: compiling this model now: its eager host calls took %.1f s, the "
                 "estimated compile time (%.1f s, %s)")
# One line before a compile bar that appears mid-run (the bar alone says nothing of why)
AUTO_COMPILES_NOW = ("the auto backend compiles this model now: its eager host calls took {eager:.1f} s, as long "
                     "as compiling is estimated to take ({basis}); Options.openpopBackend('eager') or "
                     "OPENPOP_BACKEND=eager keeps it eager")
NEW_PROGRAM_OPTIMIZER = ("the optimizer changed (setOptimizer with other parameter groups or settings the "
                         "program holds): the compiled program is built again for it")
INELIGIBLE_REGION_HOOKS = ("a forward hook added or removed after the regions were compiled (torch.compile does "
                           "not guard module hooks: the regions would keep the hooks they traced)")
NEW_PROGRAM_HOOKS = "a forward hook was added or removed since the model was traced: it is traced again"
NEW_PROGRAM_MODEL = "the model was compiled again (new inputs or options): so is its program"
NEW_PROGRAM_RETRACED = ("a Python value the model reads changed (torch.compile traces it again): the program is "
                        "built again for the new trace")
AUTO_ESTIMATE = "{ops} aten ops per micro-batch x {unrolled} unrolled, {tensors} trained tensors{warm}"
AUTO_ESTIMATE_REGIONS = "{ops} distinct aten ops per micro-batch in {regions} distinct compiled regions{warm}"
COMPILED_DECLINED = "openpop runs this model eagerly: the compiled backend does not support %s"
# Why the compiled backend declines a model (the {reason} above)
REGIONS_SATURATION = ("the compiled unit 'regions' for a model computing in float16, whose overflow saturates "
                      "(eager's saturating mode would run the regions eagerly): use unit='program' or 'auto', "
                      "or OPENPOP_HALF_OVERFLOW=inf")
REGIONS_NONE = ("a model without regions to compile: no module with parameters whose forward the model calls "
                "(use unit='program')")
INELIGIBLE_REGIONS = "what torch.compile of its regions rejects: {error}"
PROGRAM_PROCESSES_CUDA = ("the unit 'program' on CUDA with replicas in several processes (popdist): its "
                          "all-reduce between the processes inside CUDA graphs is not supported yet (unit='regions' "
                          "runs the model compiled, with the all-reduce between its compiled regions)")
INELIGIBLE_FULLGRAPH = "what torch.compile(fullgraph=True) rejects: {error}"
INELIGIBLE_PROBE = "a model whose probe micro-batch fails ({error})"
INELIGIBLE_RECOMPILES = ("Python values the model reads that change between host calls (torch.compile re-traced "
                         "the program until its recompile limit): {error}")
INELIGIBLE_ROUNDING_SKIPPED_STEPS = ("Precision.enableStochasticRounding of float16 or bfloat16 weights with automatic "
                                    "loss scaling in a PopART graph over several device iterations (a step it skips "
                                    "draws no rounding numbers)")
INELIGIBLE_INPUTS = "inputs that are neither tensors nor None, bool, int, float or str constants"
INELIGIBLE_HOST_IO = "{host_io} (host I/O inside the model)"
INELIGIBLE_CUMULATIVE_AVERAGE = ("{module} with momentum=None (its cumulative average reads the batch count "
                                 "as a Python number)")
INELIGIBLE_OUTPUTS = "outputs that are not tensors"
INELIGIBLE_INPUT_MUTATED = "input {name} changed in place by the forward pass"
INELIGIBLE_ATTRIBUTE_REPLACED = ("attribute {name}, a tensor the forward pass replaces with another (register it "
                                 "with register_buffer(..., persistent=False) to have the program carry it)")
EAGER_SAVED_TENSOR_HOOKS = ("openpop runs host calls made inside torch.autograd.graph.saved_tensors_hooks "
                            "eagerly: a compiled program has no saved tensors for the hooks to see")
INELIGIBLE_ALL_FROZEN = "an optimizer whose parameters all have requires_grad=False (nothing to train)"
INELIGIBLE_HOOKS = "module hooks ({kind} on {module}: a compiled program computes gradients without autograd's hooks)"
INELIGIBLE_ANCHORED_GRADIENT = "an anchored gradient of {name}, which the optimizer does not update"
INELIGIBLE_ANCHORED_BUFFER = "buffer {name}, updated by the forward pass, anchored in a mode other than Final"
INELIGIBLE_STAGE_DEVICES = ("pipeline stages on several devices (the device map puts the blocks on {devices}; "
                            "a compiled program runs a plan whose virtual IPUs all map onto one device)")
INELIGIBLE_CONCURRENT_STAGES = "pipeline stages run by concurrent micro-batch threads ({env}=on)"

# --- devices --------------------------------------------------------------------
NOT_A_DEVICE = "{source} names '{name}', which is not a torch device ({error}). Use names like 'cpu', 'cuda:0'."
NO_SUCH_CUDA_DEVICE = ("{source} names '{name}' but this machine has {count} CUDA device(s). Name an existing "
                       "device or unset {env}.")
DEVICE_TYPE = "{source} names '{name}': openpop runs virtual IPUs on 'cpu' and 'cuda' devices only."

# --- several processes ----------------------------------------------------------
NOT_LAUNCHED = ("Options.Distributed.numProcesses is {n} but this process was not started by "
                "poprun (or torchrun): launch it with `poprun --num-instances {n} ...`, "
                "or call Options.Distributed.disable() to train in this process alone.")
RANK_MISMATCH = ("Options.Distributed says process {process_id} of {n} but torch.distributed "
                 "says rank {rank} of {world_size}: use popdist.poptorch.Options() "
                 "(or leave Options.Distributed to read poprun's environment).")
MODELS_DIFFER = ("Instance {process}'s model differs from instance 0's: {difference}. Every "
                 "instance must build the same model (same parameters and buffers, same shapes).")
COLLECTIVE_FAILED = ("{what} across the {n} poprun instances failed on instance {process_id} (timeout "
                     "{timeout:g} s): another instance is stuck or has stopped. Set OPENPOP_COLLECTIVE_TIMEOUT "
                     "or poprun --collective-timeout to change the timeout. ({error})")
COLLECTIVE_PEER_GONE = ("{what} across the {n} poprun instances failed on instance {process_id}: another "
                        "instance stopped during it (its connection closed); poprun's log names the instance "
                        "that failed first. ({error})")

# --- POPLAR_ENGINE_OPTIONS ------------------------------------------------------
ENGINE_OPTIONS_JSON = ("{source} is not valid JSON ({error} at character {pos}): {text!r}. "
                       "Expected e.g. '{{\"autoReport.all\":\"true\",\"autoReport.directory\":\"./report\"}}'.")
ENGINE_OPTIONS_OBJECT = "{source} must be a JSON object, got {type}: {text!r}"
ENGINE_OPTION_UNKNOWN = "%s: unknown option %r is ignored (known: %s)"
ENGINE_OPTION_COUNT = "{key} must be a non-negative integer, got {value!r}"
ENGINE_OPTION_DIRECTORY = ("{key} must be a directory path (a string), got {value!r}: e.g. "
                           "'{{\"autoReport.all\":\"true\",\"autoReport.directory\":\"./report\"}}'")

# --- half compute ---------------------------------------------------------------
HALF_COMPUTE_ENV = "{env}={value!r} is not valid: set it to auto, native or float32 (or unset it for auto)."
HALF_OVERFLOW_SEEN = ("float16 overflow: this model's float16 results saturate at +-65504 from this host call on, as "
                      "on the IPU (the call runs again; OPENPOP_HALF_OVERFLOW=inf keeps IEEE overflow)")
HALF_OVERFLOW_ENV = "{env}={value!r} is not valid: set it to saturate or inf (or unset it for saturate)."
HALF_COMPUTE_SETTING = "half compute setting must be one of {settings}, not {setting!r}"
CPU_GEMM_ENV = "{env}={value!r} is not valid: set it to auto, onednn or aten (or unset it for auto)."
CPU_GEMM_CHOICE = ("compiled float32 GEMMs on this CPU: aten {aten:.0f} vs oneDNN {onednn:.0f} GFLOP/s -> {choice} "
                   "({env}=onednn|aten overrides)")
GENERATOR_STATE_BYTES = ("a CPU generator state of {size} bytes, not at least {expected}: not the layout the dropout "
                         "mask kernel reads (aten's bernoulli_ stays)")
UNKNOWN_PASS = ("{env}={value!r} names {unknown}, not an openpop pass: set it to a comma-separated list of "
                "{known} (or unset it)")
CPU_GEMM_NO_ONEDNN = "{env}=onednn: this torch has no oneDNN (torch.backends.mkldnn); compiled GEMMs stay aten's"
HOST_MEMORY_ENV = "{env}={value!r} is not valid: set it to auto, retain or release (or unset it for auto)."
HOST_MEMORY_RETAINED = ("host memory: freed memory stays in the process (glibc {version}: mallopt M_MMAP_MAX 0, "
                        "M_TRIM_THRESHOLD max); {env}=release keeps glibc's defaults")
HOST_MEMORY_SYSTEM = "host memory: the C library's defaults ({reason})"
HOST_MEMORY_TOO_LATE = ("{env}=release comes too late: an earlier model in this process already kept "
                        "freed host memory (set it before the first one)")

# --- floating point exceptions --------------------------------------------------
FP_EXCEPTION_FORWARD = ("Floating point exception in the forward pass: {where} {problem}. "
                        "Options.Precision.enableFloatingPointExceptions(True) is set.")
FP_EXCEPTION_BACKWARD = ("Floating point exception in the backward pass: {node}, the gradient of {where}, "
                         "{problem}. Options.Precision.enableFloatingPointExceptions(True) is set.")

# --- saved executables ----------------------------------------------------------
SAVED_UNREADABLE = "{filename} is not a file saved by poptorch: {error}"
SAVED_FOREIGN = "{filename} is not a file saved by openpop's PoplarExecutor.save()."
SAVED_VERSION = ("PopTorch version mismatch: {filename} was saved by {saved} and this is "
                 "{current}. Save it again with this version.")
SAVED_KIND = "{filename} holds a {kind} model: load it into a matching poptorch model."

# --- profile report -------------------------------------------------------------
REPORT_NOT_WRITABLE = ("The profile report directory {directory!r} is not writable ({reason}): "
                       "choose another autoReport.directory.")
REPORT_WRITE_FAILED = "openpop could not write the profile report to %s: %s"
REPORT_WRITTEN = "openpop profile report: {path} (openpop-report DIR for a summary)"
TRACE_WINDOW_HANDED_OVER = ("openpop profile: %s ends its window early (it writes what it recorded): %s needs "
                            "torch.profiler, and torch runs one profiler per process")
TRACE_WITHOUT_OPERATORS = "openpop profile: %s has host-call timings but no operator events: %s"
TRACE_FOREIGN_PROFILER = ("a torch.profiler that openpop did not start was already running; stop it before the "
                          "recorded host calls, or profile with openpop's report alone")
TRACE_TAKEN_OVER = ("another torch.profiler started while openpop's ran and took its events; torch runs one "
                    "profiler per process")
TRACE_NO_MEMORY_EVENTS = ("no memory events: micro-batches ran concurrently on several threads, and torch's "
                          "profiler records memory events only when it records the calling thread alone")
NOT_A_PROFILE = "{directory!r} is not an openpop profile directory: {path} not found"

# --- interrupts -----------------------------------------------------------------
INTERRUPTED_AFTER_UPDATE = ("interrupted while the host call applied its last optimizer update: the "
                            "call completed, its updates are applied")

# --- buffers as device state (buffer_state.py) ------------------------------------
BUFFER_RESHAPED = (
    "Buffer {name} is reassigned within the model when calling the forward method with a tensor of shape "
    "{shape} and dtype {dtype}; it was {old_shape}, {old_dtype}. A buffer is device state that keeps its shape "
    "and dtype between micro-batches: assign a tensor of the same shape and dtype (or use "
    "self.{name}.copy_(src)), or register a new buffer of the new shape in __init__.")

# Whole programs saved in the executable cache (runtime/compiled/saved_programs.py)
SHAPES_ONLY_FAILED = "The probe micro-batch does not run on fake tensors (%s): it runs for real"
SAVED_PROGRAM_LOADED = "Compiled program loaded from %s (no trace)"
SAVED_PROGRAM_UNUSABLE = "Saved program %s not used (%s): compiling it as usual"
SAVED_PROGRAM_NOT_SAVED = "Program not saved to %s (%s): compiled as usual"
SAVED_PROGRAM_UNNAMED_GUARD = ("torch guards that {name} has no instance attribute shadowing its class's, without "
                               "naming the attribute: the program is not saved")
SAVED_PROGRAM_SLOTS_CHANGED = ("a Python value the saved program {path} was compiled with changed, and a program "
                               "whose forward assigns its modules' tensors is not traced again")
SAVED_PROGRAM_CHANGED = ("A Python value the saved program %s was compiled with changed (or a tensor argument's "
                         "shape, dtype or torch's global state): compiling it as usual")
SAVED_PROGRAM_VALUES = "Python values it was compiled with differ from this process's: {differences}"
