"""openpop-bert: configs and validation, model, data, training output, checkpoints, learning."""
import copy
import io
import math
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import poptorch
from openpop.bert import checkpoint as ckpt
from openpop.bert import data, metrics, optimization, train
from openpop.bert.config import ConfigError, available_configs, make_config, parse_args
from openpop.bert.model import PipelinedBertForPretraining, masked_accuracy

SECTIONS = [
    "Using config: unit_test",
    "------------------- Data Loading Started ------------------",
    "Data loaded in ",
    "-------------------- Device Allocation --------------------",
    "Embedding  --> IPU 0",
    "Encoder 0  --> IPU 1",
    "Encoder 1  --> IPU 2",
    "Encoder 2  --> IPU 3",
    "Pooler     --> IPU 0",
    "Classifier --> IPU 0",
    "---------- Compilation/Loading from Cache Started ---------",
    "Graph compilation: 100%|",
    "Compiled/Loaded model in ",
    "--------------------- Training Started --------------------",
    "Step: 0 / 1 - LR: ",
    "Step: 1 / 1 - LR: ",
    "-------------------- Training Metrics ---------------------",
    "global_batch_size: 9",
    "device_iterations: 2",
    "training_steps: 2",
    "Training time: ",
]
# The recipe's own log parsers (benchmarks.yml).
STEP_PATTERNS = [r"throughput: *(.*?) samples/sec", r"mlm_acc: *(.*?) \%", r"nsp_acc: *(.*?) \%",
                 r"mlm_loss: *(\d*\.\d*)", r"total loss: *(\d*\.\d*)"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bert-cache"))


@pytest.fixture(scope="module")
def small_corpus(cache_dir, tmp_path_factory):
    """About 60 documents of the stdlib docstring corpus."""
    text = open(data.stdlib_corpus_path(cache_dir), encoding="utf-8").read()
    documents = text.split("\n\n")
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n\n".join(documents[40:100]) + "\n", encoding="utf-8")
    return str(path)


def tiny(cache_dir, **overrides):
    """unit_test-sized model on one IPU (no pipeline), generated data, fast settings."""
    values = dict(dataset="generated", device_iterations=1, gradient_accumulation=2, training_steps=2,
                  ipus_per_replica=1, layers_per_ipu=[3], data_cache_dir=cache_dir, disable_progress_bar=True)
    values.update(overrides)
    return make_config("unit_test", **values)


def assert_in_order(text, needles):
    position = 0
    for needle in needles:
        found = text.find(needle, position)
        assert found >= 0, f"{needle!r} missing (or out of order) in:\n{text}"
        position = found + len(needle)


# --------------------------------------------------------------------------- configs
def test_recipe_configs_carry_the_recipe_values():
    names = available_configs()
    for name in ("pretrain_base_128_pod4", "pretrain_large_128_POD64", "pretrain_base_128", "pretrain_large_128",
                 "demo_tiny_128", "unit_test", "cpu_base_128", "cpu_tiny_128"):
        assert name in names
    pod4 = make_config("pretrain_base_128_pod4")
    assert (pod4.micro_batch_size, pod4.gradient_accumulation, pod4.replication_factor) == (32, 2048, 1)
    assert pod4.layers_per_ipu == [0, 4, 4, 4] and pod4.matmul_proportion == [0.25] * 4
    assert (pod4.optimizer, pod4.learning_rate, pod4.lr_warmup, pod4.loss_scaling) == \
        ("LAMBNoBiasCorrection", 0.006, 0.28, 16384.0)
    assert pod4.global_batch_size == 65536 and pod4.intermediate_size == 3072
    pod64 = make_config("pretrain_large_128_POD64")
    assert (pod64.micro_batch_size, pod64.gradient_accumulation, pod64.replication_factor) == (8, 512, 16)
    assert pod64.layers_per_ipu == [3, 7, 7, 7] and pod64.embedding_serialization_factor == 2
    assert pod64.global_batch_size == 65536 and pod64.optimizer == "LAMB"
    assert pod64.layer_ipus == [0] * 3 + [1] * 7 + [2] * 7 + [3] * 7
    demo = make_config("demo_tiny_128")
    assert (demo.hidden_size, demo.num_hidden_layers, demo.num_attention_heads, demo.gradient_accumulation) == \
        (64, 3, 8, 16)
    unit = make_config("unit_test")
    assert (unit.vocab_size, unit.hidden_size, unit.device_iterations, unit.training_steps) == (1000, 32, 10, 10)


def test_flags_override_keys_and_single_layers_per_ipu_value_expands():
    config = parse_args(["--config", "pretrain_base_128", "--micro-batch-size", "2", "--layers-per-ipu", "3",
                         "--custom-ops", "False", "--recompute-checkpoint-every-layer=false", "--wandb"])
    assert config.micro_batch_size == 2
    assert config.layers_per_ipu == [3, 3, 3, 3]
    assert config.custom_ops is False and config.recompute_checkpoint_every_layer is False and config.wandb is True
    assert config.config == "pretrain_base_128"


@pytest.mark.parametrize("argv, environment, backend", [
    ([], None, "auto"),  # the library's default (train.DEFAULT_BACKEND)
    ([], "compiled", "compiled"),
    (["--backend", "auto"], "compiled", "auto"),
])
def test_backend_is_auto_unless_asked(argv, environment, backend, monkeypatch):
    if environment is None:
        monkeypatch.delenv("OPENPOP_BACKEND", raising=False)
    else:
        monkeypatch.setenv("OPENPOP_BACKEND", environment)
    config = parse_args(["--config", "demo_tiny_128", *argv])
    assert train.get_options(config).openpop_backend == backend


@pytest.mark.parametrize("argv, message", [
    (["--config", "no_such_config"], "unknown config 'no_such_config': choose one of"),
    (["--config", "pretrain_base_128", "--layers-per-ipu", "1", "4", "4", "4"],
     "layers_per_ipu not compatible with number of hidden layers"),
    (["--config", "pretrain_base_128", "--layers-per-ipu", "6", "6"], "set --ipus-per-replica 2"),
    (["--config", "pretrain_large_128", "--ipus-per-replica", "2", "--layers-per-ipu", "12", "12"],
     "Length of matmul_proportion doesn't match ipus_per_replica"),
    (["--config", "unit_test", "--hidden-size", "30"], "must be a multiple of num_attention_heads"),
    (["--config", "unit_test", "--checkpoint-steps", "2"], "needs --checkpoint-output-dir"),
])
def test_inconsistent_configurations_are_rejected(argv, message, capsys):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_args(argv)
    with pytest.raises(SystemExit) as exit_info:  # the command line: a usage error naming the fix
        train.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_pipeline_too_deep_for_the_accumulation_fails_at_parse_time(capsys):
    """demo_tiny_128 pipelines over 5 forward stages (IPU 0, 1, 2, 3, back to 0): training needs a
    gradient accumulation of 2 x 5 - 1 = 9, named with its flag before any data loads."""
    with pytest.raises(ConfigError, match=r"use --gradient-accumulation >= 9"):
        parse_args(["--config", "demo_tiny_128", "--gradient-accumulation", "2"])
    parse_args(["--config", "demo_tiny_128", "--gradient-accumulation", "9"])
    parse_args(["--config", "demo_tiny_128", "--gradient-accumulation", "1", "--ipus-per-replica", "1",
                "--layers-per-ipu", "3"])  # one IPU: no pipeline
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", "demo_tiny_128", "--gradient-accumulation", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "usage: openpop-bert [-h] [--config NAME] [--list-configs] [--FLAG VALUE ...]",
        "openpop-bert: error: --gradient-accumulation 2 is too small for the pipeline of --layers-per-ipu 0 1 1 1: "
        "its 5 forward stages train as 9 (forward and backward), so use --gradient-accumulation >= 9, or put every "
        "layer on one IPU (--ipus-per-replica 1 --layers-per-ipu N)"]


def test_usage_errors_are_two_lines_naming_openpop_bert(capsys):
    for argv in (["--no-such-flag"], ["--training-steps", "x"], ["--config", "nope"]):
        with pytest.raises(SystemExit):
            train.main(argv)
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and lines[0].startswith("usage: openpop-bert ") and \
            lines[1].startswith("openpop-bert: error: "), lines
        assert "PopTorch BERT" not in lines[1]
    with pytest.raises(ConfigError, match=r"spreads the encoder over 1 IPU but ipus_per_replica is 4"):
        parse_args(["--config", "demo_tiny_128", "--layers-per-ipu", "3"])


# --------------------------------------------------------------------------- model and metrics
def test_forward_equals_transformers_bert_for_pretraining():
    from transformers import BertForPreTraining
    config = make_config("unit_test")
    model = PipelinedBertForPretraining(config).eval()
    reference = BertForPreTraining(config.bert_config()).eval()
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(5, config.vocab_size, (3, 128))
    mask = torch.ones(3, 128, dtype=torch.long)
    mask[1, 100:] = 0
    segments = (torch.arange(128) >= 64).long().expand(3, -1)
    positions = torch.randint(0, 100, (3, config.mask_tokens))
    with torch.no_grad():
        scores, nsp = model(ids, mask, segments, positions)
        expected = reference(input_ids=ids, attention_mask=mask, token_type_ids=segments)
    gathered = expected.prediction_logits.gather(1, positions[..., None].expand(-1, -1, config.vocab_size))
    torch.testing.assert_close(scores, gathered, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nsp, expected.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_masked_accuracy_ignores_padding_labels():
    scores = torch.zeros(2, 3, 5)
    scores[0, 0, 2] = scores[0, 1, 3] = scores[1, 0, 4] = 1.0
    labels = torch.tensor([[2, 1, 0], [4, 0, 0]])
    # sample 0: 1 of 2 labelled positions right; sample 1: 1 of 1.
    assert float(masked_accuracy(scores, labels)) == pytest.approx(0.75)


def test_training_flops_follow_the_formula():
    base = metrics.training_flops_per_sample(make_config("pretrain_base_128"))
    large = metrics.training_flops_per_sample(make_config("pretrain_large_128"))
    assert base / 1e9 == pytest.approx(69.9, abs=0.1)
    assert large / 1e9 == pytest.approx(240.6, abs=0.2)


def test_learning_rate_schedule_and_optimizer_groups():
    config = make_config("pretrain_base_128", training_steps=100)
    assert [optimization.lr_factor(s, config) for s in (0, 14, 28, 64, 100)] == \
        pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])
    assert optimization.lr_factor(50, make_config("demo_tiny_128")) == 1.0
    model = PipelinedBertForPretraining(make_config("unit_test"))
    optimizer = optimization.get_optimizer(make_config("unit_test", optimizer="LAMB", weight_decay=0.01), model)
    assert isinstance(optimizer, poptorch.optim.LAMB) and optimizer.bias_correction
    decayed, plain = optimizer.param_groups
    assert all(p.dim() > 1 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert (decayed["weight_decay"], plain["weight_decay"], plain["max_weight_norm"]) == (0.01, 0.0, 0)
    assert optimizer.variable_attrs.isConstant("weight_decay")


def test_openpop_training_equals_a_plain_pytorch_loop(cache_dir):
    """The rule of the house: the same model, data and optimizer in a hand-written loop give
    the same losses and weights."""
    # Split over 4 IPUs as the recipe does (a 5-stage pipeline: accumulation >= 9).
    config = tiny(cache_dir, device_iterations=2, gradient_accumulation=9, micro_batch_size=1, optimizer="LAMB",
                  loss_scaling=8.0, ipus_per_replica=4, layers_per_ipu=[0, 1, 1, 1])
    torch.manual_seed(1)
    model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
    plain = copy.deepcopy(model)
    n = 18
    batch = [torch.randint(1, 100, (n, 128)), torch.ones(n, 128, dtype=torch.long),
             torch.zeros(n, 128, dtype=torch.long), torch.randint(0, 128, (n, 20)),
             torch.randint(1, config.vocab_size, (n, 20)), torch.randint(0, 2, (n, 1))]
    options = train.get_options(config)  # seeds torch with random_seed, as Options.randomSeed does
    torch.manual_seed(2)
    training = poptorch.trainingModel(model, options, optimization.get_optimizer(config, model))
    outputs = training(*batch)
    optimizer = optimization.get_optimizer(config, plain)
    torch.manual_seed(2)
    losses = []
    for step in range(2):
        for micro in range(9):
            rows = slice(9 * step + micro, 9 * step + micro + 1)
            out = plain(*[b[rows] for b in batch])
            losses.append(out[0].detach())
            (out[0] / 9).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.testing.assert_close(outputs[0], sum(losses), rtol=1e-5, atol=1e-5)  # OutputMode.Sum
    for (name, a), b in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


# --------------------------------------------------------------------------- data
def test_generated_dataset_is_one_sample_for_one_step():
    config = make_config("unit_test", dataset="generated")
    dataset = data.get_dataset(config)
    assert len(dataset) == config.samples_per_step == 160
    first, last = dataset[0], dataset[159]
    assert all(torch.equal(a, b) for a, b in zip(first, last))
    assert [t.shape[0] for t in first] == [128, 128, 128, 20, 20, 1]
    assert all(t.dtype == torch.long for t in first)


@pytest.mark.slow
def test_real_text_examples_are_built_once_and_cached(cache_dir, small_corpus):
    config = make_config("demo_tiny_128", input_files=[small_corpus], data_cache_dir=cache_dir)
    dataset = data.get_dataset(config)
    assert not dataset.info["cached"]
    again = data.get_dataset(config)
    assert again.info["cached"] and len(again) == len(dataset) > 100
    ids, mask, segments, positions, labels, nsp = dataset[0]
    length = int(mask.sum())
    assert ids[0] == 2 and ids[length - 1] == 3 and int(ids[length:].abs().sum()) == 0  # [CLS] ... [SEP] pad
    assert set(segments[:length].tolist()) == {0, 1}
    predicted = labels != 0
    assert 1 <= int(predicted.sum()) <= config.mask_tokens
    assert (ids[positions[predicted]] != labels[predicted]).float().mean() > 0.5  # mostly [MASK]ed
    assert nsp.item() in (0, 1)


def test_dataset_too_small_for_one_step_names_the_fix(cache_dir, tmp_path):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("One short sentence here.\nAnother short sentence there.\n\nA second document.\nIt ends.\n")
    config = make_config("demo_tiny_128", input_files=[str(corpus)], data_cache_dir=cache_dir)
    with pytest.raises(data.DataError, match="Not enough data in input_files.*samples_per_step"):
        data.get_dataset(config)
    missing = make_config("demo_tiny_128", input_files=[str(tmp_path / "nothing*.txt")], data_cache_dir=cache_dir)
    with pytest.raises(data.DataError, match="no input files match"):
        data.get_dataset(missing)


# --------------------------------------------------------------------------- the application
def test_command_line_prints_the_recipe_sections(cache_dir, capsys):
    argv = ["--config", "unit_test", "--dataset", "generated", "--training-steps", "2", "--device-iterations", "2",
            "--gradient-accumulation", "9", "--data-cache-dir", cache_dir]
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    assert_in_order(err, SECTIONS)
    steps = [line for line in err.splitlines() if line.startswith("Step: ")]
    assert len(steps) == 2
    for line in steps:
        assert re.match(r"Step: \d+ / 1 - LR: \d\.\d\de[+-]\d\d - total loss: \d+\.\d{3} - mlm_loss: \d+\.\d{3} - "
                        r"nsp_loss: \d+\.\d{3} - mlm_acc: \d\.\d{3} % - nsp_acc: \d\.\d{3} % "
                        r"throughput: \d+\.\d samples/sec$", line), line
        for pattern in STEP_PATTERNS:
            assert re.search(pattern, line)


@pytest.mark.slow
def test_python_dash_m_runs_the_seed_command_shape(cache_dir):
    """`python -m openpop.bert --dataset generated --training-steps 1`: every section, LR 0 after the
    only step of a linear schedule, as in the seed's log."""
    command = [sys.executable, "-m", "openpop.bert", "--config", "unit_test", "--dataset", "generated",
               "--training-steps", "1", "--device-iterations", "1", "--gradient-accumulation", "9",
               "--lr-schedule", "linear", "--data-cache-dir", cache_dir]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_in_order(done.stderr, ["Using config: unit_test", "Device Allocation", "Graph compilation",
                                  "Compiled/Loaded model in", "Training Started", "Step: 0 / 0 - LR: 0.00e+00",
                                  "throughput:", "Training Metrics", "global_batch_size: 9",
                                  "device_iterations: 1", "training_steps: 1", "Training time:"])


def test_progress_bar_on_a_terminal(cache_dir):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stream = Terminal()
    train.run(tiny(cache_dir, disable_progress_bar=None), stream=stream)
    text = stream.getvalue()
    assert "\r" in text and "it/s, throughput:" in text and "Training Metrics" in text
    # A fixed-width bar: the description stays "Training", the metrics follow the rate in the postfix.
    updates = [part for part in text.split("\r") if part.startswith("Training:")]
    assert updates and all(re.match(r"Training: +\d+%\|.{20}\| \d/2 \[", part) for part in updates), updates
    assert re.search(r"it/s, throughput: [\d.]+ samples/sec - LR: \S+ - total loss: [\d.]+ - ", updates[-1])
    assert not any("Step:" in part for part in updates)


def test_the_summary_prints_the_final_loss_and_accuracy(cache_dir):
    stream = io.StringIO()
    result = train.run(tiny(cache_dir), stream=stream)
    final = result.steps[-1]
    summary = stream.getvalue().split("Training Metrics")[1]
    assert (f"final loss: {final.total_loss:.3f} (mlm_loss {final.mlm_loss:.3f}, nsp_loss {final.nsp_loss:.3f})\n"
            f"final accuracy: mlm_acc {final.mlm_acc:.3f} %, nsp_acc {final.nsp_acc:.3f} %\n") in summary


# --------------------------------------------------------------------------- checkpoints
def test_resume_then_continue_equals_an_uninterrupted_run(cache_dir, small_corpus, tmp_path):
    common = dict(dataset="pretraining", input_files=[small_corpus], training_steps=4, micro_batch_size=2,
                  gradient_accumulation=2, learning_rate=0.005, lr_schedule="linear", lr_warmup=0.5,
                  hidden_dropout_prob=0.1)
    whole = train.run(tiny(cache_dir, checkpoint_output_dir=str(tmp_path / "a"), checkpoint_steps=2, **common),
                      stream=io.StringIO())
    assert [os.path.basename(p) for p in whole.checkpoints] == ["step_2.pt", "step_4.pt"]
    resumed = train.run(tiny(cache_dir, checkpoint_input_dir=str(tmp_path / "a" / "step_2.pt"),
                             resume_training_from_checkpoint=True, **common), stream=io.StringIO())
    assert resumed.start_step == 2 and [m.step for m in resumed.steps] == [2, 3]
    for a, b in zip(whole.steps[2:], resumed.steps):
        assert (a.lr, a.total_loss, a.mlm_acc) == (b.lr, b.total_loss, b.mlm_acc)
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    # Resuming from a directory takes its latest checkpoint; there is nothing left to do at step 4.
    with pytest.raises(ckpt.CheckpointError, match="at step 4 .* nothing left to train"):
        train.run(tiny(cache_dir, checkpoint_output_dir=str(tmp_path / "a"), resume_training_from_checkpoint=True,
                       **common), stream=io.StringIO())


def test_missing_corrupt_and_mismatched_checkpoints_are_clear_errors(cache_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
        train.run(tiny(cache_dir, checkpoint_input_dir=str(empty), resume_training_from_checkpoint=True))
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        train.run(tiny(cache_dir, checkpoint_input_dir=str(tmp_path / "nowhere.pt")))
    corrupt = tmp_path / "step_3.pt"
    corrupt.write_bytes(b"\x80\x02not a checkpoint at all")
    with pytest.raises(ckpt.CheckpointError, match="damaged or not an openpop-bert checkpoint"):
        train.run(tiny(cache_dir, checkpoint_input_dir=str(corrupt), resume_training_from_checkpoint=True))
    assert train.main(["--config", "unit_test", "--dataset", "generated", "--checkpoint-input-dir", str(corrupt),
                       "--resume-training-from-checkpoint"]) == 1
    err = capsys.readouterr().err
    assert "damaged" in err and "start without --checkpoint-input-dir and --resume-training-from-checkpoint" in err
    # Loading weights only: the way on names the flag that was given, not --resume-training-from-checkpoint.
    with pytest.raises(ckpt.CheckpointError) as damaged:
        train.run(tiny(cache_dir, checkpoint_input_dir=str(corrupt)))
    assert str(damaged.value).endswith("or start without --checkpoint-input-dir")
    saved = train.run(tiny(cache_dir, training_steps=1, checkpoint_output_dir=str(tmp_path / "b")),
                      stream=io.StringIO())
    with pytest.raises(ckpt.CheckpointError, match=r"different model: hidden_size=32 \(this run: 64\)"):
        train.run(tiny(cache_dir, hidden_size=64, checkpoint_input_dir=saved.checkpoints[0]))
    with pytest.raises(ckpt.CheckpointError, match=r"different training settings: learning_rate"):
        train.run(tiny(cache_dir, learning_rate=0.5, checkpoint_input_dir=saved.checkpoints[0],
                       resume_training_from_checkpoint=True))
    # No partial files are left behind by the atomic writes.
    assert sorted(os.listdir(tmp_path / "b")) == ["step_1.pt"]


def test_unusable_paths_fail_before_training(cache_dir, tmp_path):
    not_a_directory = tmp_path / "file.txt"
    not_a_directory.write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        tiny(cache_dir, checkpoint_output_dir=str(not_a_directory))
    with pytest.raises(data.DataError, match="is a directory: give text files or a glob"):
        data.get_dataset(make_config("demo_tiny_128", input_files=[str(tmp_path)], data_cache_dir=cache_dir))
    with pytest.raises(ConfigError, match="mask_tokens <= sequence_length - 3"):
        make_config("demo_tiny_128", sequence_length=4, mask_tokens=2)


# --------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_demo_tiny_sized_training_on_real_text_learns(cache_dir, small_corpus):
    """demo_tiny_128's model on real text: the loss falls and mlm_acc rises (the recipe's
    acceptance test trains demo_tiny_128 on its small sample text the same way)."""
    config = make_config("demo_tiny_128", input_files=[small_corpus], data_cache_dir=cache_dir,
                         ipus_per_replica=1, layers_per_ipu=[3],
                         micro_batch_size=8, gradient_accumulation=1, training_steps=60, learning_rate=0.005,
                         duplication_factor=1, hidden_dropout_prob=0.0, disable_progress_bar=True)
    result = train.run(config, stream=io.StringIO())
    losses = [m.total_loss for m in result.steps]
    accuracy = [m.mlm_acc for m in result.steps]
    assert all(math.isfinite(x) for x in losses)
    print("losses", [round(x, 2) for x in losses], "mlm_acc", [round(x, 3) for x in accuracy])
    assert sum(losses[-10:]) / 10 < sum(losses[:3]) / 3 - 2.0
    # mlm_acc per step is noisy on 8-sample batches (one step's standard deviation is ~0.02) and the
    # WordPiece tokenizer trained here is not bit-identical between runs. The model reaches its
    # plateau (~0.05-0.07, frequent tokens) within ~10 steps, so two halves of the run differ only
    # by noise (CI failed on 0.0472 vs 0.0496). What is certain is the rise from the untrained
    # model's first step (0.0 in every run seen) to the last 30 steps' mean (0.047-0.07 seen; its
    # standard deviation ~0.004, so the 0.02 margin is five of them).
    untrained, late = accuracy[0], sum(accuracy[-30:]) / 30
    assert late > untrained + 0.02
    assert max(accuracy[-20:]) > untrained + 0.03  # (0.079-0.167 seen)
