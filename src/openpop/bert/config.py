"""Configuration of openpop-bert: named configs from ``configs.yml``, command-line flags that
mirror every key, and the validation the recipe applies.

    config = parse_args(["--config", "demo_tiny_128", "--training-steps", "5"])
    config.samples_per_step, config.layer_ipus, config.bert_config()

``--config NAME`` picks a named config (default ``demo_tiny_128``, as the recipe); every other
flag overrides one of its keys. Bad values raise ``ConfigError`` (the command line turns it
into a usage error) before anything is built.
"""
import argparse
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import yaml

from . import messages

CONFIG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs.yml")
DEFAULT_CONFIG = "demo_tiny_128"
PROG = "openpop-bert"
USAGE = "openpop-bert [-h] [--config NAME] [--list-configs] [--FLAG VALUE ...]"

OPTIMIZERS = ("AdamW", "LAMB", "LAMBNoBiasCorrection")
LR_SCHEDULES = ("constant", "linear")
DATASETS = ("generated", "pretraining")
PRECISIONS = ("auto", "fp32", "bf16")
MAX_POSITION_EMBEDDINGS = 512


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the fix."""


def str_to_bool(value) -> bool:
    """``True``/``False`` from the usual spellings (the recipe's bool flags take a value or none)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "t", "yes", "y", "1", "on"):
        return True
    if text in ("false", "f", "no", "n", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(messages.BOOLEAN_VALUE.format(value=value))


def _optional_str(value):
    return None if value is None or str(value).lower() in ("", "none", "null") else str(value)


def _dict_arg(value):
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(messages.JSON_OBJECT_VALUE.format(value=value)) from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(messages.JSON_OBJECT_VALUE.format(value=value))
    return parsed


@dataclass(frozen=True)
class Key:
    """One configuration key: its type, default, and how its flag parses."""
    name: str
    type: Callable
    default: Any
    help: str
    choices: Optional[tuple] = None
    nargs: Optional[str] = None   # "+" for lists
    flag_only: bool = False       # run-time switches that configs.yml does not set

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_KEYS: list[Key] = [
    # model
    Key("vocab_size", int, 30522, "Vocabulary size of the model (and of a tokenizer trained for it)"),
    Key("hidden_size", int, 768, "Width of the encoder"),
    Key("num_hidden_layers", int, 12, "Number of encoder layers"),
    Key("num_attention_heads", int, 12, "Attention heads per layer"),
    Key("layer_norm_eps", float, 0.001, "LayerNorm epsilon"),
    Key("attention_probs_dropout_prob", float, 0.0, "Dropout on attention probabilities"),
    Key("hidden_dropout_prob", float, 0.1, "Dropout on hidden states"),
    Key("sequence_length", int, 128, "Tokens per sequence"),
    Key("mask_tokens", int, 20, "Masked (predicted) tokens per sequence"),
    Key("embedding_serialization_factor", int, 1,
        "Split the MLM decoder matmul into this many serialized parts (must divide vocab_size)"),
    Key("recompute_checkpoint_every_layer", str_to_bool, True,
        "Mark each encoder layer's output as a recomputation checkpoint"),
    Key("precision", str, "auto", "openpop: fp32, bf16 autocast (the recipe ran in float16 on IPUs), or auto: "
        "bf16 where its matmuls beat fp32 ones on this machine, else fp32", choices=PRECISIONS),
    # batch and execution
    Key("micro_batch_size", int, 1, "Samples per micro-batch"),
    Key("device_iterations", int, 1, "Optimizer steps per host call"),
    Key("replication_factor", int, 1, "Data-parallel replicas"),
    Key("gradient_accumulation", int, 1, "Micro-batches accumulated per optimizer step and replica"),
    Key("training_steps", int, 10, "Number of host calls (training steps) to run"),
    Key("ipus_per_replica", int, 4, "Virtual IPUs one replica of the model is split over"),
    Key("layers_per_ipu", int, [0, 4, 4, 4], "Encoder layers on each IPU (one value N means N on every IPU)",
        nargs="+"),
    Key("matmul_proportion", float, [0.6], "Available memory proportion for matmuls, per IPU or one for all",
        nargs="+"),
    Key("random_seed", int, 5, "Seed of every random number generator"),
    Key("replicated_tensor_sharding", str_to_bool, False, "IPU memory option (no effect on openpop)"),
    Key("optimizer_state_offchip", str_to_bool, True, "IPU memory option (no effect on openpop)"),
    Key("enable_half_partials", str_to_bool, True, "IPU precision option (no effect on openpop)"),
    Key("custom_ops", str_to_bool, True, "Load the recipe's custom ops (no effect on openpop: none are needed)"),
    Key("synthetic_data", str_to_bool, False, "IPU host-I/O option (no effect on openpop: data always "
        "comes from the host)"),
    Key("executable_cache_dir", _optional_str, None, "Executable cache: torch's on-disk compile caches "
        "(Inductor FX graphs, AOTAutograd) live here, so a second run loads compiled graphs instead of "
        "compiling them; created if missing, checked before anything runs", flag_only=True),
    Key("profile_dir", _optional_str, None, "Profile directory: a torch.profiler trace, report.json and "
        "report.html of the first 2 host calls (python -m openpop.report DIR summarises it)", flag_only=True),
    Key("compile_only", str_to_bool, False, "Compile, then exit without training", flag_only=True),
    Key("backend", _optional_str, None, "openpop: the runtime's backend (Options.openpopBackend). Default: "
        "$OPENPOP_BACKEND, else auto (eager until the eager steps have cost the estimated compile, then "
        "compiled; the main job's 150 demo steps stay eager)",
        choices=("auto", "eager", "compiled"), flag_only=True),
    Key("recomputation", str_to_bool, False,
        "openpop: recompute each block's activations in the backward pass (saves memory, costs a forward "
        "pass; IPUs needed it, CPUs/GPUs rarely do)"),
    Key("threads", int, None, "openpop: torch intra-op threads (default: torch's choice)"),
    # optimizer
    Key("optimizer", str, "AdamW", "Optimizer", choices=OPTIMIZERS),
    Key("learning_rate", float, 0.001, "Peak learning rate"),
    Key("lr_schedule", str, "constant", "Learning-rate schedule after the warm-up", choices=LR_SCHEDULES),
    Key("lr_warmup", float, 0.0, "Fraction of training_steps spent warming the learning rate up"),
    Key("loss_scaling", float, 1.0, "Loss scaling factor"),
    Key("auto_loss_scaling", str_to_bool, False, "Automatic loss scaling"),
    Key("weight_decay", float, 0.0, "Weight decay of the weight matrices (not biases or norms)"),
    Key("enable_half_first_order_momentum", str_to_bool, False, "Keep the first-order momentum in float16"),
    # data
    Key("dataset", str, "pretraining", "generated: one random sample repeated; pretraining: real text",
        choices=DATASETS),
    Key("input_files", str, ["stdlib"],
        "Plain-text files (globs allowed); 'stdlib' is the docstrings of Python's standard library",
        nargs="+"),
    Key("vocab_file", _optional_str, None, "openpop: WordPiece vocab.txt to use instead of training one"),
    Key("duplication_factor", int, 5, "openpop: times each document is masked differently"),
    Key("data_cache_dir", _optional_str, None,
        "openpop: cache of corpus, tokenizer and examples (default $OPENPOP_CACHE_DIR/bert or "
        "~/.cache/openpop/bert)"),
    Key("dataloader_workers", int, 64, "Worker processes of the data loader (capped at the CPU count)"),
    Key("async_dataloader", str_to_bool, True, "Load data in a separate process"),
    Key("packed_data", str_to_bool, False, "Packed sequences (needs packed input files)"),
    Key("max_sequences_per_pack", int, 3, "Sequences per pack", choices=(2, 3)),
    Key("packing_factor", _dict_arg, {128: 1.17, 384: 1.7, 512: 2.0}, "Packing factor per sequence length"),
    # checkpoints
    Key("checkpoint_output_dir", _optional_str, None, "Directory to save checkpoints to", flag_only=True),
    Key("checkpoint_steps", int, None, "Save a checkpoint every N steps (and at the end)", flag_only=True),
    Key("checkpoint_input_dir", _optional_str, None,
        "Checkpoint to start from: a step_N.pt file or a directory of them (the latest is used)",
        flag_only=True),
    Key("resume_training_from_checkpoint", str_to_bool, False,
        "Restore the training state (optimizer, schedule, step, data position, RNG) as well as the weights",
        flag_only=True),
    # output
    Key("disable_progress_bar", str_to_bool, None,
        "Plain log lines instead of a progress bar (default: plain lines when stderr is not a terminal)",
        flag_only=True),
    Key("wandb", str_to_bool, False, "Log to Weights & Biases (no effect on openpop: not available offline)",
        flag_only=True),
    Key("wandb_param_steps", int, None, "Steps between parameter histograms in wandb (no effect on openpop)",
        flag_only=True),
]
KEYS: dict[str, Key] = {k.name: k for k in _KEYS}


# --------------------------------------------------------------------------- named configs
def load_config_file(path: str = CONFIG_FILE) -> dict[str, dict[str, Any]]:
    with open(path, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    return {name: values for name, values in data.items() if name != "defaults"}


def available_configs(path: str = CONFIG_FILE) -> list[str]:
    return list(load_config_file(path))


def named_config(name: str, path: str = CONFIG_FILE) -> dict[str, Any]:
    configs = load_config_file(path)
    if name not in configs:
        raise ConfigError(messages.UNKNOWN_CONFIG.format(name=name, configs=', '.join(configs), path=path))
    values = dict(configs[name])
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ConfigError(messages.CONFIG_UNKNOWN_KEYS.format(name=name, path=path, unknown=', '.join(unknown)))
    return values


# --------------------------------------------------------------------------- the config object
class BertRunConfig:
    """Every key as an attribute, plus the quantities derived from them."""

    def __init__(self, name: str = DEFAULT_CONFIG, **values):
        self.config = name
        for key in _KEYS:
            setattr(self, key.name, values.pop(key.name, _copy_default(key.default)))
        if values:
            raise ConfigError(messages.UNKNOWN_KEYS.format(unknown=', '.join(sorted(values))))

    # derived ---------------------------------------------------------------------------------
    @property
    def intermediate_size(self) -> int:
        return 4 * self.hidden_size

    @property
    def samples_per_step(self) -> int:
        """Samples one host call consumes."""
        return self.replication_factor * self.gradient_accumulation * self.micro_batch_size * self.device_iterations

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step."""
        return self.replication_factor * self.gradient_accumulation * self.micro_batch_size

    @property
    def layer_ipus(self) -> list[int]:
        """The IPU of each encoder layer, from ``layers_per_ipu``."""
        ipus = []
        for ipu, count in enumerate(self.layers_per_ipu):
            ipus.extend([ipu] * count)
        return ipus

    def as_dict(self) -> dict[str, Any]:
        return {key.name: getattr(self, key.name) for key in _KEYS}

    def model_dict(self) -> dict[str, Any]:
        """The keys that define the model's shape (must match to load a checkpoint)."""
        names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "sequence_length",
                 "mask_tokens", "embedding_serialization_factor")
        return {n: getattr(self, n) for n in names}

    def bert_config(self):
        """A ``transformers.BertConfig`` for this run (built locally, nothing is downloaded)."""
        from transformers import BertConfig
        return BertConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
            hidden_act="gelu", hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=MAX_POSITION_EMBEDDINGS, type_vocab_size=2, layer_norm_eps=self.layer_norm_eps,
            pad_token_id=0)

    def replace(self, **changes) -> "BertRunConfig":
        values = self.as_dict()
        values.update(changes)
        config = BertRunConfig(self.config, **values)
        validate(config)
        return config

    def __repr__(self):
        return f"BertRunConfig({self.config!r}, {self.as_dict()!r})"


def _copy_default(value):
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


# --------------------------------------------------------------------------- validation
def validate(config: BertRunConfig) -> BertRunConfig:
    """Normalise list-valued keys and check the configuration; raise ``ConfigError``."""
    _coerce_numbers(config)

    def positive(*names):
        for name in names:
            value = getattr(config, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(messages.NOT_POSITIVE_INTEGER.format(flag=KEYS[name].flag, value=value))

    positive("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "sequence_length",
             "mask_tokens", "micro_batch_size", "device_iterations", "replication_factor",
             "gradient_accumulation", "training_steps", "ipus_per_replica", "embedding_serialization_factor",
             "duplication_factor")
    for key in _KEYS:
        value = getattr(config, key.name)
        optional_and_unset = value is None and key.default is None
        if key.choices is not None and value not in key.choices and not optional_and_unset:
            raise ConfigError(messages.NOT_ONE_OF.format(
                name=key.name, choices=', '.join(map(str, key.choices)), value=value))

    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(messages.HIDDEN_SIZE_HEADS.format(
            hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads))
    if config.sequence_length > MAX_POSITION_EMBEDDINGS:
        raise ConfigError(messages.SEQUENCE_LENGTH_POSITIONS.format(
            sequence_length=config.sequence_length, max_position_embeddings=MAX_POSITION_EMBEDDINGS))
    if config.mask_tokens > config.sequence_length:
        raise ConfigError(messages.MASK_TOKENS_SEQUENCE_LENGTH.format(
            mask_tokens=config.mask_tokens, sequence_length=config.sequence_length))
    if config.vocab_size % config.embedding_serialization_factor:
        raise ConfigError(messages.EMBEDDING_SERIALIZATION.format(
            embedding_serialization_factor=config.embedding_serialization_factor, vocab_size=config.vocab_size))

    # layers_per_ipu: one value N means N layers on each IPU, as the recipe expands it.
    layers = config.layers_per_ipu
    if isinstance(layers, int):
        layers = [layers]
    layers = list(layers)
    if any(not isinstance(n, int) or n < 0 for n in layers):
        raise ConfigError(messages.LAYERS_PER_IPU_NEGATIVE.format(layers=layers))
    if len(layers) == 1:
        if layers[0] == 0:
            raise ConfigError(messages.LAYERS_PER_IPU_ZERO)
        layers = [layers[0]] * (config.num_hidden_layers // layers[0])
    if sum(layers) != config.num_hidden_layers:
        raise ConfigError(
            messages.LAYERS_PER_IPU_TOTAL.format(
                layers=layers, total=sum(layers), num_hidden_layers=config.num_hidden_layers))
    if len(layers) != config.ipus_per_replica:
        raise ConfigError(
            messages.LAYERS_PER_IPU_IPUS.format(
                layers=layers, layers_count=len(layers), plural="" if len(layers) == 1 else "s",
                ipus_per_replica=config.ipus_per_replica))
    config.layers_per_ipu = layers
    _check_pipeline_depth(config)

    proportions = config.matmul_proportion
    if isinstance(proportions, (int, float)):
        proportions = [proportions]
    proportions = [float(p) for p in proportions]
    if len(proportions) == 1:
        proportions = proportions * config.ipus_per_replica
    if len(proportions) != config.ipus_per_replica:
        raise ConfigError(messages.MATMUL_PROPORTION_LENGTH.format(
            proportions=proportions, ipus_per_replica=config.ipus_per_replica))
    if any(not 0.0 <= p <= 1.0 for p in proportions):
        raise ConfigError(messages.MATMUL_PROPORTION_RANGE.format(proportions=proportions))
    config.matmul_proportion = proportions

    _check_numbers(config)
    if isinstance(config.input_files, str):
        config.input_files = [config.input_files]
    if config.checkpoint_steps is not None and not config.checkpoint_output_dir:
        raise ConfigError(messages.CHECKPOINT_STEPS_WITHOUT_OUTPUT)
    if config.resume_training_from_checkpoint and not (config.checkpoint_input_dir or config.checkpoint_output_dir):
        raise ConfigError(messages.RESUME_WITHOUT_CHECKPOINT)
    if config.packed_data:
        raise ConfigError(messages.PACKED_DATA)
    if config.dataset == "pretraining" and config.mask_tokens > config.sequence_length - 3:
        raise ConfigError(messages.MASK_TOKENS_PRETRAINING.format(
            mask_tokens=config.mask_tokens, sequence_length=config.sequence_length))
    _check_output_directory(config.checkpoint_output_dir)
    return config


def pipeline_stages(config: BertRunConfig) -> int:
    """Forward stages of the pipelined model (``model.parallelize``): a new stage wherever the next
    block runs on another IPU, in execution order: embedding on IPU 0, the encoder layers on
    ``layers_per_ipu``'s IPUs, pooler and classifier back on IPU 0."""
    ipus = [0, *config.layer_ipus, 0, 0]
    return 1 + sum(a != b for a, b in zip(ipus, ipus[1:]))


def _check_pipeline_depth(config: BertRunConfig) -> None:
    """PopTorch's rule for training a pipeline (runtime/plan.py): gradient accumulation of at least
    2 x stages - 1 micro-batches, checked here so that the flag is named before any data loads."""
    stages = pipeline_stages(config)
    needed = 2 * stages - 1
    if stages > 1 and config.gradient_accumulation < needed:
        raise ConfigError(messages.PIPELINE_GRADIENT_ACCUMULATION.format(
            gradient_accumulation=config.gradient_accumulation, layers=" ".join(map(str, config.layers_per_ipu)),
            stages=stages, needed=needed))


def _finite_at_least(low):
    return lambda v: math.isfinite(v) and v >= low


def _finite_above(low):
    return lambda v: math.isfinite(v) and v > low


def _integer_at_least(low, optional=False):
    return lambda v: (optional and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)


# Numeric keys beyond the positive integers: (test, what the value must be). NaN fails every test.
_NUMBER_RULES = {
    "learning_rate": (_finite_at_least(0.0), "a finite number >= 0"),
    "weight_decay": (_finite_at_least(0.0), "a finite number >= 0"),
    "loss_scaling": (_finite_above(0.0), "a finite number > 0"),
    "layer_norm_eps": (_finite_above(0.0), "a finite number > 0"),
    "lr_warmup": (lambda v: 0.0 <= v <= 1.0, "a fraction of training_steps in [0, 1]"),
    "hidden_dropout_prob": (lambda v: 0.0 <= v < 1.0, "a probability in [0, 1)"),
    "attention_probs_dropout_prob": (lambda v: 0.0 <= v < 1.0, "a probability in [0, 1)"),
    "threads": (_integer_at_least(1, optional=True), "a positive integer"),
    "dataloader_workers": (_integer_at_least(0), "an integer >= 0"),
    "checkpoint_steps": (_integer_at_least(1, optional=True), "a positive integer"),
    "wandb_param_steps": (_integer_at_least(1, optional=True), "a positive integer"),
}


def _coerce_numbers(config: BertRunConfig) -> None:
    """Scalar number keys from configs.yml or Python callers: ``1e-3`` (which YAML reads as a string)
    becomes 0.001, an int where a float is expected becomes a float; anything else is an error."""
    for key in _KEYS:
        value = getattr(config, key.name)
        if key.nargs or key.type not in (int, float) or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(messages.NOT_A_NUMBER.format(flag=key.flag, value=value))
        if key.type is float and not isinstance(value, float):
            try:
                setattr(config, key.name, float(value))
            except ValueError:
                raise ConfigError(messages.NOT_A_NUMBER.format(flag=key.flag, value=value)) from None
        elif key.type is int and isinstance(value, str):
            try:
                setattr(config, key.name, int(value))
            except ValueError:
                raise ConfigError(messages.NOT_AN_INTEGER.format(flag=key.flag, value=value)) from None


def _check_numbers(config: BertRunConfig) -> None:
    for name, (test, requirement) in _NUMBER_RULES.items():
        value = getattr(config, name)
        if not test(value):
            raise ConfigError(messages.NOT_REQUIREMENT.format(
                flag=KEYS[name].flag, requirement=requirement, value=value))


def _check_output_directory(directory) -> None:
    """Fail before training, not at the first checkpoint, if checkpoints cannot be written."""
    if not directory:
        return
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(messages.CHECKPOINT_OUTPUT_NOT_DIRECTORY.format(directory=directory))
    existing = directory
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing.rstrip(os.sep)) or "."
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(messages.CHECKPOINT_OUTPUT_NOT_WRITABLE.format(directory=directory))


# --------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    from ..cli_help import HelpFormatter, examples
    parser = argparse.ArgumentParser(
        prog=PROG, usage=USAGE, formatter_class=HelpFormatter,
        description="BERT pretraining (MLM + NSP) with PopTorch's API, on openpop. A flag overrides the value "
                    "of the named --config; a key the config does not set takes the default shown.",
        epilog=examples("openpop-bert --config demo_tiny_128 --dataset generated",
                        "openpop-bert --config cpu_tiny_128 --training-steps 100 --checkpoint-output-dir ckpt"))
    parser.add_argument("--config", default=DEFAULT_CONFIG, metavar="NAME",
                        help=f"Named configuration from {os.path.basename(CONFIG_FILE)} "
                             f"(see --list-configs)")
    parser.add_argument("--list-configs", action="store_true", help="Print the named configurations and exit")
    for key in _KEYS:
        help_text = key.help.replace("%", "%%")
        if key.default is not None and "default" not in key.help:
            default = " ".join(map(str, key.default)) if isinstance(key.default, list) else key.default
            help_text += f" (default: {str(default).replace('%', '%%')})"
        kwargs = dict(help=help_text, default=argparse.SUPPRESS)
        if key.type is str_to_bool:
            kwargs.update(type=str_to_bool, nargs="?", const=True)
        else:
            kwargs["type"] = key.type
        if key.nargs:
            kwargs["nargs"] = key.nargs
        if key.choices:
            kwargs["choices"] = key.choices
        parser.add_argument(key.flag, **kwargs)
    return parser


def parse_args(argv: Optional[list[str]] = None, parser: Optional[argparse.ArgumentParser] = None
               ) -> BertRunConfig:
    """Named config + flags -> validated ``BertRunConfig``; raises ``ConfigError``."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "list_configs", False):
        raise _ListConfigs()
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "list_configs")}
    return make_config(args.config, **overrides)


def make_config(name: str = DEFAULT_CONFIG, **overrides) -> BertRunConfig:
    """The named config with ``overrides`` applied, validated."""
    values = named_config(name)
    unknown = sorted(set(overrides) - set(KEYS))
    if unknown:
        raise ConfigError(messages.UNKNOWN_KEYS.format(unknown=', '.join(unknown)))
    values.update(overrides)
    return validate(BertRunConfig(name, **values))


class _ListConfigs(Exception):
    """``--list-configs`` was given."""
