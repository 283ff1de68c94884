"""Data for BERT pretraining: the recipe's ``generated`` dataset and a real-text pipeline.

Every sample is six integer tensors, in the model's argument order:
``input_ids [S], input_mask [S], segment_ids [S], masked_lm_positions [P], masked_lm_ids [P],
next_sentence_labels [1]`` (S = sequence_length, P = mask_tokens).

``generated``: one random sample, made once from ``random_seed`` and returned for every index
(as the recipe defines it); the dataset holds exactly one step's worth of samples.

``pretraining``: plain-text files (one sentence per line, a blank line between documents; a
file is at least one document) or ``stdlib``, a corpus made of the docstrings of Python's
standard library (present on every machine). A WordPiece tokenizer is trained on the corpus
with ``tokenizers`` (or read from ``--vocab-file``); documents become sentence-pair examples
with BERT's recipe (50 % random next sentence, 15 % of tokens up to ``mask_tokens`` masked:
80 % ``[MASK]``, 10 % random, 10 % unchanged), ``duplication_factor`` times with different
masks. Corpus, tokenizer and examples are cached on disk under ``data_cache_dir``, keyed by
everything they depend on; files are written atomically. Nothing is downloaded.
"""
import ast
import codecs
import glob
import hashlib
import json
import os
import random
import re
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np
import torch

import poptorch

from .. import openpop_settings
from ..atomic_file import atomic_write, remove_stale_temporaries
from . import messages
from .config import BertRunConfig

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EXAMPLES_FORMAT = 1
FIELDS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
          "next_sentence_labels")


class DataError(RuntimeError):
    """The data cannot feed this configuration; the message names the fix."""


# --------------------------------------------------------------------------- generated
class GeneratedPretrainingDataset(torch.utils.data.Dataset):
    """One random sample repeated ``length`` times (the recipe's ``--dataset generated``)."""

    def __init__(self, vocab_size: int, sequence_length: int, mask_tokens: int, length: int, seed: int = 42):
        self.length = length
        generator = torch.Generator().manual_seed(seed)
        self.sample = (
            torch.randint(0, vocab_size, [sequence_length], dtype=torch.long, generator=generator),
            torch.ones(sequence_length, dtype=torch.long),
            torch.zeros(sequence_length, dtype=torch.long),
            torch.randint(0, sequence_length, [mask_tokens], dtype=torch.long, generator=generator),
            torch.randint(0, vocab_size, [mask_tokens], dtype=torch.long, generator=generator),
            torch.randint(0, 2, [1], dtype=torch.long, generator=generator),
        )

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.sample


# --------------------------------------------------------------------------- real text
class PretrainingDataset(torch.utils.data.Dataset):
    """Examples stored as stacked compact integer tensors; items are int64 tuples."""

    def __init__(self, tensors: dict[str, torch.Tensor], info: Optional[dict] = None):
        self.tensors = [tensors[name] for name in FIELDS]
        self.info = dict(info or {})

    def __len__(self):
        return self.tensors[0].shape[0]

    def __getitem__(self, index):
        return tuple(t[index].long() for t in self.tensors)


def cache_dir_for(config: BertRunConfig) -> str:
    if config.data_cache_dir:
        return os.path.expanduser(config.data_cache_dir)
    root = openpop_settings.read("cache_dir")
    return os.path.join(root, "bert")


# The files of the cache (``remove_stale_temporaries`` deletes only temporaries of these).
_CACHE_FILE = re.compile(r"stdlib-docstrings-py[\d.]+\.txt|wordpiece-\d+-[0-9a-f]+\.json|examples-[0-9a-f]+\.pt")


def _atomic_write(path: str, write) -> None:
    """``atomic_write`` into a cache directory created on demand."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write(path, write)
    except OSError as exc:
        raise DataError(messages.DATA_CACHE_UNWRITABLE.format(path=path, problem=exc.strerror or exc)) from None


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _text_file_digest(path: str, role: str = "input file", flag: str = "--input-files") -> str:
    """SHA-256 of a file, checking on the way that it is readable UTF-8 text."""
    h = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
                nul = block.find(b"\0")  # text has no NUL bytes, though they are valid UTF-8
                bad = [nul] if nul >= 0 else []
                pending = len(decoder.getstate()[0])  # bytes of a character the last block began
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    bad.append(exc.start - pending)
                if bad:
                    problem = messages.NOT_UTF8_BYTE.format(offset=offset + min(bad))
                    raise DataError(messages.NOT_TEXT.format(role=role, path=path, problem=problem, flag=flag))
                offset += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(messages.NOT_TEXT.format(
            role=role, path=path, problem=messages.ENDS_INSIDE_CHARACTER, flag=flag)) from None
    except OSError as exc:
        raise DataError(messages.FILE_UNREADABLE.format(
            role=role, path=path, problem=exc.strerror or exc, flag=flag)) from None
    return h.hexdigest()


# --- the stdlib corpus ----------------------------------------------------------------------
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo", "lib2to3", "ensurepip",
              "__pycache__", "tkinter"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")


def _stdlib_sources() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS and not d.startswith("config-"))
        files.extend(os.path.join(directory, n) for n in sorted(names) if n.endswith(".py"))
    return files


def _docstring_sentences(text: str) -> list[str]:
    """Prose sentences of a docstring: doctest lines dropped, paragraphs joined and split."""
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines()]
        lines = [line for line in lines if line and not line.startswith((">>>", "...", "$ "))]
        joined = " ".join(lines)
        if len(joined) < 3:
            continue
        sentences.extend(s.strip() for s in _SENTENCE_END.split(joined) if s.strip())
    return sentences


def build_stdlib_corpus(path: str) -> str:
    """Write the docstrings of Python's standard library as a corpus: one sentence per line,
    one document per module, documents separated by a blank line."""
    documents = []
    for source in _stdlib_sources():
        try:
            with open(source, encoding="utf-8") as stream:
                tree = ast.parse(stream.read())
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        sentences = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    sentences.extend(_docstring_sentences(doc))
        if len(sentences) >= 2:
            documents.append("\n".join(sentences))
    text = "\n\n".join(documents) + "\n"
    _atomic_write(path, lambda stream: stream.write(text.encode("utf-8")))
    return path


def stdlib_corpus_path(cache_dir: str) -> str:
    """The stdlib corpus of this Python, built on first use."""
    version = "{}.{}.{}".format(*sys.version_info[:3])
    path = os.path.join(cache_dir, f"stdlib-docstrings-py{version}.txt")
    if not os.path.exists(path):
        build_stdlib_corpus(path)
    return path


def resolve_input_files(patterns: Sequence[str], cache_dir: str) -> list[str]:
    files = []
    for pattern in patterns:
        if pattern == "stdlib":
            files.append(stdlib_corpus_path(cache_dir))
            continue
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        directories = [m for m in matches if os.path.isdir(m)]
        if directories:
            raise DataError(messages.INPUT_IS_DIRECTORY.format(
                directory=directories[0], glob=os.path.join(directories[0], '*.txt')))
        if not matches:
            raise DataError(messages.NO_INPUT_FILES.format(pattern=pattern))
        files.extend(matches)
    for path in files:
        if path.endswith((".tfrecord", ".index")):
            raise DataError(messages.INPUT_IS_TFRECORD.format(path=path))
    return files


def read_documents(files: Sequence[str]) -> list[list[str]]:
    """Documents as lists of sentences: blank lines and file ends separate documents."""
    documents = []
    for path in files:
        current = []
        with open(path, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                line = line.strip()
                if not line:
                    if current:
                        documents.append(current)
                    current = []
                    continue
                current.extend(_SENTENCE_END.split(line) if len(line) > 400 else [line])
        if current:
            documents.append(current)
    return documents


# --- tokenizer -------------------------------------------------------------------------------
def get_tokenizer(config: BertRunConfig, files: Sequence[str], cache_dir: str,
                  file_digests: Optional[Sequence[str]] = None):
    """A ``tokenizers.Tokenizer``: from ``vocab_file``, or trained on ``files`` (cached)."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    if config.vocab_file:
        if not os.path.isfile(config.vocab_file):
            raise DataError(messages.NO_VOCAB_FILE.format(vocab_file=config.vocab_file))
        _text_file_digest(config.vocab_file, "vocab file", "--vocab-file")
        try:
            tokenizer = BertWordPieceTokenizer(config.vocab_file, lowercase=True)._tokenizer
        except Exception as exc:
            raise DataError(messages.NOT_WORDPIECE_VOCABULARY.format(vocab_file=config.vocab_file, exc=exc)) from None
    else:
        if file_digests is None:
            file_digests = [_text_file_digest(f) for f in files]
        key = _digest("wordpiece-1", config.vocab_size, *file_digests)
        path = os.path.join(cache_dir, f"wordpiece-{config.vocab_size}-{key}.json")
        tokenizer = None
        if os.path.exists(path):
            try:
                tokenizer = Tokenizer.from_file(path)
            except Exception:  # a damaged cache entry is rebuilt
                tokenizer = None
        if tokenizer is None:
            trainer = BertWordPieceTokenizer(lowercase=True)
            trainer.train(list(files), vocab_size=config.vocab_size, min_frequency=2,
                          special_tokens=SPECIAL_TOKENS, limit_alphabet=500, show_progress=False)
            tokenizer = trainer._tokenizer
            _atomic_write(path, lambda stream: stream.write(tokenizer.to_str().encode("utf-8")))
    for token in SPECIAL_TOKENS:
        if tokenizer.token_to_id(token) is None:
            raise DataError(messages.TOKENIZER_MISSING_TOKEN.format(token=token))
    if tokenizer.token_to_id("[PAD]") != 0:
        raise DataError(messages.PAD_TOKEN_ID)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise DataError(messages.TOKENIZER_VOCAB_TOO_LARGE.format(
            tokens=tokenizer.get_vocab_size(), vocab_size=config.vocab_size))
    return tokenizer


# --- examples --------------------------------------------------------------------------------
class _ExampleWriter:
    """Fills preallocated arrays with examples."""

    def __init__(self, capacity, seq, preds):
        self.arrays = {
            "input_ids": np.zeros((capacity, seq), np.int32),
            "input_mask": np.zeros((capacity, seq), np.uint8),
            "segment_ids": np.zeros((capacity, seq), np.uint8),
            "masked_lm_positions": np.zeros((capacity, preds), np.int16),
            "masked_lm_ids": np.zeros((capacity, preds), np.int32),
            "next_sentence_labels": np.zeros((capacity, 1), np.uint8),
        }
        self.count = 0

    def grow(self):
        for name, array in self.arrays.items():
            self.arrays[name] = np.concatenate([array, np.zeros_like(array)])

    def add(self, tokens, segments, positions, labels, random_next):
        if self.count == self.arrays["input_ids"].shape[0]:
            self.grow()
        i, n, p = self.count, len(tokens), len(positions)
        a = self.arrays
        a["input_ids"][i, :n] = tokens
        a["input_mask"][i, :n] = 1
        a["segment_ids"][i, :n] = segments
        a["masked_lm_positions"][i, :p] = positions
        a["masked_lm_ids"][i, :p] = labels
        a["next_sentence_labels"][i, 0] = 1 if random_next else 0
        self.count += 1

    def tensors(self):
        return {name: torch.from_numpy(array[:self.count].copy()) for name, array in self.arrays.items()}


def create_examples(documents: list[list[list[int]]], config: BertRunConfig, special: dict[str, int],
                    vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Sentence-pair MLM/NSP examples from tokenized documents (lists of sentences of ids)."""
    rng = random.Random(seed)
    seq, preds = config.sequence_length, config.mask_tokens
    max_tokens = seq - 3
    cls_id, sep_id, mask_id = special["[CLS]"], special["[SEP]"], special["[MASK]"]
    first_normal = max(special.values()) + 1
    documents = [d for d in documents if d]
    writer = _ExampleWriter(1024, seq, preds)

    def truncate(a, b):
        while len(a) + len(b) > max_tokens:
            longer = a if len(a) > len(b) else b
            if rng.random() < 0.5:
                del longer[0]
            else:
                longer.pop()

    def emit(a, b, random_next):
        tokens = [cls_id] + a + [sep_id] + b + [sep_id]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        candidates = [i for i, t in enumerate(tokens) if t not in (cls_id, sep_id)]
        rng.shuffle(candidates)
        count = min(preds, max(1, round(len(tokens) * 0.15)))
        chosen = sorted(candidates[:count])
        labels = [tokens[i] for i in chosen]
        for i in chosen:
            draw = rng.random()
            if draw < 0.8:
                tokens[i] = mask_id
            elif draw < 0.9:
                tokens[i] = rng.randrange(first_normal, vocab_size)
        writer.add(tokens, segments, chosen, labels, random_next)

    for _ in range(config.duplication_factor):
        for doc_index, document in enumerate(documents):
            target = max_tokens if rng.random() >= 0.1 else rng.randint(2, max_tokens)
            chunk, length, i = [], 0, 0
            while i < len(document):
                chunk.append(document[i])
                length += len(document[i])
                if i == len(document) - 1 or length >= target:
                    split = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
                    a = [t for sentence in chunk[:split] for t in sentence]
                    random_next = (len(chunk) == 1 or rng.random() < 0.5) and len(documents) > 1
                    if random_next:
                        other = rng.randrange(len(documents) - 1)
                        other = other + 1 if other >= doc_index else other
                        source = documents[other]
                        b = []
                        for sentence in source[rng.randrange(len(source)):]:
                            b.extend(sentence)
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - split  # the unused sentences start the next chunk
                    else:
                        b = [t for sentence in chunk[split:] for t in sentence]
                    truncate(a, b)
                    if a and b:
                        emit(a, b, random_next)
                    chunk, length = [], 0
                    target = max_tokens if rng.random() >= 0.1 else rng.randint(2, max_tokens)
                i += 1
    tensors = writer.tensors()
    order = torch.randperm(writer.count, generator=torch.Generator().manual_seed(seed))
    return {name: t[order] for name, t in tensors.items()}


def build_pretraining_dataset(config: BertRunConfig, log=None) -> PretrainingDataset:
    """Tokenize the input files and make examples, or load them from the cache."""
    log = log or (lambda text: None)
    cache_dir = cache_dir_for(config)
    remove_stale_temporaries(cache_dir, _CACHE_FILE)
    files = resolve_input_files(config.input_files, cache_dir)
    file_digests = [_text_file_digest(f) for f in files]
    tokenizer = get_tokenizer(config, files, cache_dir, file_digests)
    vocab_digest = _digest(json.dumps(tokenizer.get_vocab(), sort_keys=True))
    key = _digest("examples", EXAMPLES_FORMAT, vocab_digest, config.sequence_length, config.mask_tokens,
                  config.duplication_factor, config.random_seed, *file_digests)
    path = os.path.join(cache_dir, f"examples-{key}.pt")
    info = {"files": files, "tokenizer_vocab": tokenizer.get_vocab_size(), "cache": path}
    if os.path.exists(path):
        try:
            tensors = torch.load(path, weights_only=True)
            if set(tensors) == set(FIELDS):
                return PretrainingDataset(tensors, dict(info, cached=True))
        except Exception:  # a damaged cache entry is rebuilt
            pass
    started = time.perf_counter()
    documents = read_documents(files)
    flat = [s for d in documents for s in d]
    encoded = tokenizer.encode_batch(flat, add_special_tokens=False)
    ids, position = [], 0
    for document in documents:
        ids.append([encoded[position + j].ids for j in range(len(document))])
        position += len(document)
    ids = [[s for s in d if s] for d in ids]
    special = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    tensors = create_examples(ids, config, special, tokenizer.get_vocab_size(), config.random_seed)
    _atomic_write(path, lambda stream: torch.save(tensors, stream))
    log(f"Built {tensors['input_ids'].shape[0]} examples from {len(documents)} documents in "
        f"{time.perf_counter() - started:.1f} secs (cached in {path})")
    return PretrainingDataset(tensors, dict(info, cached=False))


# --------------------------------------------------------------------------- loading
class StepSampler(torch.utils.data.Sampler):
    """Dataset indices for steps ``[start_step, total_steps)``, ``samples_per_step`` per step.

    Each epoch uses the whole steps that fit in the dataset (the remainder is dropped, as
    ``drop_last``), in an order drawn from ``seed + epoch`` when shuffling. The indices of a
    step depend only on the step number, so a resumed run reads exactly what an uninterrupted
    run would have.
    """

    def __init__(self, dataset_length: int, samples_per_step: int, start_step: int, total_steps: int,
                 shuffle: bool, seed: int, instance: int = 0, instances: int = 1):
        self.length = dataset_length
        self.per_step = samples_per_step
        self.steps_per_epoch = dataset_length // samples_per_step
        self.start, self.total = start_step, total_steps
        self.shuffle, self.seed = shuffle, seed
        # Under poprun ``samples_per_step`` is the whole job's; this instance reads its contiguous part.
        self.part = samples_per_step // instances
        self.first = instance * self.part

    def __len__(self):
        return max(0, self.total - self.start) * self.part

    def _epoch_order(self, epoch):
        if not self.shuffle:
            return torch.arange(self.length)
        return torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + epoch))

    def __iter__(self) -> Iterator[int]:
        epoch, order = None, None
        for step in range(self.start, self.total):
            step_epoch, index = divmod(step, self.steps_per_epoch)
            if step_epoch != epoch:
                epoch, order = step_epoch, self._epoch_order(step_epoch)
            begin = index * self.per_step + self.first
            yield from order[begin:begin + self.part].tolist()


def check_dataset_size(dataset, config: BertRunConfig, instances: int = 1) -> None:
    if len(dataset) < config.samples_per_step * instances:
        per_instance = "" if instances == 1 else f" x {instances} poprun instances"
        raise DataError(
            messages.NOT_ENOUGH_DATA.format(
                dataset_count=len(dataset), micro_batch_size=config.micro_batch_size,
                device_iterations=config.device_iterations, gradient_accumulation=config.gradient_accumulation,
                replication_factor=config.replication_factor, per_instance=per_instance,
                value=config.samples_per_step * instances))


def get_dataset(config: BertRunConfig, log=None, instances: int = 1):
    """The dataset of the whole job (``instances`` poprun instances share it)."""
    if config.dataset == "generated":
        return GeneratedPretrainingDataset(config.vocab_size, config.sequence_length, config.mask_tokens,
                                           length=config.samples_per_step * instances, seed=config.random_seed)
    dataset = build_pretraining_dataset(config, log)
    check_dataset_size(dataset, config, instances)
    return dataset


def get_dataloader(config: BertRunConfig, opts: "poptorch.Options", dataset, start_step: int = 0,
                   instance: int = 0, instances: int = 1):
    """A ``poptorch.DataLoader`` yielding one combined batch per step from ``start_step`` on: under
    poprun, instance ``instance``'s part of each step of the whole job."""
    check_dataset_size(dataset, config, instances)
    sampler = StepSampler(len(dataset), config.samples_per_step * instances, start_step, config.training_steps,
                          shuffle=config.dataset != "generated", seed=config.random_seed,
                          instance=instance, instances=instances)
    workers = min(config.dataloader_workers, os.cpu_count() or 1)
    mode = poptorch.DataLoaderMode.AsyncRebatched if config.async_dataloader else poptorch.DataLoaderMode.Sync
    # The sampler already gives each instance its part.
    return poptorch.DataLoader(opts, dataset, batch_size=config.micro_batch_size, sampler=sampler,
                               num_workers=workers, drop_last=True, mode=mode, auto_distributed_partitioning=False)
