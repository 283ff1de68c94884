"""The texts of openpop-bert's errors (ConfigError, DataError, CheckpointError): each names the flag or file to fix."""

# --- checkpoint -----------------------------------------------------------------
NO_SUCH_CHECKPOINT = (
    "checkpoint {source} does not exist: point --checkpoint-input-dir at a step_N.pt file or a directory "
    "of them")
NOT_A_CHECKPOINT = "{path} is not an openpop-bert checkpoint (expected format {format})"
CHECKPOINT_OTHER_MODEL = (
    "checkpoint {path} was saved by a different model: {different}. Run with the checkpoint's settings (it "
    "was saved with --config {config_name}).")
CHECKPOINT_OTHER_TRAINING = (
    "resuming {path} with different training settings: {changed}. A resumed run continues the saved one "
    "exactly, so run with the saved values (or start a new run without --resume-training-from-checkpoint).")
CHECKPOINT_UNWRITABLE = "could not write checkpoint {path}: {problem}. Fix: {fix}."
NO_CHECKPOINT_IN_DIRECTORY = (
    "no checkpoint (step_N.pt) in {source}: train with --checkpoint-output-dir {source} first, or point "
    "--checkpoint-input-dir at a checkpoint file")
CHECKPOINT_ENTRY = (
    "checkpoint {path} is damaged or not an openpop-bert checkpoint: its '{entry}' is not {expected}. Delete it "
    "and resume from an earlier step_N.pt, or {start_over}")
EXPECTED_STEP_COUNT = "a number of steps"
EXPECTED_DICT = "a dict"
EXPECTED_TENSORS = "a state dict of tensors"
EXPECTED_OPTIMIZER_STATE = "an optimizer state dict"
EXPECTED_RNG_STATE = "torch's random generator state"
CHECKPOINT_WEIGHTS = (
    "checkpoint {path} does not hold this model's weights ({problems}). Delete it and resume from an earlier "
    "step_N.pt, or {start_over}")
CHECKPOINT_OPTIMIZER = (
    "checkpoint {path}: its optimizer state does not fit this run's optimizer ({error}). Run with the "
    "checkpoint's settings, or start without --resume-training-from-checkpoint")
CHECKPOINT_SCHEDULE = (
    "checkpoint {path}: its learning-rate schedule state is not one this run's schedule has (its entries "
    "differ). Run with the checkpoint's settings, or start without --resume-training-from-checkpoint")
CHECKPOINT_DAMAGED = (
    "checkpoint {path} is damaged or not an openpop-bert checkpoint ({exc_type}). Delete it and resume "
    "from an earlier step_N.pt, or {start_over}")
# How to run without the checkpoint: drop the setting that made the run read it.
START_WITHOUT_INPUT = "start without --checkpoint-input-dir"
START_WITHOUT_RESUME = "start without --resume-training-from-checkpoint"
START_WITHOUT_BOTH = "start without --checkpoint-input-dir and --resume-training-from-checkpoint"

# --- config ---------------------------------------------------------------------
BOOLEAN_VALUE = "expected a boolean (true/false), got {value!r}"
JSON_OBJECT_VALUE = "expected a JSON object, got {value!r}"
UNKNOWN_CONFIG = "unknown config '{name}': choose one of {configs} (defined in {path})"
CONFIG_UNKNOWN_KEYS = "config '{name}' in {path} has unknown keys: {unknown}"
HIDDEN_SIZE_HEADS = "hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads})"
SEQUENCE_LENGTH_POSITIONS = (
    "sequence_length {sequence_length} exceeds the {max_position_embeddings} position embeddings of BERT")
MASK_TOKENS_SEQUENCE_LENGTH = "mask_tokens ({mask_tokens}) cannot exceed sequence_length ({sequence_length})"
EMBEDDING_SERIALIZATION = (
    "embedding_serialization_factor ({embedding_serialization_factor}) must divide vocab_size "
    "({vocab_size})")
LAYERS_PER_IPU_NEGATIVE = "layers_per_ipu must be non-negative integers, got {layers}"
LAYERS_PER_IPU_TOTAL = (
    "layers_per_ipu not compatible with number of hidden layers: {layers} places {total} layers but "
    "num_hidden_layers is {num_hidden_layers}. Give --layers-per-ipu values that sum to "
    "{num_hidden_layers}.")
LAYERS_PER_IPU_IPUS = (
    "layers_per_ipu {layers} spreads the encoder over {layers_count} IPU{plural} but ipus_per_replica is "
    "{ipus_per_replica}: give {ipus_per_replica} values to --layers-per-ipu or set --ipus-per-replica "
    "{layers_count}.")
PIPELINE_GRADIENT_ACCUMULATION = (
    "--gradient-accumulation {gradient_accumulation} is too small for the pipeline of --layers-per-ipu {layers}: "
    "its {stages} forward stages train as {needed} (forward and backward), so use --gradient-accumulation >= "
    "{needed}, or put every layer on one IPU (--ipus-per-replica 1 --layers-per-ipu N)")
MATMUL_PROPORTION_LENGTH = (
    "Length of matmul_proportion doesn't match ipus_per_replica: {proportions} vs {ipus_per_replica}")
MATMUL_PROPORTION_RANGE = "matmul_proportion values must be between 0 and 1, got {proportions}"
CHECKPOINT_STEPS_WITHOUT_OUTPUT = "--checkpoint-steps needs --checkpoint-output-dir to save checkpoints to"
RESUME_WITHOUT_CHECKPOINT = (
    "--resume-training-from-checkpoint needs --checkpoint-input-dir (a step_N.pt file or a directory of "
    "them) or --checkpoint-output-dir to resume from its latest checkpoint")
PACKED_DATA = (
    "packed_data needs packed TFRecord input files, which openpop-bert does not read: run with "
    "--packed-data False")
MASK_TOKENS_PRETRAINING = (
    "--dataset pretraining needs mask_tokens <= sequence_length - 3 ([CLS] and two [SEP]); got mask_tokens "
    "{mask_tokens}, sequence_length {sequence_length}")
CHECKPOINT_OUTPUT_NOT_DIRECTORY = (
    "--checkpoint-output-dir {directory} exists and is not a directory: name a directory")
CHECKPOINT_OUTPUT_NOT_WRITABLE = (
    "--checkpoint-output-dir {directory} is not writable: name a directory you can write to")
UNKNOWN_KEYS = "unknown configuration keys: {unknown}"
NOT_ONE_OF = "{name} must be one of {choices}, got {value!r}"
LAYERS_PER_IPU_ZERO = "layers_per_ipu 0 places no layers anywhere: give a positive count per IPU"
NOT_A_NUMBER = "{flag} must be a number, got {value!r}"
NOT_REQUIREMENT = "{flag} must be {requirement}, got {value!r}"
NOT_POSITIVE_INTEGER = "{flag} must be a positive integer, got {value!r}"
NOT_AN_INTEGER = "{flag} must be an integer, got {value!r}"

# --- data -----------------------------------------------------------------------
PAD_TOKEN_ID = "the tokenizer's [PAD] token must have id 0 (padding and ignored labels are 0)"
TOKENIZER_VOCAB_TOO_LARGE = (
    "the tokenizer has {tokens} tokens but the model's vocab_size is {vocab_size}: raise "
    "--vocab-size to at least {tokens}")
NOT_ENOUGH_DATA = (
    "Not enough data in input_files for current configuration: the dataset has {dataset_count} examples "
    "but one step needs samples_per_step = micro_batch_size x device_iterations x gradient_accumulation x "
    "replication_factor = {micro_batch_size} x {device_iterations} x {gradient_accumulation} x "
    "{replication_factor}{per_instance} = {value}. Add input files, raise --duplication-factor, or lower "
    "those batch settings.")
DATA_CACHE_UNWRITABLE = (
    "could not write {path} to the data cache: {problem}. Point --data-cache-dir at a writable directory "
    "with free space.")
FILE_UNREADABLE = "cannot read {role} {path}: {problem}. Give a file you can read with {flag}."
INPUT_IS_DIRECTORY = "{directory} is a directory: give text files or a glob like {glob}"
NO_INPUT_FILES = (
    "no input files match '{pattern}': give plain-text files with --input-files (or 'stdlib' for the "
    "standard-library corpus), or use --dataset generated")
INPUT_IS_TFRECORD = (
    "{path} is a TFRecord file: openpop-bert reads plain text (one sentence per line, blank lines between "
    "documents). Give text files with --input-files, or use --dataset generated")
NO_VOCAB_FILE = (
    "vocab file {vocab_file} does not exist: give a WordPiece vocab.txt (one token per line) with "
    "--vocab-file")
TOKENIZER_MISSING_TOKEN = "the tokenizer has no {token} token: use a BERT WordPiece vocabulary"
NOT_WORDPIECE_VOCABULARY = (
    "vocab file {vocab_file} is not a WordPiece vocabulary ({exc}): give a vocab.txt with one token per "
    "line")

# --- train ----------------------------------------------------------------------
NOTHING_LEFT_TO_TRAIN = (
    "checkpoint {checkpoint_file} is at step {start_step} and training_steps is {training_steps}: nothing "
    "left to train. Raise --training-steps.")
NOT_TEXT = "{role} {path} is not a text file ({problem}): give plain UTF-8 text with {flag}"
NOT_UTF8_BYTE = "byte {offset} is not UTF-8 text"
ENDS_INSIDE_CHARACTER = "it ends inside a UTF-8 character"
