"""The texts of the Lightning integration's errors and warnings (Lightning's exact words where it
had them)."""

SMALL_TRAINING_DATASET = (
    "The training dataset ({samples} samples) is smaller than one host call's combined batch ({combined} samples "
    "= batch_size {micro} x device_iterations {di} x devices {devices} x accumulate_grad_batches {ga}): an epoch "
    "has no batch, so no optimizer step would run.")
SMALL_TRAINING_DATASET_FIX = (
    "use a batch_size of at most {largest} or fewer devices, device_iterations or accumulate_grad_batches, or "
    "give the dataset at least {combined} samples")
SMALL_TRAINING_DATASET_FIX_TOO_FEW = (
    "give the dataset at least {combined} samples, or use fewer devices, device_iterations or "
    "accumulate_grad_batches")
HOOK_FAILED = ("openpop could not add IPU support to {package}: {error!r}. "
               "Run `import {flavour}` to see the full error.")
NO_PROCESS_GROUP = ("Lightning sees {world_size} processes but there is no torch.distributed group to "
                    "join: launch the script with poprun (or torchrun).")
LOG_UNEXPECTED_KWARGS = "LightningModule.log() got unexpected keyword arguments {names}"
MISSING_LOSS_KEY = ("In automatic_optimization, when `training_step` returns a dict, the 'loss' key needs to be "
                    "present")
DEVICE_ITERATIONS = ("IPUStrategy(device_iterations={value!r}): device_iterations is the number "
                     "of optimizer steps (or inference batches) one host call runs and must be an int >= 1.")
OPTIONS_TYPE = "IPUStrategy({name}=...) must be a poptorch.Options, not {type}."
COMPILED_LOG_VALUE = ("self.log({name!r}, <{kind}>) inside a step: the compiled backend logs tensors only "
                      "(log a tensor, or log this from an on_*_batch_end hook)")
COMPILED_STEP_REPLACED = "a {method} set on the LightningModule instance (the compiled backend runs the class's)"
COMPILED_STEP_FAILED = ("{method} called with `self` as the compiled backend's logging view of the module "
                        "({error})")
COMPILED_STEP_STATE = ("`self.{name}` read inside a step (it changes between the optimizer steps of one host call; "
                       "the compiled program would see one value: read it in a hook)")
PROFILE_WRITE_FAILED = "openpop could not write the {stage} profile report (the run's result stands): {reason}"
