"""openpop-bert under bad conditions: Ctrl-C and failures while writing checkpoints, files left by
killed writes, unusable input files and numeric flags. Each ends in one line naming the problem."""
import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from openpop import atomic_file
from openpop.bert import data, train
from openpop.bert.config import ConfigError, make_config

NO_SUCH_PID = 99_999_999  # above Linux's largest pid_max (2**22): never a running process


def unit_test_argv(*extra):
    """One step of the unit_test model on one IPU, generated data (no cache files written)."""
    return ["--config", "unit_test", "--dataset", "generated", "--training-steps", "1", "--device-iterations", "1",
            "--gradient-accumulation", "2", "--ipus-per-replica", "1", "--layers-per-ipu", "3",
            "--disable-progress-bar", *extra]


class FailingDisk:
    """Replaces ``os.fdopen`` for files whose path contains ``marker``: after ``limit`` bytes their
    writes fail the way ``fail()`` does (the rest of the process writes normally)."""

    def __init__(self, marker, limit, fail):
        self.marker, self.limit, self.fail = marker, limit, fail
        self.real_fdopen = os.fdopen
        self.failures = 0

    def fdopen(self, fd, *args, **kwargs):
        stream = self.real_fdopen(fd, *args, **kwargs)
        if self.marker not in os.readlink(f"/proc/self/fd/{fd}"):
            return stream
        disk, real_write = self, stream.write
        written = [0]

        def write(data):
            written[0] += len(data)
            if written[0] > disk.limit:
                disk.failures += 1
                disk.fail()
            return real_write(data)
        stream.write = write
        return stream


def ctrl_c():
    signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt, as for a real Ctrl-C


def disk_full():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# --------------------------------------------------------------------------- checkpoint writes
@pytest.mark.parametrize("fail, status, message", [
    (ctrl_c, 130, "Interrupted"),
    (disk_full, 1, "could not write checkpoint {path}: No space left on device. Fix: free disk space"),
])
def test_a_checkpoint_write_that_fails_ends_in_one_line_and_leaves_no_file(fail, status, message, tmp_path,
                                                                           monkeypatch, capsys):
    if not os.path.exists("/proc/self/fd"):
        pytest.fail("needs /proc/self/fd (Linux) to find the checkpoint's file descriptor")
    disk = FailingDisk(".tmp-step_1.pt-", limit=4096, fail=fail)
    monkeypatch.setattr(atomic_file.os, "fdopen", disk.fdopen)
    output = tmp_path / "checkpoints"
    assert train.main(unit_test_argv("--checkpoint-output-dir", str(output))) == status
    err = capsys.readouterr().err
    assert message.format(path=output / "step_1.pt") in err
    assert "Traceback" not in err and "inline_container" not in err
    # The first failure stops the writing (torch.save would otherwise go on writing the whole state).
    assert disk.failures == 1
    assert os.listdir(output) == []


@pytest.mark.slow
def test_a_checkpoint_larger_than_the_file_size_limit_is_a_clear_error(tmp_path):
    """A real EFBIG: the process runs under ``ulimit -f`` (RLIMIT_FSIZE) smaller than a checkpoint."""
    output = tmp_path / "checkpoints"
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        from openpop.bert.train import main
        sys.exit(main({unit_test_argv("--checkpoint-output-dir", str(output))!r}))
    """)
    done = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert f"could not write checkpoint {output / 'step_1.pt'}: File too large. Fix: raise the file-size " \
           "limit (`ulimit -f`)" in done.stderr
    assert "Traceback" not in done.stderr
    assert os.listdir(output) == []


def test_temporary_files_of_killed_checkpoint_writes_are_removed_at_start(tmp_path):
    output = tmp_path / "checkpoints"
    output.mkdir()
    killed = output / f".tmp-step_2.pt-{NO_SUCH_PID}-k2j3h4g5"       # its writer is gone
    older = output / ".tmp-step_3.pt-a8f3k2_9"                        # an older openpop's name: no pid
    in_flight = output / f".tmp-step_4.pt-{os.getpid()}-x9y8z7w6"    # its writer is running
    others = [output / "notes.txt", output / f".tmp-notes.txt-{NO_SUCH_PID}-abcdefgh"]
    for path in [killed, older, in_flight, *others]:
        path.write_bytes(b"partial")
    config = make_config("unit_test", dataset="generated", training_steps=1, device_iterations=1,
                         gradient_accumulation=2, ipus_per_replica=1, layers_per_ipu=[3],
                         checkpoint_output_dir=str(output), disable_progress_bar=True)
    log = io.StringIO()
    train.run(config, stream=log)
    assert sorted(os.listdir(output)) == sorted([in_flight.name, "step_1.pt", *[p.name for p in others]])
    assert f"Removed 2 temporary file(s) left in {output} by checkpoint writes that were killed" in log.getvalue()


def test_atomic_write_raises_the_streams_own_error():
    """torch.save turns an exception from the stream into ``RuntimeError: [enforce fail at
    inline_container.cc...]``; atomic_write raises the original and stops the writing."""
    class Broken:
        calls = 0

        def write(self, data):
            Broken.calls += 1
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    stream = atomic_file._FailFastStream(Broken())
    with pytest.raises(OSError, match="File too large"):
        stream.write(b"x")
    with pytest.raises(OSError, match="File too large"):
        stream.write(b"y")
    assert Broken.calls == 1


# --------------------------------------------------------------------------- input files
def test_binary_and_unreadable_input_files_are_named(tmp_path, monkeypatch, capsys):
    cache = str(tmp_path / "cache")
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"plain text first\n" + bytes(range(256)) * 4)
    argv = ["--config", "demo_tiny_128", "--data-cache-dir", cache, "--disable-progress-bar"]
    assert train.main([*argv, "--input-files", str(binary)]) == 1
    err = capsys.readouterr().err
    assert f"input file {binary} is not a text file (byte 17 is not UTF-8 text)" in err
    assert "Traceback" not in err

    nul = tmp_path / "zeros.txt"
    nul.write_bytes(b"abc" + bytes(100))
    with pytest.raises(data.DataError, match=f"input file {nul} is not a text file \\(byte 3 "):
        data.get_dataset(make_config("demo_tiny_128", input_files=[str(nul)], data_cache_dir=cache))

    straddling = tmp_path / "long.txt"   # a broken character across the 1 MiB blocks the check reads
    straddling.write_bytes(b"a" * ((1 << 20) - 1) + b"\xc3(" + b"more text\n")
    with pytest.raises(data.DataError, match=f"input file {straddling} is not a text file \\(byte 1048575 "):
        data.get_dataset(make_config("demo_tiny_128", input_files=[str(straddling)], data_cache_dir=cache))

    unreadable = tmp_path / "secret.txt"
    unreadable.write_text("Readable by nobody.\n")
    real_open = builtins.open

    def guarded_open(path, *args, **kwargs):  # tests run as root, which chmod 000 does not stop
        if str(path) == str(unreadable):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(data, "open", guarded_open, raising=False)
    assert train.main([*argv, "--input-files", str(unreadable)]) == 1
    err = capsys.readouterr().err
    assert f"cannot read input file {unreadable}: Permission denied" in err and "Traceback" not in err

    text = tmp_path / "text.txt"
    text.write_text("Some text.\n")
    with pytest.raises(data.DataError, match=f"vocab file {binary} is not a text file"):
        data.get_dataset(make_config("demo_tiny_128", input_files=[str(text)], vocab_file=str(binary),
                                     data_cache_dir=cache))


def test_temporary_files_of_killed_cache_writes_are_removed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    killed = cache / f".tmp-examples-0123456789abcdef.pt-{NO_SUCH_PID}-abcdefgh"
    foreign = cache / f".tmp-mine.txt-{NO_SUCH_PID}-abcdefgh"
    killed.write_bytes(b"partial")
    foreign.write_bytes(b"not ours")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A first sentence.\nA second one.\n\nAnother document.\nIt has two lines.\n")
    with pytest.raises(data.DataError, match="Not enough data"):
        data.get_dataset(make_config("demo_tiny_128", input_files=[str(corpus)], data_cache_dir=str(cache)))
    assert not killed.exists() and foreign.exists()


# --------------------------------------------------------------------------- numeric flags
@pytest.mark.parametrize("flag, value, requirement", [
    ("--weight-decay", "-1", "a finite number >= 0"),
    ("--weight-decay", "nan", "a finite number >= 0"),
    ("--learning-rate", "nan", "a finite number >= 0"),
    ("--learning-rate", "-0.1", "a finite number >= 0"),
    ("--learning-rate", "inf", "a finite number >= 0"),
    ("--loss-scaling", "0", "a finite number > 0"),
    ("--loss-scaling", "inf", "a finite number > 0"),
    ("--layer-norm-eps", "-0.001", "a finite number > 0"),
    ("--lr-warmup", "nan", "a fraction of training_steps in [0, 1]"),
    ("--hidden-dropout-prob", "1", "a probability in [0, 1)"),
    ("--attention-probs-dropout-prob", "nan", "a probability in [0, 1)"),
    ("--threads", "0", "a positive integer"),
    ("--dataloader-workers", "-1", "an integer >= 0"),
    ("--micro-batch-size", "0", "a positive integer"),
    ("--wandb-param-steps", "-5", "a positive integer"),
])
def test_bad_numbers_are_usage_errors_naming_the_flag(flag, value, requirement, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", "unit_test", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} must be {requirement}, got " in err


def test_numbers_written_as_yaml_reads_them_are_accepted():
    """configs.yml's ``learning_rate: 1e-3`` is a string to YAML; it means 0.001."""
    config = make_config("unit_test", learning_rate="1e-3", weight_decay=0, training_steps="3")
    assert (config.learning_rate, config.weight_decay, config.training_steps) == (0.001, 0.0, 3)
    assert isinstance(config.weight_decay, float)
    with pytest.raises(ConfigError, match="--learning-rate must be a number, got 'fast'"):
        make_config("unit_test", learning_rate="fast")
